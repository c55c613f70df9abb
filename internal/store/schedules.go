package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// The Store methods of package schedule, run in the transaction of one
// schedule's turn. Each runs one statement, once, and returns the driver's
// error unwrapped (see sessions.go). The statements are those of
// scheduleStatements.

// SchedulesNow returns the database clock: the transaction's now(), which
// decides a schedule's current period, one clock for every process.
func (s *Store) SchedulesNow(ctx context.Context, db DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, s.sched.Now).Scan(&now)
	return now, err
}

// lastSQL is the text of scheduleStatements.Last
// (rendered by newScheduleStatements).
const lastSQL = `SELECT last_period FROM crdbwork_schedules WHERE queue = $1 AND name = $2 FOR UPDATE`

// SchedulesLast returns the last period enqueued by schedule name of queue,
// locking its row until the transaction ends, and whether there is one
// (false: the schedule never fired).
func (s *Store) SchedulesLast(ctx context.Context, db DB, queue, name string) (time.Time, bool, error) {
	var last time.Time
	err := db.QueryRow(ctx, s.sched.Last, queue, name).Scan(&last)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	return last, err == nil, err
}

// advanceSQL is the text of scheduleStatements.Advance
// (rendered by newScheduleStatements).
const advanceSQL = `INSERT INTO crdbwork_schedules AS s (queue, name, last_period) VALUES ($1, $2, $3)
ON CONFLICT (queue, name) DO UPDATE SET last_period = excluded.last_period, updated_at = now()
WHERE s.last_period < excluded.last_period
RETURNING s.last_period`

// SchedulesAdvance records period as the last period of schedule name of
// queue, and reports whether it did: it never moves a stored period
// backward, nor rewrites it with the same period (false).
func (s *Store) SchedulesAdvance(ctx context.Context, db DB, queue, name string, period time.Time) (bool, error) {
	var stored time.Time
	err := db.QueryRow(ctx, s.sched.Advance, queue, name, period).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// scheduleStatements are the statements of package schedule, rendered for
// one set of table names. The text is identical on CockroachDB and
// PostgreSQL; each statement reads or writes one row of crdbwork_schedules
// by its primary key (queue, name).
type scheduleStatements struct {
	// Now returns the transaction's timestamp, now(), which decides the
	// current period: one clock for every process.
	Now string
	// Last returns the last period (TIMESTAMPTZ) enqueued by schedule $2 of
	// queue $1, locking its row for the transaction (no row: the schedule
	// never fired).
	Last string
	// Advance records $3 (TIMESTAMPTZ) as the last period of schedule $2 of
	// queue $1: it inserts the row, or moves an existing row's last_period
	// forward, and returns a row only if it did (never backward: a period
	// at or before the stored one returns nothing). CockroachDB accepts the
	// WHERE of ON CONFLICT … DO UPDATE, and a table alias in INSERT
	// (https://www.cockroachlabs.com/docs/v22.1/insert: "any SET expression
	// supported by the UPDATE statement is also supported here, including
	// those with WHERE clauses"; table_alias_name); the alias keeps the
	// reference to the stored row valid when the table name is
	// schema-qualified.
	Advance string
}

// newScheduleStatements renders the schedule statements for t.
func newScheduleStatements(t Tables) *scheduleStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &scheduleStatements{
		Last:    r(lastSQL),
		Now:     `SELECT now()`,
		Advance: r(advanceSQL),
	}
}
