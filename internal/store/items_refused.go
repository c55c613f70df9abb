package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Rows the database refuses. A row written past the bounds of the schema's
// indexes (by raw SQL, by a version that allowed longer keys and tenants:
// see MaxKeyLength) may be accepted by one table and refused by the next
// one a move writes it into: a waiting item, whose table has no index on
// the tenant, released into the items table, which has one. The movers
// that work in batches isolate such a row (claim's Reap and dependency
// sweep) and end it with these statements: it goes to the dead items, with
// reason ReasonRefused and the database's error in its last error, and is
// recorded as ended (dead), so that its own dependents end too and nothing
// waits for it. The dead-items table has no index on the key or the
// tenant, so the move is accepted where the release was not.
//
// Both statements take one id: they run only for rows already found
// refused, one at a time. They have the shapes of the reaper's by-id moves
// (dead.go): the row locked by primary key, a DELETE … RETURNING, the
// inserts from it; the same text on both engines.

// IsRefusal reports whether err is the database refusing a statement for
// something about the rows it wrote, which the same statement without those
// rows would not meet: a data exception (SQLSTATE class 22), an integrity
// constraint (23), a program limit such as a row or index entry over its
// size (54), or an exception raised by a trigger or function (P0).
// Serialization failures, connection and server failures, and errors of
// the statement as a whole (a missing column, class 42) are not: the same
// rows would pass another time, or none would. Batched work isolates the
// rows such an error is about and goes on without them.
func IsRefusal(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54", "P0":
		return true
	}
	return false
}

// ReasonRefused is the reason of a dead item that the database refused to
// move (claim.ReasonRefused).
const ReasonRefused = "refused by the database"

type refusedStatements struct {
	// KillItem moves item $2 of queue $1 to the dead items with reason
	// ReasonRefused and last error $3 (followed by the item's own last
	// error), if no live claim holds it (unclaimed, or its lease ended),
	// records it as ended (dead) and returns its id.
	KillItem string // $1 queue, $2 id, $3 error → id
	// KillWaiting moves the waiting item $2 of queue $1 to the dead items
	// with reason ReasonRefused and last error $3, deletes its edges,
	// records it as ended (dead) and returns its id.
	KillWaiting string // $1 queue, $2 id, $3 error → id
	// CancelledIDs lists up to $2 of queue $1's cancel-requested items
	// that no live handler will end (the candidates of the cancel step of
	// the reaper, cancelStatements.reap), earliest request first. It locks
	// nothing.
	CancelledIDs string // $1 queue, $2 limit → id
	// ReapCancelledIDs is cancelStatements.reap for the given ids: the
	// same conditions, rechecked on the locked rows, the same rows
	// written. The request is tested inside IS TRUE, as in the cancel
	// statements on one item (items_cancel.go): a plain IS NOT NULL
	// proves the predicate of crdbwork_items_cancel_requested, which
	// PostgreSQL then read instead of looking the ids up by primary key.
	ReapCancelledIDs string // $1 queue, $2 ids → ids ended
	// PruneEndedCandidates lists up to $2 ids of queue $1's ended ids
	// past its dedup window, oldest first (the candidates of
	// dedupStatements.PruneEnded); PruneEndedIDs deletes those of the ids
	// $2 still past it. A DELETE is refused only by what a user adds to
	// the tables (a trigger, a foreign key that references them), but a
	// refused row must not stop the pruning of every later one.
	PruneEndedCandidates string // $1 queue, $2 limit → id
	PruneEndedIDs        string // $1 queue, $2 ids → rows deleted
	// PruneDeadCandidates lists up to $4 ids of queue $1's dead items that
	// died before $2 (NULL: $3 µs ago), oldest first (the candidates of
	// retentionStatements.PruneDeadOlder and PruneDeadBefore);
	// PruneDeadIDs deletes the deaths of the ids $2 of queue $1 that died
	// before $3 (NULL: $4 µs ago): every death of an id that old is past
	// the retention, so the key's death is not needed.
	PruneDeadCandidates string // $1 queue, $2 before or NULL, $3 age (µs), $4 limit → id
	PruneDeadIDs        string // $1 queue, $2 ids, $3 before or NULL, $4 age (µs) → rows deleted
}

func newRefusedStatements(t Tables) *refusedStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &refusedStatements{
		KillItem:             r(killItemSQL),
		KillWaiting:          r(killWaitingSQL),
		CancelledIDs:         r(cancelledIDsSQL),
		PruneEndedCandidates: r(pruneEndedCandidatesSQL),
		PruneEndedIDs:        r(pruneEndedIDsSQL),
		PruneDeadCandidates:  r(pruneDeadCandidatesSQL),
		PruneDeadIDs:         r(pruneDeadIDsSQL),
		ReapCancelledIDs:     r(reapCancelledIDsSQL),
	}
}

// refused returns the Store's refusedStatements, rendered on first use.
func (s *Store) refused() *refusedStatements { return s.lazyRefused() }

// killItemSQL is the text of refusedStatements.KillItem
// (rendered by newRefusedStatements).
var killItemSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id = $2 AND queue = $1 AND (claim IS NULL OR lease_until < now())
    FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM crdbwork_items AS i WHERE i.id IN (SELECT id FROM picked) AND (i.claim IS NULL OR i.lease_until < now())
    RETURNING i.id, i.queue, i.part, i.item_key, i.priority, i.attempts, i.max_attempts, i.payload, i.metadata, i.last_error,
              i.enqueued_at, i.claim_token, i.tenant, i.seq_order, i.kind, i.claimed_at, i.claim),
` + recordEnded(OutcomeDead, endedFromGone) + `
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason, ` + deadSeqColumns + `)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata,
       $3::TEXT || COALESCE('; its last error: ' || last_error, ''), enqueued_at, claim_token, tenant, '` + ReasonRefused + `', ` + deadSeqValues + `
FROM gone
RETURNING id`

// ItemsKillRefused moves item id of queue to the dead items with reason
// ReasonRefused and lastError, unless a live claim holds it, and reports
// whether it did (refusedStatements.KillItem).
func (s *Store) ItemsKillRefused(ctx context.Context, tx pgx.Tx, queue string, id uuid.UUID, lastError string) (bool, error) {
	ids, err := queryIDs(ctx, tx, s.refused().KillItem, queue, [16]byte(id), lastError)
	return len(ids) > 0, err
}

// killWaitingSQL is the text of refusedStatements.KillWaiting
// (rendered by newRefusedStatements).
var killWaitingSQL = `WITH gone AS (
    DELETE FROM crdbwork_waiting AS w WHERE w.id = $2 AND (w.queue = $1) IS TRUE
    RETURNING w.id, w.queue, w.hash, w.item_key, w.priority, w.max_attempts, w.payload, w.metadata, w.enqueued_at, w.tenant, w.kind),
edges AS (
    DELETE FROM crdbwork_waits_for WHERE queue = $1 AND dependent = $2
    RETURNING prereq),
` + recordEnded(OutcomeDead, endedFromWaiting) + `
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, tenant, reason, kind)
SELECT g.id, g.queue, g.hash % n.parts, g.item_key, g.priority, 0, g.max_attempts, g.payload, g.metadata, $3::TEXT,
       g.enqueued_at, g.tenant, '` + ReasonRefused + `', g.kind
FROM gone AS g,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1) AS parts) AS n
RETURNING id`

// ItemsKillRefusedWaiting moves the waiting item id of queue to the dead items
// with reason ReasonRefused and lastError, deleting its edges, and reports
// whether it did (refusedStatements.KillWaiting).
func (s *Store) ItemsKillRefusedWaiting(ctx context.Context, tx pgx.Tx, queue string, id uuid.UUID, lastError string) (bool, error) {
	ids, err := queryIDs(ctx, tx, s.refused().KillWaiting, queue, [16]byte(id), lastError)
	return len(ids) > 0, err
}

// cancelledIDsSQL is the text of refusedStatements.CancelledIDs
// (rendered by newRefusedStatements).
const cancelledIDsSQL = `SELECT id FROM crdbwork_items
WHERE queue = $1 AND cancel_requested_at IS NOT NULL AND (claim IS NULL OR lease_until < now())
ORDER BY cancel_requested_at
LIMIT $2`

// ItemsReapCancelledCandidates lists up to limit candidates of ReapCancelled
// (refusedStatements.CancelledIDs).
func (s *Store) ItemsReapCancelledCandidates(ctx context.Context, db DB, queue string, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.refused().CancelledIDs, queue, limit)
}

// reapCancelledIDsSQL is the text of refusedStatements.ReapCancelledIDs
// (rendered by newRefusedStatements).
var reapCancelledIDsSQL = `WITH picked AS MATERIALIZED (
    SELECT id FROM crdbwork_items
    WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1 AND (cancel_requested_at IS NOT NULL) IS TRUE AND (claim IS NULL OR lease_until < now())
    FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM crdbwork_items AS i
    WHERE i.id IN (SELECT id FROM picked) AND (i.cancel_requested_at IS NOT NULL) IS TRUE AND (i.claim IS NULL OR i.lease_until < now())
    ` + cancelledGone + `),
` + fromRow + `,
` + cancelHolds + `
SELECT id FROM gone`

// ItemsReapCancelledIDs is ReapCancelled for the given candidates
// (refusedStatements.ReapCancelledIDs).
func (s *Store) ItemsReapCancelledIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID) (int64, error) {
	got, err := queryIDs(ctx, tx, s.refused().ReapCancelledIDs, queue, rawIDs(ids))
	return int64(len(got)), err
}

// pruneEndedCandidatesSQL is the text of refusedStatements.PruneEndedCandidates
// (rendered by newRefusedStatements).
const pruneEndedCandidatesSQL = `SELECT id FROM crdbwork_ended
WHERE queue = $1 AND ended_at < now() - ` + keepWindow + `
ORDER BY ended_at
LIMIT $2`

// EndedPruneCandidates lists up to limit candidates of PruneEnded
// (refusedStatements.PruneEndedCandidates).
func (s *Store) EndedPruneCandidates(ctx context.Context, db DB, queue string, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.refused().PruneEndedCandidates, queue, limit)
}

// pruneEndedIDsSQL is the text of refusedStatements.PruneEndedIDs
// (rendered by newRefusedStatements).
const pruneEndedIDsSQL = `DELETE FROM crdbwork_ended
WHERE queue = $1 AND id = ANY($2::UUID[]) AND ended_at < now() - ` + keepWindow

// EndedPruneIDs is PruneEnded for the given candidates
// (refusedStatements.PruneEndedIDs).
func (s *Store) EndedPruneIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID) (int64, error) {
	tag, err := tx.Exec(ctx, s.refused().PruneEndedIDs, queue, rawIDs(ids))
	return tag.RowsAffected(), err
}

// pruneDeadCandidatesSQL is the text of refusedStatements.PruneDeadCandidates
// (rendered by newRefusedStatements).
const pruneDeadCandidatesSQL = `SELECT id FROM crdbwork_dead_items
WHERE queue = $1 AND died_at < COALESCE($2::TIMESTAMPTZ, now() - $3::BIGINT * INTERVAL '1 microsecond')
ORDER BY died_at
LIMIT $4`

// DeadPruneCandidates lists up to limit candidates of PruneDeadBefore
// (before) or, with before zero, of PruneDeadOlder (age)
// (refusedStatements.PruneDeadCandidates).
func (s *Store) DeadPruneCandidates(ctx context.Context, db DB, queue string, before time.Time, age time.Duration, limit int) ([]uuid.UUID, error) {
	return queryIDs(ctx, db, s.refused().PruneDeadCandidates, queue, nullTime(before), age.Microseconds(), limit)
}

// pruneDeadIDsSQL is the text of refusedStatements.PruneDeadIDs
// (rendered by newRefusedStatements).
const pruneDeadIDsSQL = `DELETE FROM crdbwork_dead_items
WHERE id = ANY($2::UUID[]) AND queue = $1 AND died_at < COALESCE($3::TIMESTAMPTZ, now() - $4::BIGINT * INTERVAL '1 microsecond')`

// DeadPruneIDs is PruneDeadBefore (before) or, with before zero,
// PruneDeadOlder (age) for the given candidates
// (refusedStatements.PruneDeadIDs).
func (s *Store) DeadPruneIDs(ctx context.Context, tx pgx.Tx, queue string, ids []uuid.UUID, before time.Time, age time.Duration) (int64, error) {
	tag, err := tx.Exec(ctx, s.refused().PruneDeadIDs, queue, rawIDs(ids), nullTime(before), age.Microseconds())
	return tag.RowsAffected(), err
}

// nullTime is t, or NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
