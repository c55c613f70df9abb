package sql

// IdleInTransactionTimeout reads the connection's
// idle_in_transaction_session_timeout: how long the server lets a
// transaction wait for its client before it ends the transaction and the
// connection ("0": never). PostgreSQL answers in its own units ("1500ms",
// "5s", "0"); package worker reads it once per Run to warn when a frozen
// process's open transaction could hold its locks for ever (see
// session.ConfigurePool). It reads no table. CockroachDB has the session
// variable and the current_setting builtin (docs checked: "Session
// Variables" and "Functions and Operators", System info functions).
const IdleInTransactionTimeout = `SELECT current_setting('idle_in_transaction_session_timeout')`
