package store

import (
	"context"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The item list (claim.Queue.List, issue 33): one queue's items in one
// state, a page at a time, each page read through the index that serves
// its state's order and resumed after the last row of the previous page
// (a keyset: no OFFSET), so that items added while a caller pages are
// listed at most once, and those present throughout exactly once (unless
// they change state meanwhile). Every statement takes the position to go
// on after; the first page passes the position before every row
// (ListStart). A key or tenant filter is a condition on the rows the index
// gives, in its order: a page reads on until it has its rows or the state
// has no more.
//
// The text is identical on CockroachDB and PostgreSQL: row-value
// comparisons in a keyset ((a, b) > ($1, $2)) are in both grammars; on
// CockroachDB a tuple inequality on an index's columns constrains its span
// (its docs' "Paginate through limited results" uses this shape, with an
// index on the tuple's columns).

// historyStatements are the list's statements, rendered for one set of
// table names.
type historyStatements struct {
	// Unclaimed lists unclaimed items of queue $1 in claim order
	// (crdbwork_items_turn_next), $2 key and $3 tenant ("" any), after
	// ($4 priority, $5 turn, $6 part, $7 id), at most $8.
	Unclaimed string
	// Claimed lists claimed items in lease order (crdbwork_items_lease),
	// after ($4 lease, $5 id), at most $6.
	Claimed string
	// Waiting lists waiting items by enqueue time (crdbwork_waiting_by_queue),
	// after ($4 enqueued, $5 id), at most $6.
	Waiting string
	// Dead lists deaths newest first (crdbwork_dead_items_by_queue), before
	// ($4 died, $5 id, $6 death), at most $7.
	Dead string
	// Ended lists ended records with an outcome in $2 newest first
	// (crdbwork_ended_by_age), before ($3 ended, $4 id), at most $5, of
	// kind $6 ("" any).
	Ended string
	// Cancelled is Ended for the cancelled items, through their own index
	// (crdbwork_ended_cancelled): before ($2 ended, $3 id), at most $4, of
	// kind $5 ("" any).
	Cancelled string
	// PruneErrors deletes up to $2 of queue $1's rows of
	// crdbwork_attempt_errors whose item is gone and out of the history
	// window (pruneAttemptErrorsSQL).
	PruneErrors string
}

// listFilters are the key ($2), tenant ($3) and kind (the parameter kind,
// the statement's last: kindFilter) filters of a list ("": any). Each comparison is wrapped in COALESCE, whose selectivity the
// planner cannot derive from the column's statistics: with a plain
// item_key = $2, PostgreSQL estimated a key's items at one row and scanned
// the whole items table for them rather than read the state's index on the
// queue in order, stopping at the page's end (TestExplainHistoryStatements).
// CockroachDB accepts the same text.
func listFilters(kind string) string {
	return `($2 = '' OR COALESCE(item_key = $2, false)) AND ($3 = '' OR COALESCE(tenant = $3, false)) AND ` + kindFilter(kind)
}

// kindFilter is the kind filter of a list, the parameter kind ("": any);
// the ended lists have it alone (their records keep no key or tenant).
func kindFilter(kind string) string {
	return `(` + kind + ` = '' OR COALESCE(kind = ` + kind + `, false))`
}

// listItemColumns are the columns of a live item's list row.
const listItemColumns = `id, part, item_key, tenant, priority, attempts, max_attempts, enqueued_at, vesting_at, turn_at, lease_until,
       substr(last_error, 1, 500), claim, snoozes, octet_length(payload), kind`

var listUnclaimedSQL = `SELECT ` + listItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NULL AND ` + listFilters("$9") + `
  AND (priority, turn_at, part) >= ($4::BIGINT, $5::TIMESTAMPTZ, $6::BIGINT)
  AND NOT (priority = $4::BIGINT AND turn_at = $5::TIMESTAMPTZ AND part = $6::BIGINT AND id <= $7::UUID)
ORDER BY priority, turn_at, part, id LIMIT $8`

var listClaimedSQL = `SELECT ` + listItemColumns + ` FROM crdbwork_items
WHERE queue = $1 AND claim IS NOT NULL AND ` + listFilters("$7") + `
  AND lease_until >= $4::TIMESTAMPTZ AND (lease_until, id) > ($4::TIMESTAMPTZ, $5::UUID)
ORDER BY lease_until, id LIMIT $6`

var listWaitingSQL = `SELECT id, 0, item_key, tenant, priority, 0, max_attempts, enqueued_at, enqueued_at, enqueued_at, NULL::TIMESTAMPTZ,
       NULL::TEXT, NULL::UUID, 0, octet_length(payload), kind
FROM crdbwork_waiting
WHERE queue = $1 AND ` + listFilters("$7") + `
  AND enqueued_at >= $4::TIMESTAMPTZ AND (enqueued_at, id) > ($4::TIMESTAMPTZ, $5::UUID)
ORDER BY enqueued_at, id LIMIT $6`

var listDeadSQL = `SELECT id, death, part, item_key, tenant, priority, attempts, max_attempts, enqueued_at, died_at,
       substr(last_error, 1, 500), reason, octet_length(payload), kind
FROM crdbwork_dead_items
WHERE queue = $1 AND ` + listFilters("$8") + `
  AND died_at <= $4::TIMESTAMPTZ AND (died_at, id, death) < ($4::TIMESTAMPTZ, $5::UUID, $6::UUID)
ORDER BY died_at DESC, id DESC, death DESC LIMIT $7`

var listEndedSQL = `SELECT id, outcome, ended_at, attempts, enqueued_at, kind
FROM crdbwork_ended
WHERE queue = $1 AND outcome = ANY($2::TEXT[]) AND ` + kindFilter("$6") + `
  AND ended_at <= $3::TIMESTAMPTZ AND (ended_at, id) < ($3::TIMESTAMPTZ, $4::UUID)
ORDER BY ended_at DESC, id DESC LIMIT $5`

var listCancelledSQL = `SELECT id, outcome, ended_at, attempts, enqueued_at, kind
FROM crdbwork_ended
WHERE queue = $1 AND outcome = '` + OutcomeCancelled + `' AND ` + kindFilter("$5") + `
  AND ended_at <= $2::TIMESTAMPTZ AND (ended_at, id) < ($2::TIMESTAMPTZ, $3::UUID)
ORDER BY ended_at DESC, id DESC LIMIT $4`

func newHistoryStatements(t Tables) *historyStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &historyStatements{
		Unclaimed: r(listUnclaimedSQL),
		Claimed:   r(listClaimedSQL),
		Waiting:   r(listWaitingSQL),
		Dead:      r(listDeadSQL),
		Ended:     r(listEndedSQL),
		Cancelled: r(listCancelledSQL),

		PruneErrors: r(pruneAttemptErrorsSQL),
	}
}

// ListKind names what a list reads.
type ListKind int

// The lists.
const (
	ListUnclaimed ListKind = iota // unclaimed items, claim order
	ListClaimed                   // claimed items, lease order
	ListWaiting                   // waiting items, enqueue order
	ListDead                      // deaths, newest first
	ListEnded                     // ended records (acked, taken), newest first
	ListCancelled                 // cancelled ended records, newest first
)

// ListPosition is where a list goes on: the last row of the previous page,
// in the list's order (the fields of that order only).
type ListPosition struct {
	Priority int64
	TurnAt   time.Time
	Part     int64
	// At is the lease end, the enqueue time, the death or the end, by list.
	At    time.Time
	ID    uuid.UUID
	Death uuid.UUID
}

// ListStart returns the position before the first row of list k.
func ListStart(k ListKind) ListPosition {
	switch k {
	case ListUnclaimed:
		return ListPosition{Priority: math.MinInt64, TurnAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), Part: math.MinInt64}
	case ListClaimed, ListWaiting:
		return ListPosition{At: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	// The newest-first lists: after every row, in a year no clock reaches.
	max := uuid.Max
	return ListPosition{At: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), ID: max, Death: max}
}

// ListRow is one row of a list: a live, waiting or dead item, or an ended
// record (ID, Outcome, At, Attempts, EnqueuedAt and Kind only; Attempts -1
// and Kind "" for a record of code older than schema version 6).
type ListRow struct {
	ID, Death             uuid.UUID
	Part                  int64
	Key, Tenant           string
	Priority              int64
	Attempts, MaxAttempts int64
	EnqueuedAt            time.Time
	// At is the row's time in its list: the vesting time (unclaimed), the
	// lease end (claimed), the enqueue time (waiting), the death, the end.
	At         time.Time
	TurnAt     time.Time
	LastError  string
	Claim      *uuid.UUID
	Snoozes    int64
	PayloadLen int64
	// Outcome is the ended record's outcome, or the death's reason.
	Outcome string
	// Kind is the item's kind ("": none, or an ended record of code older
	// than schema version 6).
	Kind string
}

// Position returns r's place in list k.
func (r ListRow) Position(k ListKind) ListPosition {
	switch k {
	case ListUnclaimed:
		return ListPosition{Priority: r.Priority, TurnAt: r.TurnAt, Part: r.Part, ID: r.ID}
	case ListDead:
		return ListPosition{At: r.At, ID: r.ID, Death: r.Death}
	}
	return ListPosition{At: r.At, ID: r.ID}
}

// ListFilter selects a list's rows: each field set must match ("": any;
// only Kind for ListEnded and ListCancelled, whose records keep no key or
// tenant).
type ListFilter struct {
	Key, Tenant, Kind string
}

// ItemsList reads up to limit rows of list k of queue after p, those that
// match f (its Kind alone for ListEnded and ListCancelled), and for
// ListEnded those whose outcome is in outcomes.
func (s *Store) ItemsList(ctx context.Context, db DB, k ListKind, queue string, f ListFilter, outcomes []string, p ListPosition, limit int) ([]ListRow, error) {
	key, tenant := f.Key, f.Tenant
	st := s.lazyHistory()
	var rows pgx.Rows
	var err error
	switch k {
	case ListUnclaimed:
		rows, err = db.Query(ctx, st.Unclaimed, queue, key, tenant, p.Priority, p.TurnAt, p.Part, p.ID, limit, f.Kind)
	case ListClaimed:
		rows, err = db.Query(ctx, st.Claimed, queue, key, tenant, p.At, p.ID, limit, f.Kind)
	case ListWaiting:
		rows, err = db.Query(ctx, st.Waiting, queue, key, tenant, p.At, p.ID, limit, f.Kind)
	case ListDead:
		rows, err = db.Query(ctx, st.Dead, queue, key, tenant, p.At, p.ID, p.Death, limit, f.Kind)
	case ListEnded:
		rows, err = db.Query(ctx, st.Ended, queue, outcomes, p.At, p.ID, limit, f.Kind)
	case ListCancelled:
		rows, err = db.Query(ctx, st.Cancelled, queue, p.At, p.ID, limit, f.Kind)
	}
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ListRow, error) {
		var r ListRow
		var key, tenant, lastErr, kind *string
		var lease *time.Time
		var att *int64
		var enq *time.Time
		var err error
		switch k {
		case ListUnclaimed, ListClaimed, ListWaiting:
			err = row.Scan(&r.ID, &r.Part, &key, &tenant, &r.Priority, &r.Attempts, &r.MaxAttempts, &r.EnqueuedAt, &r.At, &r.TurnAt,
				&lease, &lastErr, &r.Claim, &r.Snoozes, &r.PayloadLen, &kind)
			if k == ListClaimed && lease != nil {
				r.At = *lease
			}
		case ListDead:
			err = row.Scan(&r.ID, &r.Death, &r.Part, &key, &tenant, &r.Priority, &r.Attempts, &r.MaxAttempts, &r.EnqueuedAt, &r.At,
				&lastErr, &r.Outcome, &r.PayloadLen, &kind)
		default:
			err = row.Scan(&r.ID, &r.Outcome, &r.At, &att, &enq, &kind)
			r.Attempts = -1
			if att != nil {
				r.Attempts = *att
			}
			if enq != nil {
				r.EnqueuedAt = *enq
			}
		}
		r.Key, r.Tenant, r.LastError, r.Kind = deref(key), deref(tenant), deref(lastErr), deref(kind)
		return r, err
	})
}

// historyWindow is queue $1's history window (a queue without a row: a
// day, the column's default).
const historyWindow = `COALESCE((SELECT history_window FROM crdbwork_queues WHERE name = $1), ` + DefaultHistoryWindow + `)`

// pruneAttemptErrorsSQL is the text of historyStatements.PruneErrors: up
// to $2 of queue $1's rows of crdbwork_attempt_errors, oldest first
// through crdbwork_attempt_errors_by_age, not written within the history
// window, whose item is in none of the items, waiting, dead and kept
// cancelled tables and has no ended record within the window (gone, or
// older). Each candidate's checks are primary-key (or leading-column)
// lookups, written as scalar subqueries with LIMIT 1 rather than NOT
// EXISTS: PostgreSQL turned NOT EXISTS into anti joins and, estimating
// thousands of candidates, hashed the dead items whole
// (TestAttemptErrorsPrunePlans); a subquery with a LIMIT stays a lookup
// per candidate. Rows whose item is still there (a dead item kept longer than
// the history window, an item still retried) are passed over in the index
// scan, so a batch is not stopped by them. Rows another pruner holds are
// skipped (FOR UPDATE SKIP LOCKED: run it in an explicit SERIALIZABLE
// transaction, as the reaper's other statements); the text is identical on
// CockroachDB and PostgreSQL.
const pruneAttemptErrorsSQL = `WITH old AS MATERIALIZED (
    SELECT h.id FROM crdbwork_attempt_errors AS h
    WHERE h.queue = $1 AND h.updated_at < now() - ` + historyWindow + `
      AND (SELECT 1 FROM crdbwork_items AS i WHERE i.id = h.id LIMIT 1) IS NULL
      AND (SELECT 1 FROM crdbwork_waiting AS w WHERE w.id = h.id LIMIT 1) IS NULL
      AND (SELECT 1 FROM crdbwork_dead_items AS d WHERE d.id = h.id LIMIT 1) IS NULL
      AND (SELECT 1 FROM crdbwork_cancelled_items AS c WHERE c.id = h.id AND c.queue = $1 LIMIT 1) IS NULL
      AND (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = $1 AND e.id = h.id AND e.ended_at >= now() - ` + historyWindow + ` LIMIT 1) IS NULL
    ORDER BY h.updated_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM crdbwork_attempt_errors AS x
WHERE x.queue = $1 AND x.id IN (SELECT id FROM old)
RETURNING x.id`

// AttemptErrorsPrune deletes, in tx (SERIALIZABLE), up to limit of
// queue's rows of crdbwork_attempt_errors whose item is gone and out of
// its history window, oldest first, and returns how many
// (historyStatements.PruneErrors).
func (s *Store) AttemptErrorsPrune(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, s.lazyHistory().PruneErrors, queue, limit)
	return tag.RowsAffected(), err
}
