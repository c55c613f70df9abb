package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Retention (schema version 5): how long and how many dead items each queue
// keeps. crdbwork_queues.dead_max_age and dead_max_count hold a queue's
// bounds (0: no such bound; a queue without a row has the columns'
// defaults, DefaultDeadMaxAge and DefaultDeadMaxCount). Every session's
// reaper (claim.Queue.Reap, through PruneDead) deletes the dead items older
// than the age, and those older than the newest count, oldest first, in
// bounded batches, through crdbwork_dead_items_by_queue (queue, died_at):
// each statement seeks the queue's oldest entries and stops at its limit,
// and finds nothing to delete in one seek.
//
// The count bound needs the died_at of the count-th newest death: DeadNewest
// reads the queue's newest count entries of the index (backwards, stopping
// at the limit), so its cost is the bound's, not the table's; DeadSince
// counts the deaths since a time, reading only those. claim.Queue keeps an
// upper bound of the queue's deaths between reaps from them and reads
// DeadNewest only when that bound passes the count (see claim/retention.go).
//
// The text is identical on CockroachDB and PostgreSQL but for the deletes'
// join (PostgreSQL's twins, pgPruneDeadTemplate): the deletes have the
// shape of dedupStatements.PruneEnded (a MATERIALIZED CTE that selects FOR
// UPDATE SKIP LOCKED ... ORDER BY ... LIMIT n, then a DELETE of its rows by
// primary key; CockroachDB docs checked there), the reads are a count and
// a min over a limited, ordered subquery, as the inspection statements run.

// DefaultDeadMaxAge and DefaultDeadMaxCount are the retention of a queue
// without a row, as SQL literals (the columns' defaults in schema.sql and
// migration 0005).
const (
	DefaultDeadMaxAge   = `INTERVAL '720 hours'`
	DefaultDeadMaxCount = `100000`
)

// retentionStatements are the statements of retention, rendered for one set
// of table names.
type retentionStatements struct {
	// Retention reads queue $1's bounds: stored (whether the queue has a
	// row), dead_max_age (µs) and dead_max_count, the defaults without a
	// row. A primary-key lookup.
	Retention string // $1 queue → stored, max age (µs), max count
	// SetRetention writes them (a queue without a row gets one, with one
	// part, as coreStatements.ConfigureQueue does).
	SetRetention string // $1 queue, $2 max age (µs), $3 max count
	// PruneDeadOlder deletes up to $3 of queue $1's dead items that died
	// more than $2 µs ago, oldest first, skipping rows another transaction
	// holds (run it in an explicit SERIALIZABLE transaction).
	PruneDeadOlder string // $1 queue, $2 age (µs), $3 limit → ids pruned
	// PruneDeadBefore deletes up to $3 of queue $1's dead items that died
	// before $2, oldest first, as PruneDeadOlder.
	PruneDeadBefore string // $1 queue, $2 died before, $3 limit → ids pruned
	// PostgresPruneDeadOlder and PostgresPruneDeadBefore are their
	// PostgreSQL twins (see pgPruneDeadTemplate).
	PostgresPruneDeadOlder, PostgresPruneDeadBefore string
	// DeadNewest reads queue $1's newest $2 deaths: how many there are (at
	// most $2), the oldest died_at among them (NULL if none), how many of
	// them died in the last $3 µs, and the database clock.
	DeadNewest string // $1 queue, $2 count, $3 recent (µs) → count, min died_at, recent count, now()
	// DeadSince counts queue $1's deaths since $2, at most $3, newest
	// first (the order makes the index the only cheap plan, also when a
	// generic plan cannot tell how many rows $2 leaves).
	DeadSince string // $1 queue, $2 since, $3 limit → count
}

// pruneDeadTemplate deletes a bounded batch of a queue's oldest dead items;
// %s is the condition on died_at.
const pruneDeadTemplate = `WITH old AS MATERIALIZED (
    SELECT id, death FROM crdbwork_dead_items
    WHERE queue = $1 AND died_at < %s
    ORDER BY died_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
DELETE FROM crdbwork_dead_items AS d
WHERE (d.id, d.death) IN (SELECT id, death FROM old)
RETURNING d.id`

// pgPruneDeadTemplate is pruneDeadTemplate on PostgreSQL: the DELETE finds
// each selected row by its primary key (id, death) through
// d.id = ANY(ARRAY[old.id]) AND d.death = ANY(ARRAY[old.death]), index
// conditions for each row of the batch that no hash or merge join can use,
// as the fenced acks do (statements.go, pgFenced). With (id, death) IN
// (SELECT ...), a generic plan, which cannot see the batch's limit, hashed
// the batch and read every dead item of every queue (a sequential scan of
// crdbwork_dead_items) as soon as the table looked small beside the batch
// it guessed: in a database that has lived, on every reap
// (TestHotPlansInALivedDatabase).
const pgPruneDeadTemplate = `WITH old AS MATERIALIZED (
    SELECT id, death FROM crdbwork_dead_items
    WHERE queue = $1 AND died_at < %s
    ORDER BY died_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
DELETE FROM crdbwork_dead_items AS d
USING old
WHERE d.id = ANY(ARRAY[old.id]) AND d.death = ANY(ARRAY[old.death])
RETURNING d.id`

func newRetentionStatements(t Tables) *retentionStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &retentionStatements{
		Retention:               r(retentionSQL),
		SetRetention:            r(setRetentionSQL),
		PruneDeadOlder:          r(pruneDeadOlderSQL),
		PruneDeadBefore:         r(pruneDeadBeforeSQL),
		PostgresPruneDeadOlder:  r(postgresPruneDeadOlderSQL),
		PostgresPruneDeadBefore: r(postgresPruneDeadBeforeSQL),
		DeadNewest:              r(deadNewestSQL),
		DeadSince:               r(deadSinceSQL),
	}
}

// RetentionRow is a queue's retention as stored: 0 means no such bound.
type RetentionRow struct {
	// Stored reports whether the queue has a row (otherwise the values are
	// the defaults).
	Stored   bool
	MaxAge   time.Duration
	MaxCount int64
	// History is how long the queue keeps its ended records for the
	// items' history (schema version 6; 0: no longer than its dedup window).
	History time.Duration
}

// DefaultHistoryWindow is the history window of a queue without a row, as
// an SQL literal (the column's default).
const DefaultHistoryWindow = `INTERVAL '24 hours'`

// retentionSQL is the text of retentionStatements.Retention
// (rendered by newRetentionStatements).
const retentionSQL = `SELECT q.name IS NOT NULL,
       COALESCE((EXTRACT(EPOCH FROM q.dead_max_age) * 1000000)::BIGINT, (EXTRACT(EPOCH FROM ` + DefaultDeadMaxAge + `) * 1000000)::BIGINT),
       COALESCE(q.dead_max_count, ` + DefaultDeadMaxCount + `),
       COALESCE((EXTRACT(EPOCH FROM q.history_window) * 1000000)::BIGINT, (EXTRACT(EPOCH FROM ` + DefaultHistoryWindow + `) * 1000000)::BIGINT)
FROM (SELECT 1) AS one LEFT JOIN crdbwork_queues AS q ON q.name = $1`

// QueueRetention reads queue's retention (retentionStatements.Retention).
func (s *Store) QueueRetention(ctx context.Context, db DB, queue string) (RetentionRow, error) {
	var r RetentionRow
	var us, hist int64
	if err := db.QueryRow(ctx, s.ret.Retention, queue).Scan(&r.Stored, &us, &r.MaxCount, &hist); err != nil {
		return RetentionRow{}, err
	}
	r.MaxAge = time.Duration(us) * time.Microsecond
	r.History = time.Duration(hist) * time.Microsecond
	return r, nil
}

// setRetentionSQL is the text of retentionStatements.SetRetention
// (rendered by newRetentionStatements).
const setRetentionSQL = `INSERT INTO crdbwork_queues AS q (name, dead_max_age, dead_max_count, history_window)
VALUES ($1, $2::BIGINT * INTERVAL '1 microsecond', $3, $4::BIGINT * INTERVAL '1 microsecond')
ON CONFLICT (name) DO UPDATE SET dead_max_age = excluded.dead_max_age, dead_max_count = excluded.dead_max_count,
    history_window = excluded.history_window`

// QueueRetentionSet stores queue's retention r (Stored ignored), at
// microsecond precision (retentionStatements.SetRetention).
func (s *Store) QueueRetentionSet(ctx context.Context, db DB, queue string, r RetentionRow) error {
	_, err := db.Exec(ctx, s.ret.SetRetention, queue, r.MaxAge.Microseconds(), r.MaxCount, r.History.Microseconds())
	return err
}

// pruneDeadOlderSQL is the text of retentionStatements.PruneDeadOlder
// (rendered by newRetentionStatements).
var pruneDeadOlderSQL = fmt.Sprintf(pruneDeadTemplate, `now() - $2::BIGINT * INTERVAL '1 microsecond'`)

// postgresPruneDeadOlderSQL is the text of retentionStatements.PostgresPruneDeadOlder
// (rendered by newRetentionStatements).
var postgresPruneDeadOlderSQL = fmt.Sprintf(pgPruneDeadTemplate, `now() - $2::BIGINT * INTERVAL '1 microsecond'`)

// DeadPruneOlder deletes, in tx, up to limit of queue's dead items older
// than age and returns how many (retentionStatements.PruneDeadOlder, or its
// PostgreSQL twin for d).
func (s *Store) DeadPruneOlder(ctx context.Context, tx pgx.Tx, d Dialect, queue string, age time.Duration, limit int) (int64, error) {
	stmt := s.ret.PruneDeadOlder
	if d == Postgres {
		stmt = s.ret.PostgresPruneDeadOlder
	}
	tag, err := tx.Exec(ctx, stmt, queue, age.Microseconds(), limit)
	return tag.RowsAffected(), err
}

// pruneDeadBeforeSQL is the text of retentionStatements.PruneDeadBefore
// (rendered by newRetentionStatements).
var pruneDeadBeforeSQL = fmt.Sprintf(pruneDeadTemplate, `$2::TIMESTAMPTZ`)

// postgresPruneDeadBeforeSQL is the text of retentionStatements.PostgresPruneDeadBefore
// (rendered by newRetentionStatements).
var postgresPruneDeadBeforeSQL = fmt.Sprintf(pgPruneDeadTemplate, `$2::TIMESTAMPTZ`)

// DeadPruneBefore deletes, in tx, up to limit of queue's dead items that
// died before t and returns how many (retentionStatements.PruneDeadBefore,
// or its PostgreSQL twin for d).
func (s *Store) DeadPruneBefore(ctx context.Context, tx pgx.Tx, d Dialect, queue string, t time.Time, limit int) (int64, error) {
	stmt := s.ret.PruneDeadBefore
	if d == Postgres {
		stmt = s.ret.PostgresPruneDeadBefore
	}
	tag, err := tx.Exec(ctx, stmt, queue, t, limit)
	return tag.RowsAffected(), err
}

// DeadNewestRow is what DeadNewest reads.
type DeadNewestRow struct {
	// Count is the number of the queue's deaths, up to the count asked.
	Count int64
	// Oldest is the died_at of the oldest of them (zero if none).
	Oldest time.Time
	// Recent is how many of them died within the recent duration asked.
	Recent int64
	// Now is the database clock.
	Now time.Time
}

// deadNewestSQL is the text of retentionStatements.DeadNewest
// (rendered by newRetentionStatements).
const deadNewestSQL = `SELECT count(*), min(died_at), count(*) FILTER (WHERE died_at >= now() - $3::BIGINT * INTERVAL '1 microsecond'), now()
FROM (SELECT died_at FROM crdbwork_dead_items WHERE queue = $1 ORDER BY died_at DESC LIMIT $2) AS newest`

// DeadNewest reads queue's newest n deaths, and how many of them died
// within recent (retentionStatements.DeadNewest).
func (s *Store) DeadNewest(ctx context.Context, db DB, queue string, n int64, recent time.Duration) (DeadNewestRow, error) {
	var r DeadNewestRow
	var oldest *time.Time
	if err := db.QueryRow(ctx, s.ret.DeadNewest, queue, n, recent.Microseconds()).Scan(&r.Count, &oldest, &r.Recent, &r.Now); err != nil {
		return DeadNewestRow{}, err
	}
	if oldest != nil {
		r.Oldest = *oldest
	}
	return r, nil
}

// deadSinceSQL is the text of retentionStatements.DeadSince
// (rendered by newRetentionStatements).
const deadSinceSQL = `SELECT count(*)
FROM (SELECT died_at FROM crdbwork_dead_items WHERE queue = $1 AND died_at >= $2 ORDER BY died_at DESC LIMIT $3) AS recent`

// DeadSince counts queue's deaths since t, at most limit
// (retentionStatements.DeadSince).
func (s *Store) DeadSince(ctx context.Context, db DB, queue string, t time.Time, limit int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.ret.DeadSince, queue, t, limit).Scan(&n)
	return n, err
}
