package store

import (
	"context"
	"time"
)

// The Store methods of the reap turns (crdbwork_reaps, schema version 6):
// a session takes a turn before it reaps, so that a fleet reaps each queue,
// and the expired sessions, about once per interval instead of once per
// session. See package worker's maintenance loop.

// takeReapTurnSQL is the text of coreStatements.TakeReapTurn (rendered by
// newCoreStatements). The upsert writes only when the row is missing or the
// last reap is at least the interval old: otherwise it locks the row for
// the statement (PostgreSQL) and returns no row. A turn taken by a session
// that dies before it reaps costs one interval.
const takeReapTurnSQL = `INSERT INTO crdbwork_reaps AS r (name, reaped_at) VALUES ($1, now())
ON CONFLICT (name) DO UPDATE SET reaped_at = excluded.reaped_at
WHERE r.reaped_at <= now() - $2::BIGINT * INTERVAL '1 microsecond'
RETURNING 1`

// queueReapDueSQL is the text of coreStatements.QueueReapDue: whether a
// reap of queue $1 would find anything of its item steps to do (expired
// leases, exhausted items, items past their deadline, cancels asked for,
// dependencies), one seek in the index each step reads itself. Each test is
// a superset of its step's condition, so that a false here means the steps
// find nothing; the prunes (ended ids, kept cancelled items, dead items)
// are not in it: they have their own, slower, schedule.
const queueReapDueSQL = `SELECT
 EXISTS (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL AND lease_until < now())
 OR EXISTS (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND attempts >= max_attempts)
 OR EXISTS (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND expires_at IS NOT NULL AND expires_at <= now())
 OR EXISTS (SELECT 1 FROM crdbwork_items WHERE queue = $1 AND cancel_requested_at IS NOT NULL)
 OR EXISTS (SELECT 1 FROM crdbwork_waits_for WHERE queue = $1)
 OR EXISTS (SELECT 1 FROM crdbwork_waiting WHERE queue = $1)`

// takeQueueReapTurnSQL is the text of coreStatements.TakeQueueReapTurn:
// takeReapTurnSQL for queue $1 in a CTE, with queueReapDueSQL's answer.
const takeQueueReapTurnSQL = `WITH turn AS (` + takeReapTurnSQL + `)
SELECT EXISTS (SELECT 1 FROM turn), (` + queueReapDueSQL + `)`

// ReapsTakeTurn takes the reap turn called name (the empty string: the reap
// of expired sessions) when the last reap of that name is at least every
// old, by the database clock, and reports whether it took it.
func (s *Store) ReapsTakeTurn(ctx context.Context, db DB, name string, every time.Duration) (bool, error) {
	rows, err := db.Query(ctx, s.st.TakeReapTurn, name, every.Microseconds())
	if err != nil {
		return false, err
	}
	defer rows.Close()
	took := rows.Next()
	rows.Close()
	return took, rows.Err()
}

// ReapsTakeQueueTurn takes queue's reap turn when its last reap is at least
// every old (as ReapsTakeTurn), and reports whether it took it and whether
// the queue's item steps have anything to do (queueReapDueSQL), in one
// statement.
func (s *Store) ReapsTakeQueueTurn(ctx context.Context, db DB, queue string, every time.Duration) (took, due bool, err error) {
	err = db.QueryRow(ctx, s.st.TakeQueueReapTurn, queue, every.Microseconds()).Scan(&took, &due)
	return took, due, err
}
