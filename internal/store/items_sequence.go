package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The statements of sequenced queues (sequenceStatements; docs/sequences.md):
// the sequenced claims, and the queue's switch. Errors are the driver's, as
// in items_claim.go.

// ItemsClaimAnySequenced is ClaimAny for a sequenced queue: an item with a
// sequence order is claimed only if it is its key's first and no item of its
// key is claimed (sequenceStatements.ClaimAny). Run it as ClaimAny; a unique
// violation on the sequence index (IsSequenceConflict) means another claim
// took an item of the same key at the same time: nothing was claimed, run it
// again.
func (s *Store) ItemsClaimAnySequenced(ctx context.Context, db DB, d Dialect, a ClaimArgs) ([]ClaimedRow, error) {
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimAnyFor(d), a.params()...)
}

// ItemsClaimPartsSequenced is ClaimParts for a sequenced queue
// (sequenceStatements.ClaimParts): 1 to MaxPartBranches distinct owned
// parts (it panics otherwise). Run it as ClaimAnySequenced.
func (s *Store) ItemsClaimPartsSequenced(ctx context.Context, db DB, d Dialect, a ClaimArgs, parts []int64) ([]ClaimedRow, error) {
	args := a.params()
	for _, p := range parts {
		args = append(args, p)
	}
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimParts(d, len(parts)), args...)
}

// ItemsClaimUrgentSequenced is ClaimUrgent for a sequenced queue
// (sequenceStatements.ClaimUrgent). Run it as ClaimAnySequenced.
func (s *Store) ItemsClaimUrgentSequenced(ctx context.Context, db DB, d Dialect, a UrgentArgs) ([]ClaimedRow, error) {
	owned := make([]int64, len(a.OwnedParts))
	for i, p := range a.OwnedParts {
		owned[i] = int64(p)
	}
	args := append(a.params(), int64(a.MaxPriority), a.AllTenantsLimited, orEmpty(a.LimitedTenants), owned)
	return queryClaimed(ctx, db, a.Limit, s.seq.ClaimUrgentFor(d), args...)
}

// setSequencedSQL is the text of sequenceStatements.SetSequenced
// (rendered by newSequenceStatements).
const setSequencedSQL = `INSERT INTO crdbwork_queues AS q (name, sequenced) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET sequenced = excluded.sequenced`

// QueueSequencedSet turns sequencing of queue on or off
// (sequenceStatements.SetSequenced).
func (s *Store) QueueSequencedSet(ctx context.Context, db DB, queue string, on bool) error {
	_, err := db.Exec(ctx, s.seq.SetSequenced, queue, on)
	return err
}

// sequencedSQL is the text of sequenceStatements.Sequenced
// (rendered by newSequenceStatements).
const sequencedSQL = `SELECT COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false),
       EXISTS (SELECT 1 FROM (SELECT item_key FROM crdbwork_items WHERE queue = $1 AND seq_order IS NOT NULL
                              ORDER BY item_key LIMIT 1) AS first),
       COALESCE((SELECT sequence_hold FROM crdbwork_queues WHERE name = $1), false)`

// QueueSequenced reports whether queue is sequenced and whether it holds
// sequenced items (sequenceStatements.Sequenced).
func (s *Store) QueueSequenced(ctx context.Context, db DB, queue string) (on, items bool, err error) {
	var hold bool
	err = db.QueryRow(ctx, s.seq.Sequenced, queue).Scan(&on, &items, &hold)
	return on, items, err
}

// SequenceSettings is what QueueSequencing reads of a queue's sequencing.
type SequenceSettings struct {
	On    bool // the queue is sequenced
	Items bool // it holds sequenced items
	Hold  bool // a death of a sequenced item holds its key
}

// QueueSequencing reads the sequencing of queue
// (sequenceStatements.Sequenced).
func (s *Store) QueueSequencing(ctx context.Context, db DB, queue string) (SequenceSettings, error) {
	var st SequenceSettings
	err := db.QueryRow(ctx, s.seq.Sequenced, queue).Scan(&st.On, &st.Items, &st.Hold)
	return st, err
}

// setHoldSQL is the text of sequenceStatements.SetHold
// (rendered by newSequenceStatements).
const setHoldSQL = `INSERT INTO crdbwork_queues AS q (name, sequence_hold) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET sequence_hold = excluded.sequence_hold`

// releaseAllSQL is the text of sequenceStatements.ReleaseAll
// (rendered by newSequenceStatements).
const releaseAllSQL = `UPDATE crdbwork_dead_items SET seq_hold = false WHERE queue = $1 AND seq_hold RETURNING id`

// QueueSequenceHoldSet sets what a death of one of queue's sequenced items does
// to its key (sequenceStatements.SetHold); with hold false it also releases
// the keys the queue's dead items hold (ReleaseAll) and returns how many
// dead items it released. Run it in a transaction, so that both change
// together.
func (s *Store) QueueSequenceHoldSet(ctx context.Context, db DB, queue string, hold bool) (released int, err error) {
	if _, err := db.Exec(ctx, s.seq.SetHold, queue, hold); err != nil {
		return 0, err
	}
	if hold {
		return 0, nil
	}
	tag, err := db.Exec(ctx, s.seq.ReleaseAll, queue)
	return int(tag.RowsAffected()), err
}

// sequenceReleaseSQL is the text of sequenceStatements.Release
// (rendered by newSequenceStatements).
const sequenceReleaseSQL = `UPDATE crdbwork_dead_items SET seq_hold = false WHERE queue = $1 AND item_key = $2 AND seq_hold RETURNING id`

// ItemsSequenceRelease releases key of queue from the dead items that hold
// it (sequenceStatements.Release) and returns their ids (none: the key was
// not held).
func (s *Store) ItemsSequenceRelease(ctx context.Context, db DB, queue, key string) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.seq.Release, queue, key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// BlockedKeyRow is one row of BlockedKeys.
type BlockedKeyRow struct {
	Key       string
	ID        uuid.UUID
	Kind      string // "dead", "retry" or "delayed"
	Reason    string // the death's reason (kind "dead")
	LastError string
	At        time.Time // when it died (dead), or when it vests (retry, delayed)
	Attempts  int
}

// blockedSQL is the text of sequenceStatements.Blocked
// (rendered by newSequenceStatements).
const blockedSQL = `SELECT key, id, kind, reason, last_error, at, attempts FROM (
    (SELECT d.item_key AS key, d.id, 'dead' AS kind, d.reason, COALESCE(d.last_error, '') AS last_error, d.died_at AS at, d.attempts
     FROM crdbwork_dead_items AS d
     WHERE d.queue = $1 AND d.seq_hold
     ORDER BY d.item_key, d.enqueued_at, d.seq_order, d.id
     LIMIT $2)
    UNION ALL
    (SELECT h.item_key, h.id, CASE WHEN h.attempts > 0 THEN 'retry' ELSE 'delayed' END, '', COALESCE(h.last_error, ''), h.vesting_at, h.attempts
     FROM crdbwork_items AS h
     WHERE h.queue = $1 AND h.seq_order IS NOT NULL AND h.claim IS NULL AND h.vesting_at > now()
       AND h.id = (SELECT sb.id FROM crdbwork_items AS sb
                   WHERE sb.queue = h.queue AND sb.item_key = h.item_key AND sb.seq_order IS NOT NULL
                   ORDER BY sb.enqueued_at, sb.seq_order, sb.id
                   LIMIT 1)
     ORDER BY h.item_key, h.enqueued_at, h.seq_order, h.id
     LIMIT $2)) AS b
ORDER BY key, kind, id
LIMIT $2`

// ItemsSequenceBlockedKeys lists up to limit blocked keys of queue
// (sequenceStatements.Blocked).
func (s *Store) ItemsSequenceBlockedKeys(ctx context.Context, db DB, queue string, limit int) ([]BlockedKeyRow, error) {
	rows, err := db.Query(ctx, s.seq.Blocked, queue, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (BlockedKeyRow, error) {
		var b BlockedKeyRow
		var attempts int64
		err := r.Scan(&b.Key, &b.ID, &b.Kind, &b.Reason, &b.LastError, &b.At, &attempts)
		b.Attempts = int(attempts)
		return b, err
	})
}

// ItemsIsSequenceConflict reports whether err is a unique violation on the index
// that holds at most one claimed item per key of sequenced items
// (SequenceClaimedIndex, under this Store's prefix): a claim that would have
// put a second item of a key in flight, and changed nothing.
func (s *Store) ItemsIsSequenceConflict(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return false
	}
	name := prefix(s.t) + SequenceClaimedIndex
	return pgErr.ConstraintName == name || strings.Contains(pgErr.Message, name)
}

// SequenceClaimedIndex is the unique index that holds at most one claimed
// item per key of a queue's sequenced items (seq_order not NULL), without
// its prefix: a claim that would take a second one fails on it with SQLSTATE
// 23505 (see IsSequenceConflict).
const SequenceClaimedIndex = "items_sequence_claimed"

// sequenceStatements are the statements of sequenced queues (docs/sequences.md),
// rendered for one set of table names.
//
// An item is sequenced when its seq_order is set: enqueue stamps it on the
// items with a key of a queue whose crdbwork_queues.sequenced is on. A
// sequenced item is claimable only if, besides everything a plain claim
// requires, it is its key's head, the first of the key's sequenced items in
// (enqueued_at, seq_order, id) order, whether claimed, waiting for a retry
// or vested, and no sequenced item of its key is claimed. So a key runs one
// item at a time, in enqueue order, and a head waiting for a retry after a
// nack holds its key until it is acked or dead. Items without seq_order in
// the same queue are claimed as in any queue.
//
// The sequenced claims are the plain claims (claimTemplate, partBranch, the
// urgent lane's) with seqCondition added to the scan's WHERE clause, so
// they follow every change made to those: sequenceTemplate panics if the
// anchor it is added after is gone (TestSequencedStatements fails first).
// seqCondition tests each candidate with a probe of the queue's claimed
// keys (read once per statement) and two index seeks that stop at their
// first entry: crdbwork_items_sequence_order (queue, item_key, enqueued_at,
// seq_order, id) gives the key's head, crdbwork_dead_items_sequence_held a
// dead item that holds the key. The scan of the claim order stops at its
// limit as the plain claim's does, but it steps over the items of keys
// that are claimed, held or whose head waits (those are not claimable): a
// claim reads at most the unclaimable items ahead of the heads it hands out
// (docs/sequences.md, "Cost").
//
// The unique index crdbwork_items_sequence_claimed (queue, item_key) is
// the guarantee, the tests only keep claims from running into it: if two
// claims of one key's items ever run at once (an item enqueued late with an
// earlier enqueued_at than an item already claimed, or concurrent claims
// that both saw no claimed item under READ COMMITTED), the second claim's
// UPDATE fails with a unique violation (PostgreSQL waits for the first's
// transaction to end, then fails) and changes nothing; package claim
// retries it, and the retry's test skips the key. This holds at every
// isolation level, for old workers' plain claims too (docs/sequences.md,
// "Rolling upgrades").
//
// CockroachDB docs checked: "Partial Indexes" (CREATE UNIQUE INDEX ...
// WHERE: uniqueness among the rows that satisfy the predicate, since
// v20.2); "SELECT FOR UPDATE": the locking clause locks the rows of the
// tables in its SELECT's FROM, so the subqueries' reads lock nothing (and
// under SERIALIZABLE they are ordinary reads, checked at commit).
// CockroachDB decorrelates the subqueries (see seqCondition); not run here
// (no CockroachDB server).
type sequenceStatements struct {
	t Tables
	// ClaimAny is coreStatements.ClaimAny for a sequenced queue (same
	// parameters and results); PostgresClaimAny its PostgreSQL twin.
	ClaimAny, PostgresClaimAny string
	// ClaimUrgent is urgentStatements.ClaimUrgent for a sequenced queue;
	// PostgresClaimUrgent its twin.
	ClaimUrgent, PostgresClaimUrgent string
	// claims[d][k] is the per-part claim of k parts (partClaimStatements.Claim
	// for a sequenced queue) in dialect d.
	claims [2][MaxPartBranches + 1]atomic.Pointer[string]
	// SetSequenced turns sequencing on or off: $1 queue, $2 on. A queue
	// without a row gets one, with one part.
	SetSequenced string
	// Sequenced reads $1 queue → whether it is sequenced (no row: false),
	// whether it holds sequenced items (an item with seq_order, read
	// through crdbwork_items_sequence_order: one entry; the ORDER BY, which
	// the index gives, keeps PostgreSQL from a scan of the table that it
	// expects to find such an item early in, when most items are
	// sequenced: in a queue with none, that scan would read every item),
	// and whether a death holds its key (sequence_hold; no row: false).
	Sequenced string
	// SetHold sets what a death of a sequenced item does to its key: $1
	// queue, $2 hold (true: the key's later items wait; false: the key
	// advances). A queue without a row gets one, with one part. Turning it
	// off releases the keys its dead items hold (ReleaseAll, in the same
	// transaction: see Store.QueueSequenceHoldSet).
	SetHold string
	// ReleaseAll releases every key the dead items of queue $1 hold (their
	// seq_hold is cleared; the dead items stay) → the dead items released.
	ReleaseAll string
	// Release releases key $2 of queue $1: the dead items of the key that
	// hold it no longer do (they stay in the dead items) → their ids.
	Release string
	// Blocked lists up to $2 keys of queue $1 that cannot run although
	// they have items: each held dead item (kind 'dead', its death's
	// reason and error, when it died), through
	// crdbwork_dead_items_sequence_held; and each key whose head waits to
	// be claimable (kind 'retry' after a failed attempt, 'delayed' before
	// the first; its last error, when it vests): the queue's unclaimed
	// sequenced items not yet vested that are their key's head, read
	// through crdbwork_items_sequence_order (the queue's sequenced items,
	// one head test each: an operator's read, not a claim's).
	// → key, id, kind, reason, last error, at, attempts; by key, then id.
	Blocked string
}

// seqAnchor is where seqCondition goes, in the plain claims' scans; the
// scan's table gets the alias h there.
const (
	seqAnchor  = "FROM crdbwork_items\n"
	seqAliased = "FROM crdbwork_items AS h\n"
)

// seqCondition is what a sequenced claim adds to the plain claim's scan of
// crdbwork_items AS h: an item with seq_order is claimable only if no
// sequenced item of its key is claimed, it is its key's head (the first of
// the key's sequenced items in (enqueued_at, seq_order, id) order), and no
// dead item holds its key (a sequenced item of the key, earlier in the
// key's order, that died in a queue whose sequence holds on a death:
// seq_hold; docs/sequences.md, "After a death").
//
// Its shape keeps every plan PostgreSQL may choose, whatever its
// statistics, to reading the claim order through the claim index and
// stopping at the limit, with a bounded cost per candidate
// (TestSequencedPlansUseIndexes, TestSequencedPlansInLivedDatabase,
// TestSequencedPlansWhileDraining):
//
//   - The claimed keys are read once per statement, uncorrelated
//     (sc.queue = $2: every sequenced claim's scan names its queue $2), into
//     a hashed SubPlan that each candidate probes (NOT IN; sc.item_key is
//     never NULL). Whichever index PostgreSQL reads them through (the
//     unique crdbwork_items_sequence_claimed, or crdbwork_items_lease, which
//     it took when its statistics held no claimed item), it reads the
//     queue's claimed items, once. Asked per candidate, a read through
//     crdbwork_items_lease read every claimed item of the queue per
//     candidate.
//   - The head and the held tests are scalar subqueries with LIMIT 1,
//     correlated with the candidate: PostgreSQL never pulls a scalar
//     subquery up into a join; it runs it as a SubPlan, once per candidate
//     that reaches it (the AND stops at the first false), with the
//     candidate's queue and key as parameters, and its only plan is a read
//     of the index whose predicate the subquery names
//     (crdbwork_items_sequence_order, whose order is the ORDER BY;
//     crdbwork_dead_items_sequence_held), stopped by the LIMIT. Version 5
//     wrote them as NOT EXISTS anti-joins, which PostgreSQL pulls up into
//     joins: in a database whose statistics predate the queue (the queue
//     believed to hold one row), it read the whole queue's sequenced items
//     once per candidate, as the inner side of a nested loop with the key as
//     a join filter (issue 29, item 5: a claim of 4½ minutes over 5,000
//     items).
//   - The tests return booleans (h.id compared inside the subquery,
//     COALESCE of the held one) under one CASE, which PostgreSQL estimates
//     to pass half the candidates. An equality with a SubPlan's id, or IS
//     NULL of a SubPlan, it estimates to pass almost none: it then expected
//     to read the whole queue anyway and chose a sequential or bitmap scan
//     of it, sorted, over the ordered read that stops at the limit (a drain
//     at a fifth of the speed).
//
// CockroachDB decorrelates correlated subqueries (its rules hoist them
// into joins; a LIMIT 1 becomes a DistinctOn), and its lookup joins read
// every entry of each lookup (no per-lookup limit yet:
// cockroachdb/cockroach#62471). Its plan is expected to be a lookup join
// per candidate into crdbwork_items_sequence_order by (queue, key), which
// reads the candidate key's sequenced items, not the queue's, and into
// crdbwork_dead_items_sequence_held (the key's few held dead items); the
// claimed keys an anti-join with the queue's claimed items read once.
// docs/cockroachdb.md, "Statement shapes chosen for CockroachDB", has the
// reasoning; not run here (no CockroachDB server). Both engines evaluate a
// CASE's branch only when its condition selects it.
const seqCondition = `CASE WHEN h.seq_order IS NULL THEN true ELSE
                h.item_key NOT IN (SELECT sc.item_key FROM crdbwork_items AS sc
                    WHERE sc.queue = $2 AND sc.seq_order IS NOT NULL AND sc.claim IS NOT NULL AND sc.item_key IS NOT NULL)
                AND (SELECT sb.id = h.id FROM crdbwork_items AS sb
                    WHERE sb.queue = h.queue AND sb.item_key = h.item_key AND sb.seq_order IS NOT NULL
                    ORDER BY sb.enqueued_at, sb.seq_order, sb.id
                    LIMIT 1)
                AND COALESCE((SELECT false FROM crdbwork_dead_items AS sd
                    WHERE sd.queue = h.queue AND sd.item_key = h.item_key AND sd.seq_hold
                      AND (sd.enqueued_at, sd.seq_order, sd.id) < (h.enqueued_at, h.seq_order, h.id)
                    LIMIT 1), true) END
              AND `

// sequenceTemplate returns template (a plain claim, or one branch of the
// per-part claim) with the scan aliased h and seqCondition added as the
// first condition of its WHERE clause. It panics if the template's scan
// does not have the expected shape.
func sequenceTemplate(template string) string {
	if strings.Count(template, seqAnchor) != 1 {
		panic("sql: a claim template changed: the sequenced claim's condition has no place")
	}
	at := strings.Index(template, seqAnchor) + len(seqAnchor)
	where := strings.Index(template[at:], "WHERE ")
	if where < 0 || strings.TrimSpace(template[at:at+where]) != "" {
		panic("sql: a claim template changed: its scan has no WHERE clause after the table")
	}
	at += where + len("WHERE ")
	out := template[:at] + seqCondition + template[at:]
	return strings.Replace(out, seqAnchor, seqAliased, 1)
}

// newSequenceStatements renders the statements of sequenced queues for t.
func newSequenceStatements(t Tables) *sequenceStatements {
	claim := sequenceTemplate(claimTemplate)
	urgent := sequenceTemplate(urgentTemplate())
	r := func(text string) string { return rewrite(t, text) }
	return &sequenceStatements{
		t:                   t,
		ClaimAny:            r(fmt.Sprintf(claim, joinPicked)),
		PostgresClaimAny:    r(pgClaimTwin(fmt.Sprintf(pgClaimOrder(claim), anyPicked))),
		ClaimUrgent:         r(fmt.Sprintf(urgent, joinPicked)),
		PostgresClaimUrgent: r(pgClaimTwin(fmt.Sprintf(pgClaimOrder(urgent), anyPicked))),
		SetSequenced:        r(setSequencedSQL),
		Sequenced:           r(sequencedSQL),
		SetHold:             r(setHoldSQL),
		ReleaseAll:          r(releaseAllSQL),
		Release:             r(sequenceReleaseSQL),
		Blocked:             r(blockedSQL),
	}
}

// ClaimAnyFor returns ClaimAny, or its twin on PostgreSQL.
func (s *sequenceStatements) ClaimAnyFor(d Dialect) string {
	return byDialect(d, s.ClaimAny, s.PostgresClaimAny)
}

// ClaimUrgentFor returns ClaimUrgent, or its twin on PostgreSQL.
func (s *sequenceStatements) ClaimUrgentFor(d Dialect) string {
	return byDialect(d, s.ClaimUrgent, s.PostgresClaimUrgent)
}

// ClaimParts returns the sequenced per-part claim for k owned parts (1 to
// MaxPartBranches; it panics otherwise) in dialect d: partClaimStatements.Claim
// with seqCondition in every branch, and the same parameters. On
// PostgreSQL its branches lock, as the plain claim's did before
// pgLockLazily: the sequence condition's plans are checked in that form
// (TestSequencedPlansUseIndexes); not measured lazily.
func (s *sequenceStatements) ClaimParts(d Dialect, k int) string {
	checkParts(k)
	slot := &s.claims[d][k]
	if p := slot.Load(); p != nil {
		return *p
	}
	branch := sequenceTemplate(partBranch)
	var b strings.Builder
	for j := range k {
		if j > 0 {
			b.WriteString("\n        UNION ALL\n")
		}
		fmt.Fprintf(&b, branch, "$2", 6+j, "$5", "$3", j)
	}
	text := fmt.Sprintf(partUnionClaimTemplate, b.String(), joinPicked)
	if d == Postgres {
		text = pgClaimTwin(fmt.Sprintf(partUnionClaimTemplate, b.String(), anyPicked))
	}
	text = rewrite(s.t, text)
	slot.Store(&text)
	return text
}
