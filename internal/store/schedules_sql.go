package store

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
