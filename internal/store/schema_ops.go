package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The Store methods of the test helpers (package worker/workertest): a
// schema made for one test, the cleanup of a test's queue, and the read of
// a queue's items. Not for production code paths. The statements are those
// of testStatements; except for DropQueueRows, each runs one statement,
// once, and returns the driver's error unwrapped (see sessions.go).

// errNoSchema is the error of the schema methods on a Store whose Tables
// name no schema.
var errNoSchema = errors.New("crdbwork: the tables name no schema (Tables.Schema is empty)")

// SchemaCreate creates the Store's schema (Tables.Schema), failing if
// it exists, so that the caller knows the schema, and what DropTestSchema
// removes, is its own. It fails when Tables.Schema is empty.
func (s *Store) SchemaCreate(ctx context.Context, db DB) error {
	if s.test.CreateSchema == "" {
		return errNoSchema
	}
	_, err := db.Exec(ctx, s.test.CreateSchema)
	return err
}

// SchemaDrop drops the Store's schema (Tables.Schema) with everything
// in it, if it exists (DROP SCHEMA ... CASCADE, which CockroachDB has since
// v20.2: see testStatements). It fails when Tables.Schema is empty. Its error
// wraps the driver's and gives the statement to run by hand.
func (s *Store) SchemaDrop(ctx context.Context, db DB) error {
	if s.test.DropSchema == "" {
		return errNoSchema
	}
	if _, err := db.Exec(ctx, s.test.DropSchema); err != nil {
		return fmt.Errorf("crdbwork: dropping schema %s: %w (drop it by hand: %s)", s.t.Schema, err, s.test.DropSchema)
	}
	return nil
}

// SchemaDropQueueRows deletes every row of queue, one table at a time: its
// items, dead items, ended ids, part owners, memberships, and its row in
// the queues table. It runs every statement, whatever the earlier ones
// did, and returns their errors joined (nil if none failed). It reads the
// tables as it pleases (no plan test covers it): it is a test's cleanup.
func (s *Store) SchemaDropQueueRows(ctx context.Context, db DB, queue string) error {
	var errs []error
	for _, stmt := range s.test.DropQueue {
		if _, err := db.Exec(ctx, stmt, queue); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// QueueItemRow is one item of a queue, as QueueItems reads it. Nullable
// columns are pointers.
type QueueItemRow struct {
	ID          uuid.UUID
	Queue       string
	Part        int
	Key         *string
	Priority    int
	Attempts    int
	MaxAttempts int
	Payload     []byte
	Metadata    []byte
	EnqueuedAt  time.Time
	VestingAt   time.Time
	LastError   *string
	// Claim is the session holding the item (nil: unclaimed); Token its
	// claim token; LeaseUntil the end of its lease; ClaimPart the part its
	// claim names (nil: an any-part claim, or unclaimed).
	Claim      *uuid.UUID
	Token      int64
	LeaseUntil *time.Time
	ClaimPart  *int64
	Tenant     *string
	ExpiresAt  *time.Time
	AtMostOnce bool
	TurnAt     time.Time
	// Claimed tells which of the read's two branches returned the row:
	// the claimed items (true) or the unclaimed ones.
	Claimed bool
}

// SchemaQueueItems returns queue's items, claimed or not: at most limit
// unclaimed ones in claim order and at most limit claimed ones by lease
// end (so up to 2·limit rows), the two groups in no set order against
// each other: the caller sorts them.
func (s *Store) SchemaQueueItems(ctx context.Context, db DB, queue string, limit int) ([]QueueItemRow, error) {
	if limit < 0 {
		return nil, fmt.Errorf("crdbwork: reading the items of %q: negative limit %d", queue, limit)
	}
	rows, err := db.Query(ctx, s.test.Items, queue, int64(limit))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueItemRow, error) {
		var it QueueItemRow
		var part, prio, attempts, maxAttempts int64
		err := row.Scan(&it.ID, &it.Queue, &part, &it.Key, &prio, &attempts, &maxAttempts,
			&it.Payload, &it.Metadata, &it.EnqueuedAt, &it.VestingAt, &it.LastError, &it.Claim, &it.Token, &it.LeaseUntil,
			&it.ClaimPart, &it.Tenant, &it.ExpiresAt, &it.AtMostOnce, &it.TurnAt, &it.Claimed)
		it.Part, it.Priority, it.Attempts, it.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
		return it, err
	})
}

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
