package store

import (
	"context"
	"time"
)

// The Store methods of the reap turns (crdbwork_reaps, schema version 6):
// a session takes a turn before it reaps, so that a fleet reaps each queue,
// and the expired sessions, about once per interval instead of once per
// session. See package worker's maintenance loop.

// takeQueueReapTurnSQL is the text of coreStatements.TakeQueueReapTurn:
// it takes queue $1's reap turn when the queue's last reap is at least $2
// old, and then also its prune turn when the last whole reap with the
// prunes is at least $3 old (pruned_at), and returns whether it took each
// (no row: the reap turn was not due) and whether the reap's item steps
// have work (queueReapDueSQL). The upsert writes only when the reap turn
// is due: otherwise it locks the row for the statement (PostgreSQL) and
// returns nothing. RETURNING reads the row as written: pruned_at equals
// the statement's now() only when this statement set it. A turn taken by
// a session that dies before it reaps costs one interval.
const takeQueueReapTurnSQL = `WITH turn AS (INSERT INTO crdbwork_reaps AS r (name, reaped_at, pruned_at) VALUES ($1, now(), now())
    ON CONFLICT (name) DO UPDATE SET reaped_at = excluded.reaped_at,
        pruned_at = CASE WHEN r.pruned_at IS NULL OR r.pruned_at <= now() - $3::BIGINT * INTERVAL '1 microsecond'
                         THEN excluded.pruned_at ELSE r.pruned_at END
    WHERE r.reaped_at <= now() - $2::BIGINT * INTERVAL '1 microsecond'
    RETURNING r.pruned_at = now() AS prune)
SELECT EXISTS (SELECT 1 FROM turn), COALESCE((SELECT prune FROM turn), false), (` + queueReapDueSQL + `)`

// queueReapDueSQL is what the queue's reap turn returns last: whether a
// reap of queue $1 would find anything of its item steps to do (expired
// leases, items past their deadline, cancels asked for, dependencies), one
// seek in the index each step reads itself: each test is a scalar subquery
// that reads the first entry in the index's order (ORDER BY its column,
// LIMIT 1), which no plan but the index's own finds without reading and
// sorting every row of the queue (an EXISTS, estimated to find a match in
// the first rows, was planned as a sequential scan of the items in
// TestHotPlansInEveryState, and PostgreSQL drops the ORDER BY and LIMIT of
// an EXISTS). Each test is a
// superset of its step's condition, so that a false here means the steps
// find nothing. Exhausted items (unclaimed, attempts used up: an item
// released at its last attempt) have no ordered index to seek: they come
// from a lease reaped (the same reap then moves them), or from a session
// deleted (the reap of expired sessions makes the queue's prune turn due:
// reapSessionsTurnSQL), or from a session closed or an at-most-once take
// that failed (the prunes' reap, once a minute, moves them). The prunes
// (ended ids, kept cancelled items, dead items) are not in it: they have
// their own, slower, turn (pruned_at).
const queueReapDueSQL = `SELECT
 (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL AND lease_until < now() ORDER BY lease_until LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND expires_at IS NOT NULL AND expires_at <= now() ORDER BY expires_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND cancel_requested_at IS NOT NULL ORDER BY cancel_requested_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_waits_for WHERE queue = $1 ORDER BY prereq LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_waiting WHERE queue = $1 ORDER BY enqueued_at LIMIT 1) IS NOT NULL`

// ReapsTakeQueueTurn takes queue's reap turn when its last reap is at least
// every old, and its prune turn when its last prune is at least pruneEvery
// old, and reports whether it took each and whether the queue's item
// steps have anything to do (queueReapDueSQL), in one statement.
func (s *Store) ReapsTakeQueueTurn(ctx context.Context, db DB, queue string, every, pruneEvery time.Duration) (took, prune, due bool, err error) {
	err = db.QueryRow(ctx, s.st.TakeQueueReapTurn, queue, every.Microseconds(), pruneEvery.Microseconds()).Scan(&took, &prune, &due)
	return took, prune, due, err
}

// queuePrunesDueSQL is the text of coreStatements.QueuePrunesDue: whether
// the steps of queue $1's whole reap that its reap turn's test of work
// (queueReapDueSQL) leaves out may find anything to do: exhausted items
// (unclaimed, attempts used up, no cancel asked for: the exhausted
// step's own condition, through crdbwork_items_exhausted), ended ids past
// the queue's windows and kept cancelled items past its dedup window (the
// prunes' own conditions, the oldest row of each through its index by
// age), attempt errors not written within the history window (a superset
// of that prune's condition: the oldest row by age), any dead item of the
// queue (a superset of both retention bounds, which a dead item's age and
// the queue's count of dead items decide), and any cross-queue edge into
// the queue (the dependency sweep settles those whose dependents or
// prerequisites are gone). One seek per index, so that a fleet's prune
// turn on an idle queue with nothing to prune is this one statement
// rather than the whole reap's 28 (BEGIN and COMMIT included): a false
// means the whole reap would find nothing that the item steps' test
// (false too, for this to be asked) would not have found.
const queuePrunesDueSQL = `SELECT
 (SELECT count(*) FROM (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND attempts >= max_attempts AND ` + noCancelAsked + `
    LIMIT $2) AS e) > 0
 OR (SELECT 1 FROM crdbwork_ended WHERE queue = $1 AND ended_at < now() - ` + keepWindow + ` ORDER BY ended_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_cancelled_items WHERE queue = $1 AND cancelled_at < now() - ` + dedupWindow + ` ORDER BY cancelled_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_attempt_errors WHERE queue = $1 AND updated_at < now() - ` + historyWindow + ` ORDER BY updated_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_dead_items WHERE queue = $1 ORDER BY died_at LIMIT 1) IS NOT NULL
 OR (SELECT 1 FROM crdbwork_waits_across WHERE dependent_queue = $1 ORDER BY dependent LIMIT 1) IS NOT NULL`

// prunesDueExhausted is the most exhausted items QueuePrunesDue's test
// counts (its $2): the limit of the exhausted step's own batch, with
// which PostgreSQL reads them through crdbwork_items_exhausted, as it
// does for that step (with LIMIT 1 it expected one of every three of the
// queue's items to be exhausted, and read the items from the start,
// TestHotPlansBeforeTheFirstAnalyze); an idle queue has none, and reads
// none.
const prunesDueExhausted = 1000

// ReapsPrunesDue reports whether the steps of queue's whole reap that
// ReapsTakeQueueTurn's test of work leaves out (the exhausted items, the
// prunes, the cross-queue edges) may have anything to do
// (queuePrunesDueSQL), in one statement.
func (s *Store) ReapsPrunesDue(ctx context.Context, db DB, queue string) (bool, error) {
	var due bool
	err := db.QueryRow(ctx, s.st.QueuePrunesDue, queue, prunesDueExhausted).Scan(&due)
	return due, err
}

// reapSessionsTurnSQL is the text of coreStatements.ReapSessionsTurn: the
// reap of expired sessions (reapSessionsSQL) behind the turn named by the
// empty string; it also makes the prune turn of every queue the deleted
// sessions worked due (pruned_at NULL), so that the fleet's next reap of
// each runs whole and moves the items their deletion released at their
// last attempt to the dead items
// (an upsert like takeQueueReapTurnSQL's): when the turn is not due, the statement deletes
// nothing and reads no session; when it is, it takes it and reaps, in one
// statement.
const reapSessionsTurnSQL = `WITH turn AS (INSERT INTO crdbwork_reaps AS r (name, reaped_at) VALUES ('', now())
    ON CONFLICT (name) DO UPDATE SET reaped_at = excluded.reaped_at
    WHERE r.reaped_at <= now() - $1::BIGINT * INTERVAL '1 microsecond'
    RETURNING 1),
gone AS MATERIALIZED (SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry < now() AND EXISTS (SELECT 1 FROM turn)),
bump AS (
    UPDATE crdbwork_queues SET changes = changes + 1
    WHERE name IN (SELECT queue FROM crdbwork_session_queues WHERE session_id IN (SELECT id FROM gone)
                   UNION SELECT queue FROM crdbwork_session_parts WHERE session_id IN (SELECT id FROM gone))
      AND EXISTS (SELECT 1 FROM gone)
    RETURNING 1),
due AS (
    UPDATE crdbwork_reaps SET pruned_at = NULL
    WHERE name IN (SELECT queue FROM crdbwork_session_queues WHERE session_id IN (SELECT id FROM gone)
                   UNION SELECT queue FROM crdbwork_session_parts WHERE session_id IN (SELECT id FROM gone))
      AND EXISTS (SELECT 1 FROM gone)
    RETURNING 1),
deleted AS (DELETE FROM crdbwork_sessions WHERE id IN (SELECT id FROM gone) AND heartbeat_at + expiry < now() RETURNING 1)
SELECT EXISTS (SELECT 1 FROM turn), (SELECT count(*) FROM deleted)`

// SessionsReapTurn takes the turn to reap expired sessions when the last
// reap is at least every old (as ReapsTakeTurn), and if it took it,
// deletes the expired sessions (as SessionsReap), in one statement. It
// reports whether it took the turn and how many sessions it deleted.
func (s *Store) SessionsReapTurn(ctx context.Context, db DB, every time.Duration) (took bool, n int64, err error) {
	err = db.QueryRow(ctx, s.st.ReapSessionsTurn, every.Microseconds()).Scan(&took, &n)
	return took, n, err
}
