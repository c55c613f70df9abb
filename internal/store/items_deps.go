package store

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The statements of dependencies (items_deps_sql.go): the enqueue of waiting
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
func (s *Store) Classify(ctx context.Context, db DB, d Dialect, queue string, ids []uuid.UUID) ([]PrereqState, error) {
	rows, err := db.Query(ctx, s.deps(d).Classify, queue, rawIDs(ids))
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
func (s *Store) InsertWaiting(ctx context.Context, db DB, d Dialect, queue string, rows []WaitingRow) ([]uuid.UUID, error) {
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
	res, err := db.Query(ctx, s.deps(d).InsertWaiting, queue, ids, hashes, keys, priorities, delays, maxAttempts,
		payloads, metadata, tenants, ttls, amo, remaining, headers, orders)
	if err != nil {
		return nil, err
	}
	return collectIDs(res)
}

// waitedForSQL is the text of dependsStatements.WaitedFor
// (rendered by newDependsStatements).
//
// As the ack's hasDependents, a subplan per id, the queue a
// column of a one-row subquery as in Prereqs (a constant queue
// made PostgreSQL read the queue's every edge per id when its
// statistics predated the queue).
const waitedForSQL = `SELECT g.id FROM (SELECT $1::TEXT AS q OFFSET 0) AS k, unnest($2::UUID[]) AS g (id)
WHERE EXISTS (SELECT 1 FROM crdbwork_waits_for AS x WHERE x.queue = k.q AND x.prereq = g.id OFFSET 0)`

// WaitedFor returns those of ids, items of queue that ended, that other
// items wait for (dependsStatements.WaitedFor): the at-most-once items'
// acks, which delete nothing, ask it to release their dependents.
func (s *Store) WaitedFor(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.common().WaitedFor, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// insertEdgesSQL is the text of dependsStatements.InsertEdges
// (rendered by newDependsStatements).
const insertEdgesSQL = `INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT $1, v.p, v.d FROM unnest($2::UUID[], $3::UUID[]) AS v (p, d)
ON CONFLICT (queue, prereq, dependent) DO NOTHING`

// InsertEdges records that dependents[i] waits for prereqs[i], in queue
// (dependsStatements.InsertEdges).
func (s *Store) InsertEdges(ctx context.Context, db DB, queue string, prereqs, dependents []uuid.UUID) error {
	_, err := db.Exec(ctx, s.common().InsertEdges, queue, rawIDs(prereqs), rawIDs(dependents))
	return err
}

// Edge is one edge of a queue: Dependent waits for Prereq.
type Edge struct {
	Prereq, Dependent uuid.UUID
}

// edgeArrays returns edges as two arrays, prerequisites and dependents.
func edgeArrays(edges []Edge) (prereqs, dependents [][16]byte) {
	prereqs, dependents = make([][16]byte, len(edges)), make([][16]byte, len(edges))
	for i, e := range edges {
		prereqs[i], dependents[i] = e.Prereq, e.Dependent
	}
	return prereqs, dependents
}

// dependsEdgesFromSQL is the text of dependsStatements.EdgesFrom
// (rendered by newDependsStatements).
const dependsEdgesFromSQL = `SELECT prereq, dependent FROM crdbwork_waits_for
WHERE queue = $1 AND prereq = ANY($2::UUID[])
ORDER BY prereq, dependent
LIMIT $3`

// EdgesFrom returns up to limit of the edges of queue from prereqs, in
// key order (prerequisite, then dependent), without locking them
// (dependsStatements.EdgesFrom).
func (s *Store) EdgesFrom(ctx context.Context, db DB, d Dialect, queue string, prereqs []uuid.UUID, limit int) ([]Edge, error) {
	rows, err := db.Query(ctx, s.deps(d).EdgesFrom, queue, rawIDs(prereqs), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Edge
	var p, dep [16]byte
	for rows.Next() {
		if err := rows.Scan(&p, &dep); err != nil {
			return nil, err
		}
		out = append(out, Edge{p, dep})
	}
	return out, rows.Err()
}

// ReleaseResult is what one ReleaseBatch did.
type ReleaseResult struct {
	// Moved are the dependents it moved into the items table (their
	// counts reached zero).
	Moved []uuid.UUID
	// Edges is how many edges it deleted.
	Edges int
	// Left are the edges it read but did not delete: their dependents are
	// no waiting items (any more: DeleteEdgesGone deletes such edges), or
	// another transaction held them (skipLocked).
	Left []Edge
	// More reports that it read limit edges: there may be more.
	More bool
}

// ReleaseBatch releases, in tx, the dependents of up to limit edges of
// queue from the acked items prereqs (the first in key order): it locks
// the dependents' waiting rows in id order (skipping those another
// transaction holds if skipLocked, waiting for them otherwise), deletes
// those edges, lowers the dependents' remaining counts, and moves the
// dependents whose count reached zero into the items table
// (dependsStatements.EdgesFrom, Release or SweepRelease, MoveReady). Run
// it once the acks of prereqs committed, in a transaction of its own (READ
// COMMITTED on PostgreSQL, so that the releases of a fan-in queue on the
// join's row rather than fail each other), or in the reaper's that found
// them acked; each batch holds its dependents' rows until its transaction
// ends, so keep the transaction to one batch where others wait.
func (s *Store) ReleaseBatch(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, limit int, skipLocked bool) (ReleaseResult, error) {
	var res ReleaseResult
	edges, err := s.EdgesFrom(ctx, tx, d, queue, prereqs, limit)
	if err != nil || len(edges) == 0 {
		return res, err
	}
	res.More = len(edges) >= limit
	stmt := s.deps(d).Release
	if skipLocked {
		stmt = s.deps(d).SweepRelease
	}
	ps, ds := edgeArrays(edges)
	rows, err := tx.Query(ctx, stmt, queue, ps, ds)
	if err != nil {
		return res, err
	}
	var ready []uuid.UUID
	held := make(map[uuid.UUID]bool, len(edges))
	var id [16]byte
	var remaining, n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &remaining, &n}, func() error {
		held[id] = true
		res.Edges += int(n)
		if remaining <= 0 {
			ready = append(ready, id)
		}
		return nil
	}); err != nil {
		return res, err
	}
	for _, e := range edges {
		if !held[e.Dependent] {
			res.Left = append(res.Left, e)
		}
	}
	if len(ready) > 0 {
		if res.Moved, err = s.MoveReady(ctx, tx, d, queue, ready); err != nil {
			return res, err
		}
	}
	return res, nil
}

// dependsMoveReadySQL is the text of dependsStatements.MoveReady
// (rendered by newDependsStatements).
var dependsMoveReadySQL = fmt.Sprintf(moveReady, `WHERE w.id = ANY($2::UUID[]) AND (w.queue = $1) IS TRUE AND w.remaining <= 0`)

// MoveReady moves, in tx, the waiting items ids of queue whose remaining
// count is zero into the items table and returns the ids it moved
// (dependsStatements.MoveReady). The caller holds their rows (Release).
func (s *Store) MoveReady(ctx context.Context, tx pgx.Tx, d Dialect, queue string, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.deps(d).MoveReady, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// DeleteEdgesGone deletes those of edges of queue whose dependent
// is no waiting item (any more), in key order, and returns how many it
// deleted (dependsStatements.DeleteEdgesGone). Nobody holds such an edge's
// dependent, so the key order is what keeps two transactions that delete
// the same ones from waiting for each other in a cycle.
func (s *Store) DeleteEdgesGone(ctx context.Context, db DB, d Dialect, queue string, edges []Edge) (int64, error) {
	if len(edges) == 0 {
		return 0, nil
	}
	sorted := slices.Clone(edges)
	slices.SortFunc(sorted, func(a, b Edge) int {
		if c := bytes.Compare(a.Prereq[:], b.Prereq[:]); c != 0 {
			return c
		}
		return bytes.Compare(a.Dependent[:], b.Dependent[:])
	})
	ps, ds := edgeArrays(slices.Compact(sorted))
	tag, err := db.Exec(ctx, s.deps(d).DeleteEdgesGone, queue, ps, ds)
	return tag.RowsAffected(), err
}

// ReleaseEdges deletes, in tx, every edge of queue from the acked items
// prereqs, lowers their dependents' remaining counts and returns the
// dependents whose count reached zero, without moving them (MoveReady
// does). It waits for dependents other transactions hold, and takes them
// all in one statement (the lock order of items_deps_sql.go), so it is unbounded:
// for prerequisites with many dependents, use ReleaseBatch in transactions
// of their own. Edges of dependents that are gone are deleted too.
func (s *Store) ReleaseEdges(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID) ([]uuid.UUID, error) {
	edges, err := s.EdgesFrom(ctx, tx, d, queue, prereqs, math.MaxInt32)
	if err != nil || len(edges) == 0 {
		return nil, err
	}
	ps, ds := edgeArrays(edges)
	rows, err := tx.Query(ctx, s.deps(d).Release, queue, ps, ds)
	if err != nil {
		return nil, err
	}
	var ready []uuid.UUID
	held := make(map[uuid.UUID]bool, len(edges))
	var id [16]byte
	var remaining, n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &remaining, &n}, func() error {
		held[id] = true
		if remaining <= 0 {
			ready = append(ready, id)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var left []Edge
	for _, e := range edges {
		if !held[e.Dependent] {
			left = append(left, e)
		}
	}
	if _, err := s.DeleteEdgesGone(ctx, tx, d, queue, left); err != nil {
		return nil, err
	}
	return ready, nil
}

// ReleaseDependents releases, in tx, every dependent of the acked items
// prereqs of queue: ReleaseEdges, then MoveReady. It returns the ids it
// moved into the items table.
func (s *Store) ReleaseDependents(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID) ([]uuid.UUID, error) {
	ready, err := s.ReleaseEdges(ctx, tx, d, queue, prereqs)
	if err != nil || len(ready) == 0 {
		return nil, err
	}
	return s.MoveReady(ctx, tx, d, queue, ready)
}

// SweepPrereqs returns the prerequisites of the next limit edges of queue
// after prerequisite after, in order (repeated for each of their
// dependents; dependsStatements.SweepPrereqs).
func (s *Store) SweepPrereqs(ctx context.Context, db DB, d Dialect, queue string, after uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.deps(d).SweepPrereqs, queue, [16]byte(after), limit)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// KillResult is what one KillBatch did.
type KillResult struct {
	// Killed are the dependents it ended.
	Killed []uuid.UUID
	// Left are the edges it read whose dependents it did not end: gone
	// already (DeleteEdgesGone deletes such edges), or held by another
	// transaction.
	Left []Edge
	// More reports that it read limit edges: there may be more.
	More bool
}

// KillBatch ends, in tx, the waiting dependents of up to limit edges of
// queue from prereqs (the first in key order), prerequisites that ended
// without an ack (outcomes[i] says how prereqs[i] ended): it locks their
// waiting rows in id order, skipping those another transaction holds,
// moves them to the dead items with reason "dependency died:
// <prerequisite>", records them as ended (dead) and deletes their edges
// (dependsStatements.EdgesFrom, KillDependents, DeleteEdgesTo).
func (s *Store) KillBatch(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, outcomes []string, limit int) (KillResult, error) {
	var res KillResult
	edges, err := s.EdgesFrom(ctx, tx, d, queue, prereqs, limit)
	if err != nil || len(edges) == 0 {
		return res, err
	}
	res.More = len(edges) >= limit
	ps, ds := edgeArrays(edges)
	rows, err := tx.Query(ctx, s.deps(d).KillDependents, queue, ps, ds, rawIDs(prereqs), outcomes)
	if err != nil {
		return res, err
	}
	if res.Killed, err = collectIDs(rows); err != nil {
		return res, err
	}
	killed := make(map[uuid.UUID]bool, len(res.Killed))
	for _, id := range res.Killed {
		killed[id] = true
	}
	for _, e := range edges {
		if !killed[e.Dependent] {
			res.Left = append(res.Left, e)
		}
	}
	if len(res.Killed) > 0 {
		if _, err := tx.Exec(ctx, s.deps(d).DeleteEdgesTo, queue, rawIDs(res.Killed)); err != nil {
			return res, err
		}
	}
	return res, nil
}

// prereqsSQL is the text of dependsStatements.Prereqs
// (rendered by newDependsStatements).
const prereqsSQL = `SELECT e.prereq FROM (SELECT $1::TEXT AS q, $2::UUID AS d OFFSET 0) AS k
JOIN crdbwork_waits_for AS e ON e.queue = k.q AND e.dependent = k.d
ORDER BY e.prereq`

// Prereqs returns the prerequisites that dependent still waits for in
// queue (dependsStatements.Prereqs).
func (s *Store) Prereqs(ctx context.Context, db DB, queue string, dependent uuid.UUID) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.common().Prereqs, queue, [16]byte(dependent))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// dependentsSQL is the text of dependsStatements.Dependents
// (rendered by newDependsStatements).
const dependentsSQL = `SELECT e.dependent FROM (SELECT $1::TEXT AS q, $2::UUID AS p OFFSET 0) AS k
JOIN crdbwork_waits_for AS e ON e.queue = k.q AND e.prereq = k.p
ORDER BY e.dependent LIMIT $3`

// Dependents returns up to limit of the items of queue that wait for
// prereq (dependsStatements.Dependents).
func (s *Store) Dependents(ctx context.Context, db DB, queue string, prereq uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.common().Dependents, queue, [16]byte(prereq), limit)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// waitingSQL is the text of dependsStatements.Waiting
// (rendered by newDependsStatements).
const waitingSQL = `SELECT remaining, enqueued_at FROM crdbwork_waiting WHERE id = $2 AND (queue = $1) IS TRUE`

// Waiting reports whether id is a waiting item of queue, with its count of
// prerequisites not yet acked and its enqueue time
// (dependsStatements.Waiting).
func (s *Store) Waiting(ctx context.Context, db DB, queue string, id uuid.UUID) (waiting bool, remaining int64, enqueuedAt time.Time, err error) {
	err = db.QueryRow(ctx, s.common().Waiting, queue, [16]byte(id)).Scan(&remaining, &enqueuedAt)
	if err == pgx.ErrNoRows {
		return false, 0, time.Time{}, nil
	}
	return err == nil, remaining, enqueuedAt, err
}

// waitingCountSQL is the text of dependsStatements.WaitingCount
// (rendered by newDependsStatements).
const waitingCountSQL = `SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`

// WaitingCount returns the number of waiting items of queue
// (dependsStatements.WaitingCount).
func (s *Store) WaitingCount(ctx context.Context, db DB, queue string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.common().WaitingCount, queue).Scan(&n)
	return n, err
}

// hasEdgesSQL is the text of dependsStatements.HasEdges
// (rendered by newDependsStatements).
//
// In primary-key order with a limit, not EXISTS: PostgreSQL ran an
// EXISTS as a scan of the table, expecting to meet the queue's
// edges early.
const hasEdgesSQL = `SELECT prereq FROM crdbwork_waits_for WHERE queue = $1 ORDER BY prereq LIMIT 1`

// HasEdges reports whether any item of queue waits for another
// (dependsStatements.HasEdges).
func (s *Store) HasEdges(ctx context.Context, db DB, queue string) (bool, error) {
	rows, err := db.Query(ctx, s.common().HasEdges, queue)
	if err != nil {
		return false, err
	}
	found, err := collectIDs(rows)
	return len(found) > 0, err
}

// pickWaitingSQL is the text of dependsStatements.PickWaiting
// (rendered by newDependsStatements).
const pickWaitingSQL = `SELECT id FROM crdbwork_waiting WHERE queue = $1 ORDER BY enqueued_at LIMIT $2`

// pickOrphansSQL is the text of dependsStatements.PickOrphans
// (rendered by newDependsStatements).
const pickOrphansSQL = `SELECT x.prereq, x.dependent FROM crdbwork_waits_for AS x
WHERE x.queue = $1 AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS o WHERE o.id = x.dependent OFFSET 0)
ORDER BY x.prereq, x.dependent
LIMIT $2`

// PurgeDependsBatch deletes up to limit of queue's waiting items with
// their edges and, once it has none, up to limit of its edges whose
// dependents are gone, and returns how many waiting items it deleted and
// whether anything was deleted (dependsStatements.PickWaiting,
// PurgeWaiting, PickOrphans, DeleteEdgesGone). Each batch's delete is one
// statement, which locks its waiting rows before their edges (the package
// comment's lock order).
func (s *Store) PurgeDependsBatch(ctx context.Context, db DB, d Dialect, queue string, limit int) (waiting int64, more bool, err error) {
	rows, err := db.Query(ctx, s.common().PickWaiting, queue, limit)
	if err != nil {
		return 0, false, err
	}
	ids, err := collectIDs(rows)
	if err != nil {
		return 0, false, err
	}
	if len(ids) > 0 {
		err = db.QueryRow(ctx, s.deps(d).PurgeWaiting, queue, rawIDs(ids)).Scan(&waiting)
		return waiting, err == nil, err
	}
	rows, err = db.Query(ctx, s.common().PickOrphans, queue, limit)
	if err != nil {
		return 0, false, err
	}
	var orphans []Edge
	var p, dep [16]byte
	_, err = pgx.ForEachRow(rows, []any{&p, &dep}, func() error {
		orphans = append(orphans, Edge{p, dep})
		return nil
	})
	if err != nil || len(orphans) == 0 {
		return 0, false, err
	}
	n, err := s.DeleteEdgesGone(ctx, db, d, queue, orphans)
	return 0, err == nil && n > 0, err
}

// cancelWaitingSQL is the text of dependsStatements.CancelWaiting
// (rendered by newDependsStatements).
var cancelWaitingSQL = deleteEnded(`DELETE FROM crdbwork_waiting WHERE id = $1 AND (queue = $2) IS TRUE`, OutcomeCancelled)

// CancelWaiting deletes, in tx, the waiting item id of queue and the edges
// to it, records it as ended (cancelled), and reports whether it was there
// (dependsStatements.CancelWaiting, DeleteEdgesTo). The items that wait for
// it are ended by the reaper, as for any cancelled prerequisite.
func (s *Store) CancelWaiting(ctx context.Context, tx pgx.Tx, d Dialect, id uuid.UUID, queue string) (bool, error) {
	rows, err := tx.Query(ctx, s.common().CancelWaiting, [16]byte(id), queue)
	if err != nil {
		return false, err
	}
	gone, err := collectIDs(rows)
	if err != nil || len(gone) == 0 {
		return false, err
	}
	_, err = tx.Exec(ctx, s.deps(d).DeleteEdgesTo, queue, rawIDs(gone))
	return err == nil, err
}

// common returns the dependency statements whose text is the same on
// both engines (those of PostgreSQL's set).
func (s *Store) common() *dependsStatements { return s.deps(Postgres) }
