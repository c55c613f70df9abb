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

// NeverFired is the last_period of a schedule row written before its first
// period was enqueued (a stored schedule just added): the column is NOT
// NULL for the code of versions 3 to 5, which reads it. No period of a
// schedule starts at it (it is in the past of every schedule's first run).
var NeverFired = time.Unix(0, 0).UTC()

// ScheduleRow is one row of crdbwork_schedules as SchedulesRow and
// SchedulesList return it.
type ScheduleRow struct {
	Queue, Name string
	// LastPeriod is the last period enqueued (NeverFired: none yet).
	LastPeriod time.Time
	// Spec is the stored schedule's definition (JSON, package schedule's
	// format), nil for a schedule defined in code.
	Spec []byte
	// Paused: no runner of version 6 enqueues its periods.
	Paused bool
	// UpdatedAt is when the row last changed (a period, the spec, a pause).
	UpdatedAt time.Time
}

// schedulesRowSQL is the text of scheduleStatements.Row
// (rendered by newScheduleStatements).
const schedulesRowSQL = `SELECT last_period, spec, paused FROM crdbwork_schedules WHERE queue = $1 AND name = $2 FOR UPDATE`

// SchedulesRow returns the row of schedule name of queue (its last period,
// its stored spec, whether it is paused), locking it until the transaction
// ends, and whether there is one.
func (s *Store) SchedulesRow(ctx context.Context, db DB, queue, name string) (ScheduleRow, bool, error) {
	r := ScheduleRow{Queue: queue, Name: name}
	err := db.QueryRow(ctx, s.sched.Row, queue, name).Scan(&r.LastPeriod, &r.Spec, &r.Paused)
	if errors.Is(err, pgx.ErrNoRows) {
		return ScheduleRow{}, false, nil
	}
	return r, err == nil, err
}

// schedulesStoredSQL is the text of scheduleStatements.Stored
// (rendered by newScheduleStatements).
const schedulesStoredSQL = `SELECT name, spec, paused FROM crdbwork_schedules WHERE queue = $1 AND spec IS NOT NULL ORDER BY name`

// SchedulesStored returns the stored schedules of queue (name, spec,
// paused), by name: what a runner reloads.
func (s *Store) SchedulesStored(ctx context.Context, db DB, queue string) ([]ScheduleRow, error) {
	rows, err := db.Query(ctx, s.sched.Stored, queue)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScheduleRow, error) {
		r := ScheduleRow{Queue: queue}
		err := row.Scan(&r.Name, &r.Spec, &r.Paused)
		return r, err
	})
}

// schedulesListSQL is the text of scheduleStatements.List
// (rendered by newScheduleStatements).
const schedulesListSQL = `SELECT queue, name, last_period, spec, paused, updated_at FROM crdbwork_schedules
WHERE $1::TEXT = '' OR queue = $1 ORDER BY queue, name LIMIT $2`

// SchedulesList returns the schedules of queue ("": of every queue), stored
// or defined in code (a code-defined schedule has a row once it fired), by
// queue and name, at most limit.
func (s *Store) SchedulesList(ctx context.Context, db DB, queue string, limit int) ([]ScheduleRow, error) {
	rows, err := db.Query(ctx, s.sched.List, queue, int64(limit))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ScheduleRow, error) {
		var r ScheduleRow
		err := row.Scan(&r.Queue, &r.Name, &r.LastPeriod, &r.Spec, &r.Paused, &r.UpdatedAt)
		return r, err
	})
}

// schedulesPutSQL is the text of scheduleStatements.Put
// (rendered by newScheduleStatements).
const schedulesPutSQL = `INSERT INTO crdbwork_schedules AS s (queue, name, last_period, spec) VALUES ($1, $2, $3, $4::JSONB)
ON CONFLICT (queue, name) DO UPDATE SET spec = excluded.spec, updated_at = now()`

// SchedulesPut stores the spec of schedule name of queue: it adds the row
// (never fired, not paused) or replaces the spec of an existing one,
// keeping its last period and its pause.
func (s *Store) SchedulesPut(ctx context.Context, db DB, queue, name string, spec []byte) error {
	_, err := db.Exec(ctx, s.sched.Put, queue, name, NeverFired, string(spec))
	return err
}

// schedulesDeleteSQL is the text of scheduleStatements.Delete
// (rendered by newScheduleStatements).
const schedulesDeleteSQL = `DELETE FROM crdbwork_schedules WHERE queue = $1 AND name = $2 AND spec IS NOT NULL`

// SchedulesDelete deletes the stored schedule name of queue and reports
// whether there was one (a code-defined schedule's row is left alone).
func (s *Store) SchedulesDelete(ctx context.Context, db DB, queue, name string) (bool, error) {
	tag, err := db.Exec(ctx, s.sched.Delete, queue, name)
	return tag.RowsAffected() == 1, err
}

// schedulesPauseSQL is the text of scheduleStatements.Pause
// (rendered by newScheduleStatements).
const schedulesPauseSQL = `UPDATE crdbwork_schedules SET paused = $3, updated_at = now() WHERE queue = $1 AND name = $2`

// SchedulesPause pauses (or resumes) schedule name of queue, stored or
// defined in code, and reports whether it has a row.
func (s *Store) SchedulesPause(ctx context.Context, db DB, queue, name string, paused bool) (bool, error) {
	tag, err := db.Exec(ctx, s.sched.Pause, queue, name, paused)
	return tag.RowsAffected() == 1, err
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
	// Row returns the last period, the spec (JSONB, NULL for a schedule
	// defined in code) and the pause of schedule $2 of queue $1, locking
	// its row for the transaction: what a version-6 runner's turn reads
	// instead of Last.
	Row string
	// Stored returns name, spec and pause of queue $1's stored schedules
	// (spec not NULL), by name: a range of the primary key.
	Stored string
	// List returns every schedule row of queue $1 ('' for every queue), by
	// queue and name, at most $2.
	List string
	// Put adds stored schedule $2 of queue $1 with spec $4, its last
	// period $3 (NeverFired), or replaces the spec of the existing row.
	Put string
	// Delete deletes stored schedule $2 of queue $1 (not a code-defined
	// one's row).
	Delete string
	// Pause sets the pause of schedule $2 of queue $1 to $3.
	Pause string
}

// newScheduleStatements renders the schedule statements for t.
func newScheduleStatements(t Tables) *scheduleStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &scheduleStatements{
		Last:    r(lastSQL),
		Now:     `SELECT now()`,
		Advance: r(advanceSQL),
		Row:     r(schedulesRowSQL),
		Stored:  r(schedulesStoredSQL),
		List:    r(schedulesListSQL),
		Put:     r(schedulesPutSQL),
		Delete:  r(schedulesDeleteSQL),
		Pause:   r(schedulesPauseSQL),
	}
}
