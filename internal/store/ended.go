package store

// Ended ids: idempotency that outlives the item.
//
// Every statement that removes an item from the items table (an ack, the
// take of an at-most-once item by its claim, a move to the dead items, a
// cancel) records (queue, id, outcome) in crdbwork_ended in the same
// statement, through a data-modifying CTE fed by the DELETE's RETURNING: no
// round trip is added. An enqueue finds an id recorded there within its
// queue's dedup window (crdbwork_queues.dedup_window; a queue without a row:
// DefaultDedupWindow) and does not add it again, so that a producer that
// retries after an unknown outcome never runs work twice, even when a worker
// already finished the first copy. Every session's reaper prunes the rows
// older than the window in bounded batches (dedupStatements.PruneEnded),
// through crdbwork_ended_by_age.
//
// CockroachDB checked: its "Common Table Expressions" page documents
// data-modifying statements in WITH; a CTE with a mutation is executed even
// when the main query does not read it (cockroachdb/cockroach#24307, closed:
// the cost-based optimizer runs such CTEs; PostgreSQL documents the same);
// each statement modifies each table once (CockroachDB refuses several
// modifications of one table in a statement unless they are all INSERTs
// without ON CONFLICT); INSERT ... ON CONFLICT (cols) DO UPDATE with
// excluded and a table alias is accepted (see scheduleStatements.Advance).

// Outcomes recorded in crdbwork_ended.outcome.
const (
	OutcomeAcked     = "acked"
	OutcomeDead      = "dead"
	OutcomeCancelled = "cancelled"
	// OutcomeTaken: an at-most-once item handed out by a claim (the claim
	// deleted it; its handler may have succeeded or failed — it was
	// delivered, and must never be enqueued again within the window).
	OutcomeTaken = "taken"
)

// DefaultDedupWindow is the dedup window of a queue without a row in
// crdbwork_queues, as an SQL interval (the column's default).
const DefaultDedupWindow = `INTERVAL '24 hours'`

// dedupWindow is queue $1's dedup window.
const dedupWindow = `COALESCE((SELECT dedup_window FROM crdbwork_queues WHERE name = $1), ` + DefaultDedupWindow + `)`

// recordEnded returns a CTE, named ended, that records the rows of the CTE
// gone (columns id and queue) in crdbwork_ended with outcome and the
// history hist (expressions over g for endedHistoryColumns: endedFromGone
// or endedFromWaiting), unless their queue keeps no ended record (its dedup
// window is off: keepsNothing). A row already there (an id that ended
// before, enqueued again once its window had passed) is refreshed. The
// window's check is a lookup of the queue's row by primary key per queue,
// cheap next to the delete.
func recordEnded(outcome, hist string) string {
	return `ended AS (
    INSERT INTO crdbwork_ended AS e (queue, id, ended_at, outcome, ` + endedHistoryColumns + `)
    SELECT g.queue, g.id, now(), '` + outcome + `', ` + hist + ` FROM gone AS g
    WHERE NOT ` + keepsNothing + `
    ON CONFLICT (queue, id) DO UPDATE SET ended_at = excluded.ended_at, outcome = excluded.outcome,
        ` + endedHistoryUpdate + `
    RETURNING e.id)`
}

// deleteEnded wraps del, a DELETE from the items table without RETURNING,
// into a statement that records the deleted items as ended with outcome
// and their history and returns their ids.
func deleteEnded(del, outcome string) string {
	return "WITH gone AS (" + del + " RETURNING id, queue, " + goneHistory + "),\n" + recordEnded(outcome, endedFromGone) + "\nSELECT id FROM gone"
}

// hasDependents is the condition, on a row g (columns id and queue) of an
// item that ended, that some waiting item waits for it (an edge of
// crdbwork_waits_for from it): one seek of the edges' primary key (queue,
// prereq), its queue and id both from the row. The OFFSET 0 keeps it a
// subplan run per row on PostgreSQL (which otherwise may hash the whole
// table of edges for an EXISTS it believes cheap to hash: see
// postgresDedupCheck); CockroachDB drops it and plans a lookup semi-join.
const hasDependents = `EXISTS (SELECT 1 FROM crdbwork_waits_for AS x WHERE x.queue = g.queue AND x.prereq = g.id OFFSET 0)`

// ackedSelect is the final SELECT of an ack: each deleted item's id and
// whether items wait for it, so that the ack releases the dependents of
// exactly those (claim's releaseAcked), in the ack's own snapshot: an
// enqueue of a dependent that commits before the ack is seen, and one that
// races it conflicts with it (both SERIALIZABLE: the enqueue read the item
// the ack deletes, the ack the edges the enqueue writes), and is retried.
const ackedSelect = "\nSELECT g.id, " + hasDependents + " FROM gone AS g"

// deleteEndedAck is deleteEnded for an ack: it returns, with each deleted
// item's id, whether items wait for it (ackedSelect).
func deleteEndedAck(del string) string {
	return "WITH gone AS (" + del + " RETURNING id, queue, " + goneHistory + "),\n" + recordEnded(OutcomeAcked, endedFromGone) + ackedSelect
}

// dedupStatements are the statements of the dedup window that are not part
// of an ack, a move or an enqueue, rendered for one set of table names. The
// text is identical on CockroachDB and PostgreSQL.
type dedupStatements struct {
	// PruneEnded deletes up to $2 rows of queue $1 that ended before its
	// dedup and history windows (keepWindow, schema version 6), oldest first, through crdbwork_ended_by_age (queue,
	// ended_at), and returns their ids. Rows another pruner holds are
	// skipped (FOR UPDATE SKIP LOCKED: run it in an explicit SERIALIZABLE
	// transaction, as the reaper's other statements). The CTE's rows are
	// found again by primary key.
	PruneEnded string // $1 queue, $2 limit → ids pruned
}

// newDedupStatements renders the dedup statements for t.
func newDedupStatements(t Tables) *dedupStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &dedupStatements{
		PruneEnded: r(pruneEndedSQL),
	}
}
