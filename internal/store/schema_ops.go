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

// CreateTestSchema creates the Store's schema (Tables.Schema), failing if
// it exists, so that the caller knows the schema, and what DropTestSchema
// removes, is its own. It fails when Tables.Schema is empty.
func (s *Store) CreateTestSchema(ctx context.Context, db DB) error {
	if s.test.CreateSchema == "" {
		return errNoSchema
	}
	_, err := db.Exec(ctx, s.test.CreateSchema)
	return err
}

// DropTestSchema drops the Store's schema (Tables.Schema) with everything
// in it, if it exists (DROP SCHEMA ... CASCADE, which CockroachDB has since
// v20.2: see testStatements). It fails when Tables.Schema is empty. Its error
// wraps the driver's and gives the statement to run by hand.
func (s *Store) DropTestSchema(ctx context.Context, db DB) error {
	if s.test.DropSchema == "" {
		return errNoSchema
	}
	if _, err := db.Exec(ctx, s.test.DropSchema); err != nil {
		return fmt.Errorf("crdbwork: dropping schema %s: %w (drop it by hand: %s)", s.t.Schema, err, s.test.DropSchema)
	}
	return nil
}

// DropQueueRows deletes every row of queue, one table at a time: its
// items, dead items, ended ids, part owners, memberships, and its row in
// the queues table. It runs every statement, whatever the earlier ones
// did, and returns their errors joined (nil if none failed). It reads the
// tables as it pleases (no plan test covers it): it is a test's cleanup.
func (s *Store) DropQueueRows(ctx context.Context, db DB, queue string) error {
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

// QueueItems returns queue's items, claimed or not: at most limit
// unclaimed ones in claim order and at most limit claimed ones by lease
// end (so up to 2·limit rows), the two groups in no set order against
// each other: the caller sorts them.
func (s *Store) QueueItems(ctx context.Context, db DB, queue string, limit int) ([]QueueItemRow, error) {
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
