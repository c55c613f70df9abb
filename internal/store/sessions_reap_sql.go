package store

// IdleInTransactionTimeout reads the connection's
// idle_in_transaction_session_timeout: how long the server lets a
// transaction wait for its client before it ends the transaction and the
// connection ("0": never). PostgreSQL answers in its own units ("1500ms",
// "5s", "0"); package worker reads it once per Run to warn when a frozen
// process's open transaction could hold its locks for ever (see
// session.ConfigurePool). It reads no table. CockroachDB has the session
// variable since v20.2 (cockroach#52938) and the current_setting builtin
// (its "Functions and Operators", system info functions); it shows
// durations in its own format, which session.ParseSetting also reads
// (milliseconds, units, or an interval "HH:MM:SS").
const IdleInTransactionTimeout = `SELECT current_setting('idle_in_transaction_session_timeout')`

// reapStatements delete expired sessions one at a time: the fallback of a
// reap of every expired session (coreStatements.ReapSessions) that could not
// finish because one expired session's rows are locked (by a transaction
// its frozen process left open), so that the other expired sessions are
// still deleted. Both are plain on CockroachDB and PostgreSQL.
type reapStatements struct {
	// ExpiredSessions returns the ids of the expired sessions (heartbeat_at
	// + expiry < now(), as ReapSessions). It reads the sessions table,
	// whose size is the fleet's, as ReapSessions does.
	ExpiredSessions string
	// ReapSession deletes session $1 if it is still expired → rows
	// affected (0: it heartbeat meanwhile, or is gone). It finds the row by
	// primary key; the expiry is checked again so that a session that came
	// back since the list was read is never deleted.
	ReapSession string
}

// newReapStatements renders the reapStatements for t.
func newReapStatements(t Tables) *reapStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &reapStatements{
		ExpiredSessions: r(expiredSessionsSQL),
		ReapSession:     r(reapSessionSQL),
	}
}
