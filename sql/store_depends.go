package sql

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The statements of dependencies (depends.go): the enqueue of waiting
// items and their edges, the release of dependents by an ack, the
// reaper's sweep, and the operators' reads.

// PrereqState is what Classify found about one id of a queue.
type PrereqState struct {
	ID uuid.UUID
	// State is PrereqQueued, PrereqWaiting, PrereqOther, PrereqUnknown, or
	// the outcome the id ended with (OutcomeAcked, OutcomeDead,
	// OutcomeCancelled, OutcomeTaken).
	State string
	// Queue is the other queue, for PrereqOther.
	Queue string
}

// Classify reports, for each of ids, where it is in queue: an item, a
// waiting item, an item of another queue, ended (and how), or nowhere
// (dependsStatements.Classify). One row per id, in the order of ids.
func (s *Store) Classify(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]PrereqState, error) {
	rows, err := db.Query(ctx, s.deps().Classify, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	out := make([]PrereqState, 0, len(ids))
	var id [16]byte
	var itemQueue, waitQueue, outcome *string
	var dead bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &itemQueue, &waitQueue, &outcome, &dead}, func() error {
		st := PrereqState{ID: id}
		switch {
		case itemQueue != nil && *itemQueue == queue:
			st.State = PrereqQueued
		case waitQueue != nil && *waitQueue == queue:
			st.State = PrereqWaiting
		case itemQueue != nil:
			st.State, st.Queue = PrereqOther, *itemQueue
		case waitQueue != nil:
			st.State, st.Queue = PrereqOther, *waitQueue
		case outcome != nil:
			st.State = *outcome
		case dead:
			st.State = OutcomeDead
		default:
			st.State = PrereqUnknown
		}
		out = append(out, st)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// WaitingRow is one waiting item for InsertWaiting.
type WaitingRow struct {
	EnqueueRow
	// Remaining is the number of its prerequisites not yet acked (at
	// least 1).
	Remaining int
}

// InsertWaiting adds rows to queue's waiting items, skipping ids that are
// items, waiting items, or ended in queue within its dedup window, and
// returns the ids it added (dependsStatements.InsertWaiting). A row keeps
// its Headers and, with a key in a sequenced queue, its Order, which its
// move into the items table carries over.
func (s *Store) InsertWaiting(ctx context.Context, db DB, queue string, rows []WaitingRow) ([]uuid.UUID, error) {
	n := len(rows)
	ids := make([][16]byte, n)
	hashes, priorities, delays, maxAttempts, ttls, remaining := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	keys, tenants := make([]*string, n), make([]*string, n)
	payloads, metadata := make([][]byte, n), make([][]byte, n)
	amo := make([]bool, n)
	headers, orders := make([]*string, n), make([]int64, n)
	for j := range rows {
		r := &rows[j]
		ids[j], hashes[j], priorities[j] = r.ID, r.Hash, int64(r.Priority)
		delays[j], maxAttempts[j], ttls[j] = r.Delay.Microseconds(), int64(r.MaxAttempts), r.TTL.Microseconds()
		remaining[j], amo[j], orders[j] = int64(r.Remaining), r.AtMostOnce, r.Order
		if r.Headers != nil {
			h := string(r.Headers)
			headers[j] = &h
		}
		if r.Key != "" {
			keys[j] = &r.Key
		}
		if r.Tenant != "" {
			tenants[j] = &r.Tenant
		}
		payloads[j], metadata[j] = orEmpty(r.Payload), r.Metadata
	}
	res, err := db.Query(ctx, s.deps().InsertWaiting, queue, ids, hashes, keys, priorities, delays, maxAttempts,
		payloads, metadata, tenants, ttls, amo, remaining, headers, orders)
	if err != nil {
		return nil, err
	}
	return collectIDs(res)
}

// WaitedFor returns those of ids, items of queue that ended, that other
// items wait for (dependsStatements.WaitedFor): the at-most-once items'
// acks, which delete nothing, ask it to release their dependents.
func (s *Store) WaitedFor(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.deps().WaitedFor, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// InsertEdges records that dependents[i] waits for prereqs[i], in queue
// (dependsStatements.InsertEdges).
func (s *Store) InsertEdges(ctx context.Context, db DB, queue string, prereqs, dependents []uuid.UUID) error {
	_, err := db.Exec(ctx, s.deps().InsertEdges, queue, rawIDs(prereqs), rawIDs(dependents))
	return err
}

// ReleaseDependents deletes, in tx, the edges of queue from the acked
// items prereqs, lowers their dependents' remaining counts, then moves the
// dependents whose count reached zero into the items table
// (dependsStatements.Release and MoveReady, or their PostgreSQL twins) and
// returns the ids it moved. Run it once the acks of prereqs committed: in
// a transaction of its own (READ COMMITTED on PostgreSQL, so that the
// releases of a fan-in queue on the join's row rather than fail each
// other), or in the reaper's that found them acked.
func (s *Store) ReleaseDependents(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, byDialect(d, s.deps().Release, s.deps().PostgresRelease), queue, rawIDs(prereqs))
	if err != nil {
		return nil, err
	}
	var ready []uuid.UUID
	var id [16]byte
	var remaining int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &remaining}, func() error {
		if remaining <= 0 {
			ready = append(ready, id)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if len(ready) == 0 {
		return nil, nil
	}
	moved, err := tx.Query(ctx, byDialect(d, s.deps().MoveReady, s.deps().PostgresMoveReady), queue, rawIDs(ready))
	if err != nil {
		return nil, err
	}
	return collectIDs(moved)
}

// SweepPrereqs returns the prerequisites of the next limit edges of queue
// after prerequisite after, in order (repeated for each of their
// dependents; dependsStatements.SweepPrereqs).
func (s *Store) SweepPrereqs(ctx context.Context, db DB, queue string, after uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.deps().SweepPrereqs, queue, [16]byte(after), limit)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// KillDependents ends, in tx, the waiting dependents of the prerequisites
// prereqs of queue (which ended without an ack: outcomes[i] says how
// prereqs[i] ended): they move to the dead items with reason "dependency
// died: <prerequisite>" and are recorded as ended (dead); the edges from
// prereqs and those to the ended dependents are deleted. It returns the
// ids of the dependents it ended (dependsStatements.KillDependents,
// DeleteEdgesFrom, DeleteEdgesTo).
func (s *Store) KillDependents(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, outcomes []string) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, byDialect(d, s.deps().KillDependents, s.deps().PostgresKillDependents), queue, rawIDs(prereqs), outcomes)
	if err != nil {
		return nil, err
	}
	killed, err := collectIDs(rows)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, s.deps().DeleteEdgesFrom, queue, rawIDs(prereqs)); err != nil {
		return nil, err
	}
	if len(killed) > 0 {
		if _, err := tx.Exec(ctx, s.deps().DeleteEdgesTo, queue, rawIDs(killed)); err != nil {
			return nil, err
		}
	}
	return killed, nil
}

// Prereqs returns the prerequisites that dependent still waits for in
// queue (dependsStatements.Prereqs).
func (s *Store) Prereqs(ctx context.Context, db DB, queue string, dependent uuid.UUID) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.deps().Prereqs, queue, [16]byte(dependent))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// Dependents returns up to limit of the items of queue that wait for
// prereq (dependsStatements.Dependents).
func (s *Store) Dependents(ctx context.Context, db DB, queue string, prereq uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.deps().Dependents, queue, [16]byte(prereq), limit)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// Waiting reports whether id is a waiting item of queue, with its count of
// prerequisites not yet acked and its enqueue time
// (dependsStatements.Waiting).
func (s *Store) Waiting(ctx context.Context, db DB, queue string, id uuid.UUID) (waiting bool, remaining int64, enqueuedAt time.Time, err error) {
	err = db.QueryRow(ctx, s.deps().Waiting, queue, [16]byte(id)).Scan(&remaining, &enqueuedAt)
	if err == pgx.ErrNoRows {
		return false, 0, time.Time{}, nil
	}
	return err == nil, remaining, enqueuedAt, err
}

// WaitingCount returns the number of waiting items of queue
// (dependsStatements.WaitingCount).
func (s *Store) WaitingCount(ctx context.Context, db DB, queue string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.deps().WaitingCount, queue).Scan(&n)
	return n, err
}

// HasEdges reports whether any item of queue waits for another
// (dependsStatements.HasEdges).
func (s *Store) HasEdges(ctx context.Context, db DB, queue string) (bool, error) {
	rows, err := db.Query(ctx, s.deps().HasEdges, queue)
	if err != nil {
		return false, err
	}
	found, err := collectIDs(rows)
	return len(found) > 0, err
}

// PurgeDependsBatch deletes up to limit of queue's edges and, once it has
// none, up to limit of its waiting items, and returns how many waiting
// items it deleted and whether anything was deleted
// (dependsStatements.PurgeEdges, PickWaiting, DeleteWaiting).
func (s *Store) PurgeDependsBatch(ctx context.Context, db DB, d Dialect, queue string, limit int) (waiting int64, more bool, err error) {
	tag, err := db.Exec(ctx, s.deps().PurgeEdges, queue, limit)
	if err != nil || tag.RowsAffected() > 0 {
		return 0, err == nil, err
	}
	rows, err := db.Query(ctx, s.deps().PickWaiting, queue, limit)
	if err != nil {
		return 0, false, err
	}
	ids, err := collectIDs(rows)
	if err != nil || len(ids) == 0 {
		return 0, false, err
	}
	tag, err = db.Exec(ctx, byDialect(d, s.deps().DeleteWaiting, s.deps().PostgresDeleteWaiting), queue, rawIDs(ids))
	if err != nil {
		return 0, false, err
	}
	return tag.RowsAffected(), true, nil
}

// CancelWaiting deletes, in tx, the waiting item id of queue and the edges
// to it, records it as ended (cancelled), and reports whether it was there
// (dependsStatements.CancelWaiting, DeleteEdgesTo). The items that wait for
// it are ended by the reaper, as for any cancelled prerequisite.
func (s *Store) CancelWaiting(ctx context.Context, tx pgx.Tx, id uuid.UUID, queue string) (bool, error) {
	rows, err := tx.Query(ctx, s.deps().CancelWaiting, [16]byte(id), queue)
	if err != nil {
		return false, err
	}
	gone, err := collectIDs(rows)
	if err != nil || len(gone) == 0 {
		return false, err
	}
	_, err = tx.Exec(ctx, s.deps().DeleteEdgesTo, queue, rawIDs(gone))
	return err == nil, err
}
