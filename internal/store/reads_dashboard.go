package store

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The dashboard's reads (package dashboard) and its audit list. Every read
// here is bounded by a cap or a limit that the caller passes: a count stops
// at its cap (the dashboard shows "≥ cap"), a page reads a window of at
// most its limit of index entries, so that no refresh grows with a queue's
// backlog, and none counts over the whole items table.
//
// Both engines: the LEFT JOIN of a one-row subquery as in
// inspectStatements.Queue, count(*) FILTER (WHERE …) as in
// inspectStatements, row-value comparisons for the pages as in
// adminStatements, and UNION ALL of uncorrelated branches as in
// fairStatements. PostgreSQL plans are checked in
// internal/store/reads_dashboard_test.go: each statement reads the index named there,
// and none scans a table sequentially.
//
// The per-part backlog and the tenants' heads read one limited index range
// per part or tenant. On PostgreSQL each is one statement, a LATERAL
// subquery with ORDER BY … LIMIT over generate_series of the parts or
// unnest of the tenants: a nested loop of index seeks, the fastest form
// there (measured with 100,000 items: 16 parts of 6,250 items, a cap of
// 10,000, read in 100–150 ms as one statement; the UNION ALL form below
// took 190–250 ms, its branches planned as bitmap scans and sorts, as the
// limit exceeds each part's rows). On CockroachDB that shape is a
// correlated limited subquery, which its optimizer decorrelates
// (cockroachdb/cockroach#68299: a limit above one becomes a row_number
// window partitioned by the outer row, over every matching row; a LIMIT 1
// becomes a DISTINCT ON; #165983 shows the rule applied to a LATERAL over
// unnest), so that a refresh would read the queue's whole backlog of the
// listed parts or tenants, or, where it is kept as an apply join, plan and
// run the subquery once per part (up to partition.MaxParts, 4,096). There
// each is a UNION ALL of one uncorrelated branch per part or tenant, each
// with its own parameter, as the per-part claims and the fair reads are
// (partClaimStatements, fairStatements): nothing is correlated, so no
// decorrelation rule applies, and each branch is a seek that stops at its
// limit. Rendered per number of branches (at most MaxBacklogParts and
// MaxHeadTenants) and cached; more parts or tenants take several
// statements, sent in one round trip (PartBacklog, TenantHeads).
type dashboardStatements struct {
	// partBacklog: $1 queue, $2 number of parts, $3 cap → part, unclaimed
	// (≤ cap): one limited read of crdbwork_items_part_turn per part, in a
	// LATERAL subquery over generate_series of the parts. PostgreSQL's twin
	// of partBacklogs.
	partBacklog string
	// partBacklogs[k] (rendered on first use, crdbPartBacklog): the
	// backlog of k parts, on CockroachDB. $1 queue, $2 cap, $3 to $(2+k)
	// the parts → n (the part's branch, 0 to k-1), unclaimed (≤ cap).
	partBacklogs [MaxBacklogParts + 1]atomic.Pointer[string]
	// unclaimedFirst/After: $1 queue, [$2 priority, $3 turn_at, $4 part,
	// $5 id,] $n limit → item columns, in claim order, through
	// crdbwork_items_turn_next.
	unclaimedFirst, unclaimedAfter string
	// tenantFirst/After: as unclaimed, for one tenant ($2), through
	// crdbwork_items_tenant_turn.
	tenantFirst, tenantAfter string
	// claimedFirst/After: $1 queue, [$2 lease_until, $3 id,] $n limit →
	// item columns, by lease end, through crdbwork_items_lease.
	claimedFirst, claimedAfter string
	// deadFirst/After: $1 queue, [$2 died_at, $3 id, $4 death,] $n limit →
	// dead item columns, newest first, through
	// crdbwork_dead_items_by_queue.
	deadFirst, deadAfter string
	// item: $1 id → the item's columns and payload (primary key).
	item string
	// deaths: $1 id, $2 limit → the deaths of id, newest first (primary
	// key prefix).
	deaths string
	// deleteDead: $1 id, $2 death, $3 queue → rows affected (primary key).
	deleteDead string
	// tenantHeads: $1 queue, $2 tenants (TEXT[]) → tenant, the vesting
	// time of its next unclaimed item in claim order (NULL: none), now():
	// one seek of crdbwork_items_tenant_turn per tenant, in a LATERAL
	// subquery over unnest of the tenants. PostgreSQL's twin of
	// tenantHeadsK.
	tenantHeads string
	// tenantHeadsK[k] (rendered on first use, crdbTenantHeads): the heads
	// of k tenants, on CockroachDB. $1 queue, $2 to $(1+k) the tenants → n
	// (the tenant's branch, 0 to k-1), the vesting time of its next
	// unclaimed item in claim order (NULL: none), now().
	tenantHeadsK [MaxHeadTenants + 1]atomic.Pointer[string]
	t            Tables
	// waitingQueue: $1 id → the queue of the waiting item id (primary key).
	waitingQueue string
	// auditInsert: $1 actor, $2 source, $3 action, $4 queue, $5 detail.
	auditInsert string
	// auditFirst/After: [$1 at, $2 id,] $n limit → audit rows, newest
	// first, through crdbwork_audit_by_time.
	auditFirst, auditAfter string
	// search: the item list across queues and its search
	// (reads_dashboard_search.go).
	search searchStatements
}

// dashItemColumns are the columns of an item in a page: no payload, the last
// error cut to 500 characters, the payload's length, the kind.
const dashItemColumns = `id, part, item_key, priority, turn_at, vesting_at, enqueued_at, attempts, max_attempts,
substr(last_error, 1, 500), tenant, claim, lease_until, octet_length(payload), kind`

// deadPageColumns are a dead item's columns in a page.
const deadPageColumns = `id, death, part, item_key, priority, attempts, max_attempts, substr(last_error, 1, 500),
enqueued_at, died_at, tenant, reason, octet_length(payload), kind`

func newDashboardStatements(t Tables) *dashboardStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &dashboardStatements{
		t:              t,
		partBacklog:    r(partBacklogSQL),
		unclaimedFirst: r(unclaimedFirstSQL),
		unclaimedAfter: r(unclaimedAfterSQL),
		tenantFirst:    r(tenantFirstSQL),
		tenantAfter:    r(tenantAfterSQL),
		claimedFirst:   r(claimedFirstSQL),
		claimedAfter:   r(claimedAfterSQL),
		deadFirst:      r(dashboarddeadFirstSQL),
		deadAfter:      r(dashboarddeadAfterSQL),
		item:           r(itemSQL),
		waitingQueue:   r(waitingQueueSQL),
		deaths:         r(deathsSQL),
		deleteDead:     r(deleteDeadSQL),
		tenantHeads:    r(tenantHeadsSQL),
		auditInsert:    r(auditInsertSQL),
		auditFirst:     r(auditFirstSQL),
		auditAfter:     r(auditAfterSQL),
		search:         newSearchStatements(t),
	}
}

// dash returns the Store's dashboardStatements, rendered on first use.
func (s *Store) dash() *dashboardStatements { return s.lazyDash() }

// MaxBacklogParts bounds the parts one statement of PartBacklog reads: a
// queue with more parts takes several statements, sent in one round trip
// when the connection can batch.
const MaxBacklogParts = 64

// MaxHeadTenants bounds the tenants one statement of TenantHeads reads.
const MaxHeadTenants = 32

// partBacklogBranch is one part's count: the branch's number, the part's
// parameter's number, and the alias's number.
const partBacklogBranch = `SELECT %d AS n, count(*) AS unclaimed
FROM (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND part = $%d AND claim IS NULL
      ORDER BY priority, turn_at LIMIT $2) AS b%d`

// crdbPartBacklog returns the CockroachDB statement of the backlog of k
// parts (1 to MaxBacklogParts; see dashboardStatements.partBacklogs).
func (d *dashboardStatements) crdbPartBacklog(k int) string {
	if k < 1 || k > MaxBacklogParts {
		panic(fmt.Sprintf("sql: a backlog read of %d parts (1 to %d)", k, MaxBacklogParts))
	}
	slot := &d.partBacklogs[k]
	if s := slot.Load(); s != nil {
		return *s
	}
	var b strings.Builder
	for j := range k {
		if j > 0 {
			b.WriteString("\nUNION ALL\n")
		}
		fmt.Fprintf(&b, partBacklogBranch, j, 3+j, j)
	}
	s := rewrite(d.t, b.String())
	slot.Store(&s)
	return s
}

// tenantHeadBranch is one tenant's head: the branch's number and the
// tenant's parameter's number.
const tenantHeadBranch = `    SELECT %d AS n, (SELECT i.vesting_at FROM crdbwork_items AS i
        WHERE i.queue = $1 AND i.tenant = $%d AND i.claim IS NULL
        ORDER BY i.priority, i.turn_at LIMIT 1) AS head`

// crdbTenantHeads returns the CockroachDB statement of the heads of k
// tenants (1 to MaxHeadTenants; see dashboardStatements.tenantHeadsK).
func (d *dashboardStatements) crdbTenantHeads(k int) string {
	if k < 1 || k > MaxHeadTenants {
		panic(fmt.Sprintf("sql: a head read of %d tenants (1 to %d)", k, MaxHeadTenants))
	}
	slot := &d.tenantHeadsK[k]
	if s := slot.Load(); s != nil {
		return *s
	}
	var b strings.Builder
	for j := range k {
		if j > 0 {
			b.WriteString("\n    UNION ALL\n")
		}
		fmt.Fprintf(&b, tenantHeadBranch, j, 2+j)
	}
	s := rewrite(d.t, "SELECT v.n, v.head, now() FROM (\n"+b.String()+") AS v")
	slot.Store(&s)
	return s
}

// chunk is one statement of a read split by a maximum of branches: the
// index of its first element and how many it reads.
type chunk struct{ first, n int }

// chunks splits n elements into statements of at most max branches.
func chunks(n, max int) []chunk {
	var out []chunk
	for first := 0; first < n; first += max {
		out = append(out, chunk{first, min(max, n-first)})
	}
	return out
}

// readChunks runs one statement per chunk (stmt and args give its text and
// arguments) and hands each row to scan with the chunk: in one round trip
// when db can batch (Batcher), otherwise one statement after the other.
func readChunks(ctx context.Context, db DB, cs []chunk, stmt func(chunk) (string, []any), scan []any, row func(chunk) error) error {
	each := func(c chunk, rows pgx.Rows) error {
		_, err := pgx.ForEachRow(rows, scan, func() error { return row(c) })
		return err
	}
	if b, ok := db.(Batcher); ok && len(cs) > 1 {
		batch := &pgx.Batch{}
		for _, c := range cs {
			text, args := stmt(c)
			batch.Queue(text, args...)
		}
		br := b.SendBatch(ctx, batch)
		for _, c := range cs {
			rows, err := br.Query()
			if err == nil {
				err = each(c, rows)
			}
			if err != nil {
				_ = br.Close()
				return err
			}
		}
		return br.Close()
	}
	for _, c := range cs {
		text, args := stmt(c)
		rows, err := db.Query(ctx, text, args...)
		if err == nil {
			err = each(c, rows)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// partBacklogSQL is the text of dashboardStatements.partBacklog
// (rendered by newDashboardStatements).
const partBacklogSQL = `SELECT p.part, b.unclaimed
FROM generate_series(0, $2::BIGINT - 1) AS p(part)
CROSS JOIN LATERAL (
    SELECT count(*) AS unclaimed
    FROM (SELECT 1 FROM crdbwork_items AS i WHERE i.queue = $1 AND i.part = p.part AND i.claim IS NULL
          ORDER BY i.priority, i.turn_at LIMIT $3) AS w) AS b
ORDER BY p.part`

// PartsBacklog returns the unclaimed items of each part of queue below
// numParts, each count stopping at cap: one limited read of
// crdbwork_items_part_turn per part. On PostgreSQL one statement
// (dashboardStatements.partBacklog); on CockroachDB MaxBacklogParts parts
// to a statement (dashboardStatements.partBacklogs).
func (s *Store) PartsBacklog(ctx context.Context, db DB, d Dialect, queue string, numParts, capAt int) ([]int64, error) {
	if numParts < 0 {
		return nil, fmt.Errorf("crdbwork: the backlog of %d parts", numParts)
	}
	st := s.dash()
	out := make([]int64, numParts)
	var n, count int64
	if d == Postgres {
		rows, err := db.Query(ctx, st.partBacklog, queue, numParts, capAt)
		if err != nil {
			return nil, err
		}
		if _, err := pgx.ForEachRow(rows, []any{&n, &count}, func() error {
			if n >= 0 && int(n) < numParts {
				out[n] = count
			}
			return nil
		}); err != nil {
			return nil, err
		}
		return out, nil
	}
	err := readChunks(ctx, db, chunks(numParts, MaxBacklogParts), func(c chunk) (string, []any) {
		args := []any{queue, capAt}
		for p := c.first; p < c.first+c.n; p++ {
			args = append(args, p)
		}
		return st.crdbPartBacklog(c.n), args
	}, []any{&n, &count}, func(c chunk) error {
		if n < 0 || int(n) >= c.n {
			return fmt.Errorf("crdbwork: the backlog read answered for branch %d of %d", n, c.n)
		}
		out[c.first+int(n)] = count
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ItemRow is an item in a page of ItemsPage.
type ItemRow struct {
	ID                          uuid.UUID
	Part                        int
	Key                         string
	Priority                    int64
	TurnAt, VestingAt, Enqueued time.Time
	Attempts, MaxAttempts       int64
	LastError                   string // its first 500 characters
	Tenant                      string
	Claim                       *uuid.UUID
	LeaseUntil                  *time.Time
	PayloadSize                 int64
	Kind                        string // "" if none
	// Queue and Match are set by ItemsSearchWindow only: the item's queue,
	// and whether it matches the search text.
	Queue string
	Match bool
}

// ItemPosition is the place of an item in a page's order: claim order
// (Priority, TurnAt, Part, ID) for unclaimed items, lease order
// (LeaseUntil, ID) for claimed ones; across queues (ItemsSearchWindow)
// behind the Queue.
type ItemPosition struct {
	Queue      string
	Priority   int64
	TurnAt     time.Time
	Part       int
	LeaseUntil time.Time
	ID         uuid.UUID
}

// unclaimedFirstSQL is the text of dashboardStatements.unclaimedFirst
// (rendered by newDashboardStatements).
const unclaimedFirstSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL
ORDER BY priority, turn_at, part, id LIMIT $2`

// unclaimedAfterSQL is the text of dashboardStatements.unclaimedAfter
// (rendered by newDashboardStatements).
const unclaimedAfterSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL AND (priority, turn_at, part) >= ($2, $3, $4)
  AND NOT (priority = $2 AND turn_at = $3 AND part = $4 AND id <= $5)
ORDER BY priority, turn_at, part, id LIMIT $6`

// tenantFirstSQL is the text of dashboardStatements.tenantFirst
// (rendered by newDashboardStatements).
const tenantFirstSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND tenant = $2 AND claim IS NULL
ORDER BY priority, turn_at, part, id LIMIT $3`

// tenantAfterSQL is the text of dashboardStatements.tenantAfter
// (rendered by newDashboardStatements).
const tenantAfterSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND tenant = $2 AND claim IS NULL AND (priority, turn_at) >= ($3, $4)
  AND NOT (priority = $3 AND turn_at = $4 AND (part < $5 OR part = $5 AND id <= $6))
ORDER BY priority, turn_at, part, id LIMIT $7`

// claimedFirstSQL is the text of dashboardStatements.claimedFirst
// (rendered by newDashboardStatements).
const claimedFirstSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NOT NULL
ORDER BY lease_until, id LIMIT $2`

// claimedAfterSQL is the text of dashboardStatements.claimedAfter
// (rendered by newDashboardStatements).
const claimedAfterSQL = `SELECT ` + dashItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NOT NULL AND lease_until >= $2 AND (lease_until, id) > ($2, $3)
ORDER BY lease_until, id LIMIT $4`

// ItemsPage reads up to limit items of queue after the position after
// (nil: from the first): unclaimed items in claim order, or those of one
// tenant when tenant is not "", or claimed items in lease order when
// claimed is set. Each reads at most limit entries of the index that
// serves its order.
func (s *Store) ItemsPage(ctx context.Context, db DB, queue, tenant string, claimed bool, after *ItemPosition, limit int) ([]ItemRow, error) {
	d := s.dash()
	var stmt string
	var args []any
	switch {
	case claimed && after == nil:
		stmt, args = d.claimedFirst, []any{queue, limit}
	case claimed:
		stmt, args = d.claimedAfter, []any{queue, after.LeaseUntil, after.ID, limit}
	case tenant != "" && after == nil:
		stmt, args = d.tenantFirst, []any{queue, tenant, limit}
	case tenant != "":
		stmt, args = d.tenantAfter, []any{queue, tenant, after.Priority, after.TurnAt, after.Part, after.ID, limit}
	case after == nil:
		stmt, args = d.unclaimedFirst, []any{queue, limit}
	default:
		stmt, args = d.unclaimedAfter, []any{queue, after.Priority, after.TurnAt, after.Part, after.ID, limit}
	}
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	return scanItemRows(rows, nil)
}

// scanItemRows reads the rows of a page of items: the columns every item
// list selects, then those extra names in r (nil: none).
func scanItemRows(rows pgx.Rows, extra func(r *ItemRow) []any) ([]ItemRow, error) {
	var out []ItemRow
	var r ItemRow
	var part int64
	var key, lastErr, ten, kind *string
	var claim *uuid.UUID
	var lease *time.Time
	dest := []any{&r.ID, &part, &key, &r.Priority, &r.TurnAt, &r.VestingAt, &r.Enqueued,
		&r.Attempts, &r.MaxAttempts, &lastErr, &ten, &claim, &lease, &r.PayloadSize, &kind}
	if extra != nil {
		dest = append(dest, extra(&r)...)
	}
	if _, err := pgx.ForEachRow(rows, dest, func() error {
		r.Part, r.Key, r.LastError, r.Tenant, r.Kind = int(part), deref(key), deref(lastErr), deref(ten), deref(kind)
		r.Claim, r.LeaseUntil = nil, nil
		if claim != nil {
			c := *claim
			r.Claim = &c
		}
		if lease != nil {
			l := *lease
			r.LeaseUntil = &l
		}
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DeadPageRow is a death in a page of DeadWindow.
type DeadPageRow struct {
	ID, Death             uuid.UUID
	Part                  int
	Key                   string
	Priority              int64
	Attempts, MaxAttempts int64
	LastError             string // its first 500 characters
	EnqueuedAt, DiedAt    time.Time
	Tenant, Reason        string
	PayloadSize           int64
	Kind                  string // "" if none
	// Queue and Match are set by DeadSearchWindow only: the death's queue,
	// and whether it matches the search text.
	Queue string
	Match bool
}

// dashboarddeadFirstSQL is the text of dashboardStatements.deadFirst
// (rendered by newDashboardStatements).
const dashboarddeadFirstSQL = `SELECT ` + deadPageColumns + ` FROM crdbwork_dead_items
WHERE queue = $1
ORDER BY died_at DESC, id DESC, death DESC LIMIT $2`

// dashboarddeadAfterSQL is the text of dashboardStatements.deadAfter
// (rendered by newDashboardStatements).
const dashboarddeadAfterSQL = `SELECT ` + deadPageColumns + ` FROM crdbwork_dead_items
WHERE queue = $1 AND died_at <= $2 AND (died_at, id, death) < ($2, $3, $4)
ORDER BY died_at DESC, id DESC, death DESC LIMIT $5`

// DeadWindow reads up to limit deaths of queue, newest first, after the
// position after (nil: from the newest), unfiltered: the caller filters the
// window, so that a page never reads more than limit index entries.
func (s *Store) DeadWindow(ctx context.Context, db DB, queue string, after *DeadPosition, limit int) ([]DeadPageRow, error) {
	d := s.dash()
	var rows pgx.Rows
	var err error
	if after == nil {
		rows, err = db.Query(ctx, d.deadFirst, queue, limit)
	} else {
		rows, err = db.Query(ctx, d.deadAfter, queue, after.DiedAt, after.ID, after.Death, limit)
	}
	if err != nil {
		return nil, err
	}
	var out []DeadPageRow
	var r DeadPageRow
	var part int64
	var key, lastErr, ten, kind *string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Death, &part, &key, &r.Priority, &r.Attempts, &r.MaxAttempts,
		&lastErr, &r.EnqueuedAt, &r.DiedAt, &ten, &r.Reason, &r.PayloadSize, &kind}, func() error {
		r.Part, r.Key, r.LastError, r.Tenant, r.Kind = int(part), deref(key), deref(lastErr), deref(ten), deref(kind)
		out = append(out, r)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// ItemDetail is one item, whole, as Item reads it.
type ItemDetail struct {
	ID                    uuid.UUID
	Queue                 string
	Part                  int
	Key                   string
	Priority              int64
	TurnAt, VestingAt     time.Time
	EnqueuedAt            time.Time
	Attempts, MaxAttempts int64
	LastError             string
	Tenant                string
	Claim                 *uuid.UUID
	ClaimedAt             *time.Time
	ClaimToken            int64
	LeaseUntil, ExpiresAt *time.Time
	AtMostOnce            bool
	Payload, Metadata     []byte
	Now                   time.Time
	// CancelRequestedAt is when a cancel was asked of the item while it
	// ran (nil: none), CancelBy and CancelReason by whom and why.
	CancelRequestedAt      *time.Time
	CancelBy, CancelReason string
	// Snoozes counts the snoozes of its handlers.
	Snoozes int64
	// CheckpointSize is the size of its saved checkpoint (nil: none),
	// CheckpointAt when it was saved.
	CheckpointSize *int64
	CheckpointAt   *time.Time
	// ProgressDone and ProgressTotal are its last reported progress (nil:
	// none; total 0: unknown), ProgressAt when it was reported.
	ProgressDone, ProgressTotal *int64
	ProgressAt                  *time.Time
	// SeqOrder is its order among its key's items of a sequenced queue
	// (nil: not sequenced).
	SeqOrder *int64
	// Headers are its headers (nil: none).
	Headers map[string]string
	// Kind is its kind ("" if none).
	Kind string
	// History is its errors array of crdbwork_attempt_errors (schema
	// version 6; nil: none): read it with ParseHistory.
	History []byte
}

// itemSQL is the text of dashboardStatements.item
// (rendered by newDashboardStatements); the history is its row of
// crdbwork_attempt_errors, a primary-key lookup.
var itemSQL = `SELECT id, queue, part, item_key, priority, turn_at, vesting_at, enqueued_at, attempts, max_attempts,
       last_error, tenant, claim, claimed_at, claim_token, lease_until, expires_at, at_most_once, payload, metadata, now(),
       cancel_requested_at, cancel_by, cancel_reason, snoozes, octet_length(checkpoint), checkpoint_at,
       progress_done, progress_total, progress_at, seq_order, headers, kind, ` + attemptErrorsOf("t") + `
FROM crdbwork_items AS t WHERE id = $1`

// ItemsGet reads the item id, and false if it is not in the items table
// (dashboardStatements.item).
func (s *Store) ItemsGet(ctx context.Context, db DB, id uuid.UUID) (ItemDetail, bool, error) {
	var d ItemDetail
	var part int64
	var key, lastErr, ten, by, reason, kind *string
	err := db.QueryRow(ctx, s.dash().item, id).Scan(&d.ID, &d.Queue, &part, &key, &d.Priority, &d.TurnAt, &d.VestingAt,
		&d.EnqueuedAt, &d.Attempts, &d.MaxAttempts, &lastErr, &ten, &d.Claim, &d.ClaimedAt, &d.ClaimToken, &d.LeaseUntil,
		&d.ExpiresAt, &d.AtMostOnce, &d.Payload, &d.Metadata, &d.Now,
		&d.CancelRequestedAt, &by, &reason, &d.Snoozes, &d.CheckpointSize, &d.CheckpointAt,
		&d.ProgressDone, &d.ProgressTotal, &d.ProgressAt, &d.SeqOrder, &d.Headers, &kind, &d.History)
	if err == pgx.ErrNoRows {
		return ItemDetail{}, false, nil
	}
	if err != nil {
		return ItemDetail{}, false, err
	}
	d.Part, d.Key, d.LastError, d.Tenant = int(part), deref(key), deref(lastErr), deref(ten)
	d.CancelBy, d.CancelReason, d.Kind = deref(by), deref(reason), deref(kind)
	return d, true, nil
}

// waitingQueueSQL is the text of dashboardStatements.waitingQueue
// (rendered by newDashboardStatements).
const waitingQueueSQL = `SELECT queue FROM crdbwork_waiting WHERE id = $1`

// ItemsDepsWaitingQueue returns the queue of the waiting item id (an item enqueued
// with prerequisites not yet all acked), and false if id is not waiting
// (dashboardStatements.waitingQueue).
func (s *Store) ItemsDepsWaitingQueue(ctx context.Context, db DB, id uuid.UUID) (string, bool, error) {
	var queue string
	err := db.QueryRow(ctx, s.dash().waitingQueue, id).Scan(&queue)
	if err == pgx.ErrNoRows {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return queue, true, nil
}

// deathsSQL is the text of dashboardStatements.deaths
// (rendered by newDashboardStatements); the history is the item's row of
// crdbwork_attempt_errors (every death of an id reads the same one: it
// holds all its lives, requeue markers between them).
var deathsSQL = `SELECT id, death, queue, part, item_key, priority, attempts, max_attempts, last_error,
       enqueued_at, died_at, tenant, reason, payload, metadata, kind, ` + attemptErrorsOf("t") + `
FROM crdbwork_dead_items AS t WHERE id = $1 ORDER BY died_at DESC, death DESC LIMIT $2`

// DeadOfID reads up to limit deaths of the id, newest first
// (dashboardStatements.deaths).
func (s *Store) DeadOfID(ctx context.Context, db DB, id uuid.UUID, limit int) ([]DeadItemRow, []string, error) {
	rows, err := db.Query(ctx, s.dash().deaths, id, limit)
	if err != nil {
		return nil, nil, err
	}
	var out []DeadItemRow
	var queues []string
	var r DeadItemRow
	var q string
	var part, prio, att, maxAtt int64
	var key, lastErr, ten, kind *string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Death, &q, &part, &key, &prio, &att, &maxAtt, &lastErr,
		&r.EnqueuedAt, &r.DiedAt, &ten, &r.Reason, &r.Payload, &r.Metadata, &kind, &r.History}, func() error {
		r.Part, r.Priority, r.Attempts, r.MaxAttempts = int(part), int(prio), int(att), int(maxAtt)
		r.Key, r.LastError, r.Tenant, r.Kind = deref(key), deref(lastErr), deref(ten), deref(kind)
		r.Payload, r.Metadata = append([]byte(nil), r.Payload...), append([]byte(nil), r.Metadata...)
		r.History = append([]byte(nil), r.History...)
		out = append(out, r)
		queues = append(queues, q)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return out, queues, nil
}

// deleteDeadSQL is the text of dashboardStatements.deleteDead
// (rendered by newDashboardStatements).
const deleteDeadSQL = `DELETE FROM crdbwork_dead_items WHERE id = $1 AND death = $2 AND queue = $3`

// DeadDelete deletes one death of a dead item of queue and reports whether
// it was there (dashboardStatements.deleteDead).
func (s *Store) DeadDelete(ctx context.Context, db DB, queue string, id, death uuid.UUID) (bool, error) {
	tag, err := db.Exec(ctx, s.dash().deleteDead, id, death, queue)
	return tag.RowsAffected() > 0, err
}

// TenantHead is the vesting time of a tenant's next unclaimed item.
type TenantHead struct {
	Tenant string
	// Head is nil when the tenant has no unclaimed item.
	Head *time.Time
	Now  time.Time
}

// tenantHeadsSQL is the text of dashboardStatements.tenantHeads
// (rendered by newDashboardStatements).
const tenantHeadsSQL = `SELECT t.tenant, h.vesting_at, now()
FROM unnest($2::TEXT[]) AS t(tenant)
LEFT JOIN LATERAL (
    SELECT i.vesting_at FROM crdbwork_items AS i
    WHERE i.queue = $1 AND i.tenant = t.tenant AND i.claim IS NULL
    ORDER BY i.priority, i.turn_at LIMIT 1) AS h ON true
ORDER BY t.tenant`

// ItemsTenantHeads reads the next unclaimed item of each tenant of queue named,
// one row per tenant in the order given: one seek of
// crdbwork_items_tenant_turn per tenant. On PostgreSQL one statement
// (dashboardStatements.tenantHeads); on CockroachDB MaxHeadTenants tenants
// to a statement (dashboardStatements.tenantHeadsK).
func (s *Store) ItemsTenantHeads(ctx context.Context, db DB, d Dialect, queue string, tenants []string) ([]TenantHead, error) {
	st := s.dash()
	out := make([]TenantHead, len(tenants))
	var head *time.Time
	var now time.Time
	set := func(i int) {
		out[i] = TenantHead{Tenant: tenants[i], Now: now}
		if head != nil {
			t := *head
			out[i].Head = &t
		}
	}
	if d == Postgres {
		if len(tenants) == 0 {
			return out, nil
		}
		at := map[string][]int{}
		for i, t := range tenants {
			at[t] = append(at[t], i)
		}
		rows, err := db.Query(ctx, st.tenantHeads, queue, tenants)
		if err != nil {
			return nil, err
		}
		var tenant string
		if _, err := pgx.ForEachRow(rows, []any{&tenant, &head, &now}, func() error {
			for _, i := range at[tenant] {
				set(i)
			}
			return nil
		}); err != nil {
			return nil, err
		}
		return out, nil
	}
	var n int64
	err := readChunks(ctx, db, chunks(len(tenants), MaxHeadTenants), func(c chunk) (string, []any) {
		args := []any{queue}
		for _, t := range tenants[c.first : c.first+c.n] {
			args = append(args, t)
		}
		return st.crdbTenantHeads(c.n), args
	}, []any{&n, &head, &now}, func(c chunk) error {
		if n < 0 || int(n) >= c.n {
			return fmt.Errorf("crdbwork: the tenants' head read answered for branch %d of %d", n, c.n)
		}
		set(c.first + int(n))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AuditRow is one entry of the audit list.
type AuditRow struct {
	ID     uuid.UUID
	At     time.Time
	Actor  string // who: the dashboard's user, or the operating system's user of a command
	Source string // "dashboard" or "cli"
	Action string // what, in a word: "requeue", "pause", …
	Queue  string
	Detail string // what exactly, for people
}

// auditInsertSQL is the text of dashboardStatements.auditInsert
// (rendered by newDashboardStatements).
const auditInsertSQL = `INSERT INTO crdbwork_audit (actor, source, action, queue, detail) VALUES ($1, $2, $3, $4, $5)`

// AuditRecord adds an entry to the audit list (dashboardStatements.auditInsert).
func (s *Store) AuditRecord(ctx context.Context, db DB, a AuditRow) error {
	_, err := db.Exec(ctx, s.dash().auditInsert, a.Actor, a.Source, a.Action, a.Queue, a.Detail)
	return err
}

// auditFirstSQL is the text of dashboardStatements.auditFirst
// (rendered by newDashboardStatements).
const auditFirstSQL = `SELECT id, at, actor, source, action, queue, detail FROM crdbwork_audit
ORDER BY at DESC, id DESC LIMIT $1`

// auditAfterSQL is the text of dashboardStatements.auditAfter
// (rendered by newDashboardStatements).
const auditAfterSQL = `SELECT id, at, actor, source, action, queue, detail FROM crdbwork_audit
WHERE at <= $1 AND (at, id) < ($1, $2)
ORDER BY at DESC, id DESC LIMIT $3`

// AuditPage reads up to limit audit entries, newest first, older than the
// entry after (nil: from the newest).
func (s *Store) AuditPage(ctx context.Context, db DB, after *AuditRow, limit int) ([]AuditRow, error) {
	var rows pgx.Rows
	var err error
	if after == nil {
		rows, err = db.Query(ctx, s.dash().auditFirst, limit)
	} else {
		rows, err = db.Query(ctx, s.dash().auditAfter, after.At, after.ID, limit)
	}
	if err != nil {
		return nil, err
	}
	var out []AuditRow
	var a AuditRow
	if _, err := pgx.ForEachRow(rows, []any{&a.ID, &a.At, &a.Actor, &a.Source, &a.Action, &a.Queue, &a.Detail}, func() error {
		out = append(out, a)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}
