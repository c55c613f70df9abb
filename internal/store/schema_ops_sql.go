package store

import "github.com/jackc/pgx/v5"

// testStatements are the statements of the test helpers in package
// worker/workertest: a schema made for one test and dropped with everything
// in it, and the read of a queue's items that RequireEnqueued matches.
// Rendered for one set of table names. Not for production code paths.
//
// CockroachDB: user-defined schemas, CREATE SCHEMA and DROP SCHEMA ...
// CASCADE ("Drop all tables and views in the schema as well as all objects
// ... that depend on those tables") are documented for v20.2 and later
// (docs checked: https://www.cockroachlabs.com/docs/stable/drop-schema and
// create-schema). Items reads two parenthesized selections joined by
// UNION ALL, each with its own ORDER BY and LIMIT, which CockroachDB
// accepts as operands of a set operation (docs checked: "Selection
// Queries"). Not run on a cluster here (no CockroachDB binary).
// PostgreSQL checked: the plans are in internal/store/explain_test.go (each branch
// reads its queue's rows through a partial index, never the whole table).
type testStatements struct {
	// CreateSchema creates Tables.Schema, failing if it exists, so that
	// the caller knows the schema, and whatever DropSchema removes, is its
	// own. Empty when Tables.Schema is empty.
	CreateSchema string
	// DropSchema drops Tables.Schema with everything in it (CASCADE), if
	// it exists. Empty when Tables.Schema is empty.
	DropSchema string
	// Items lists queue $1's items, claimed or not: the unclaimed ones in
	// claim order (priority, turn, id) through crdbwork_items_turn_next,
	// then the claimed ones by lease end through crdbwork_items_lease, at
	// most $2 of each. The rows of the two branches are not ordered
	// against each other: the caller sorts them. Columns: id, queue, part,
	// item_key, priority, attempts, max_attempts, payload, metadata,
	// enqueued_at, vesting_at, last_error, claim, claim_token,
	// lease_until, claim_part, tenant, expires_at, at_most_once, turn_at,
	// claimed (true in the second branch).
	Items string // $1 queue, $2 limit per branch → item columns, claimed
	// DropQueue deletes every row of queue $1, in order: its items, dead
	// items, ended ids, part owners, memberships, and its row in the queues
	// table (workertest's cleanup of a fresh queue). Not in the EXPLAIN
	// test: a test's cleanup may read a table whole.
	DropQueue []string // each: $1 queue
}

// newTestStatements renders the statements for t.
func newTestStatements(t Tables) *testStatements {
	st := &testStatements{}
	if t.Schema != "" {
		schema := pgx.Identifier{t.Schema}.Sanitize()
		st.CreateSchema = "CREATE SCHEMA " + schema
		st.DropSchema = "DROP SCHEMA IF EXISTS " + schema + " CASCADE"
	}
	const cols = `id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, enqueued_at, vesting_at,
    last_error, claim, claim_token, lease_until, claim_part, tenant, expires_at, at_most_once, turn_at`
	st.Items = rewrite(t, `(SELECT `+cols+`, false AS claimed FROM crdbwork_items
    WHERE queue = $1 AND claim IS NULL
    ORDER BY priority, turn_at, id LIMIT $2)
UNION ALL
(SELECT `+cols+`, true AS claimed FROM crdbwork_items
    WHERE queue = $1 AND claim IS NOT NULL
    ORDER BY lease_until, id LIMIT $2)`)
	for _, table := range []string{"items", "dead_items", "ended", "session_parts", "session_queues"} {
		st.DropQueue = append(st.DropQueue, `DELETE FROM `+t.Table(table)+` WHERE queue = $1`)
	}
	st.DropQueue = append(st.DropQueue, `DELETE FROM `+t.Table("queues")+` WHERE name = $1`)
	return st
}
