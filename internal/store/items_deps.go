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

// The statements of dependencies (in this file): the enqueue of waiting
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

// ItemsDepsClassify reports, for each of ids, where it is in queue: an item, a
// waiting item, an item of another queue, ended (and how), or nowhere
// (dependsStatements.Classify). One row per id, in the order of ids.
func (s *Store) ItemsDepsClassify(ctx context.Context, db DB, d Dialect, queue string, ids []uuid.UUID) ([]PrereqState, error) {
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
	// RunAfter is the set of prerequisite outcomes (RunAfter bits) that
	// satisfy its edge as an ack would, instead of ending it dead: 0, none.
	RunAfter int64
}

// Bits of WaitingRow.RunAfter (crdbwork_waiting.run_after, schema
// version 6): a prerequisite that ended so counts as acked for the
// dependent (claim's DependencyPolicy).
const (
	RunAfterDead      = 1
	RunAfterCancelled = 2
)

// ItemsDepsInsertWaiting adds rows to queue's waiting items, skipping ids that are
// items, waiting items, or ended in queue within its dedup window, and
// returns the ids it added (dependsStatements.InsertWaiting). A row keeps
// its Headers and, with a key in a sequenced queue, its Order, which its
// move into the items table carries over.
func (s *Store) ItemsDepsInsertWaiting(ctx context.Context, db DB, d Dialect, queue string, rows []WaitingRow) ([]uuid.UUID, error) {
	n := len(rows)
	ids := make([][16]byte, n)
	hashes, priorities, delays, maxAttempts, ttls, remaining := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	keys, tenants := make([]*string, n), make([]*string, n)
	payloads, metadata := make([][]byte, n), make([][]byte, n)
	amo := make([]bool, n)
	headers, orders, runAfter, timeouts := make([]*string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	kinds := make([]*string, n)
	for j := range rows {
		r := &rows[j]
		runAfter[j], timeouts[j] = r.RunAfter, r.Timeout.Microseconds()
		if r.Kind != "" {
			kinds[j] = &r.Kind
		}
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
	stmt := s.deps(d).InsertWaiting
	args := []any{queue, ids, hashes, keys, priorities, delays, maxAttempts,
		payloads, metadata, tenants, ttls, amo, remaining, headers, orders, runAfter, timeouts, kinds}
	if anyFrees(rows, func(r *WaitingRow) int64 { return r.Frees }) {
		frees := make([]int64, n)
		for j := range rows {
			frees[j] = rows[j].Frees
		}
		stmt, args = s.deps(d).InsertWaitingUnique, append(args, frees)
	}
	res, err := db.Query(ctx, stmt, args...)
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

// ItemsDepsWaitedFor returns those of ids, items of queue that ended, that other
// items wait for (dependsStatements.WaitedFor): the at-most-once items'
// acks, which delete nothing, ask it to release their dependents.
func (s *Store) ItemsDepsWaitedFor(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]uuid.UUID, error) {
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

// ItemsDepsInsertEdges records that dependents[i] waits for prereqs[i], in queue
// (dependsStatements.InsertEdges).
func (s *Store) ItemsDepsInsertEdges(ctx context.Context, db DB, queue string, prereqs, dependents []uuid.UUID) error {
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

// ItemsDepsEdgesFrom returns up to limit of the edges of queue from prereqs, in
// key order (prerequisite, then dependent), without locking them
// (dependsStatements.EdgesFrom).
func (s *Store) ItemsDepsEdgesFrom(ctx context.Context, db DB, d Dialect, queue string, prereqs []uuid.UUID, limit int) ([]Edge, error) {
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

// ItemsDepsReleaseBatch releases, in tx, the dependents of up to limit edges of
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
func (s *Store) ItemsDepsReleaseBatch(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, limit int, skipLocked bool) (ReleaseResult, error) {
	stmt := s.deps(d).Release
	if skipLocked {
		stmt = s.deps(d).SweepRelease
	}
	return s.releaseBatch(ctx, tx, d, queue, prereqs, limit, stmt)
}

// ItemsDepsReleaseAnyway is the reaper's ReleaseBatch (skipping locked
// dependents) for prerequisites that ended without an ack, each with
// outcome bit runAfter (RunAfterDead or RunAfterCancelled): it releases
// only the dependents whose run_after has that bit (NewItem.RunAfter),
// and leaves the others' edges to KillBatch (dependsStatements.EdgesFrom,
// ReleaseAnyway, MoveReady).
func (s *Store) ItemsDepsReleaseAnyway(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, runAfter int64, limit int) (ReleaseResult, error) {
	return s.releaseBatch(ctx, tx, d, queue, prereqs, limit, s.deps(d).ReleaseAnyway, runAfter)
}

// releaseBatch is ReleaseBatch with stmt (Release, SweepRelease or
// ReleaseAnyway, whose further arguments are extra).
func (s *Store) releaseBatch(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, limit int, stmt string, extra ...any) (ReleaseResult, error) {
	var res ReleaseResult
	edges, err := s.ItemsDepsEdgesFrom(ctx, tx, d, queue, prereqs, limit)
	if err != nil || len(edges) == 0 {
		return res, err
	}
	res.More = len(edges) >= limit
	ps, ds := edgeArrays(edges)
	rows, err := tx.Query(ctx, stmt, append([]any{queue, ps, ds}, extra...)...)
	if err != nil {
		return res, err
	}
	return s.moveReleased(ctx, tx, d, queue, rows, edges, res)
}

// moveReleased reads the rows of a release statement (a dependent, its
// remaining count and the edges deleted), adds the edges of dependents it
// did not return to res.Left, and moves the dependents whose count reached
// zero into queue's items table (MoveReady).
func (s *Store) moveReleased(ctx context.Context, tx pgx.Tx, d Dialect, queue string, rows pgx.Rows, edges []Edge, res ReleaseResult) (ReleaseResult, error) {
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
		var err error
		if res.Moved, err = s.ItemsDepsMoveReady(ctx, tx, d, queue, ready); err != nil {
			return res, err
		}
	}
	return res, nil
}

// dependsMoveReadySQL is the text of dependsStatements.MoveReady
// (rendered by newDependsStatements).
var dependsMoveReadySQL = fmt.Sprintf(moveReady, `WHERE w.id = ANY($2::UUID[]) AND (w.queue = $1) IS TRUE AND w.remaining <= 0`)

// ItemsDepsMoveReady moves, in tx, the waiting items ids of queue whose remaining
// count is zero into the items table and returns the ids it moved
// (dependsStatements.MoveReady). The caller holds their rows (Release).
func (s *Store) ItemsDepsMoveReady(ctx context.Context, tx pgx.Tx, d Dialect, queue string, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.deps(d).MoveReady, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// ItemsDepsDeleteEdgesGone deletes those of edges of queue whose dependent
// is no waiting item (any more), in key order, and returns how many it
// deleted (dependsStatements.DeleteEdgesGone). Nobody holds such an edge's
// dependent, so the key order is what keeps two transactions that delete
// the same ones from waiting for each other in a cycle.
func (s *Store) ItemsDepsDeleteEdgesGone(ctx context.Context, db DB, d Dialect, queue string, edges []Edge) (int64, error) {
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

// ItemsDepsReleaseEdges deletes, in tx, every edge of queue from the acked items
// prereqs, lowers their dependents' remaining counts and returns the
// dependents whose count reached zero, without moving them (MoveReady
// does). It waits for dependents other transactions hold, and takes them
// all in one statement (this file's lock order), so it is unbounded:
// for prerequisites with many dependents, use ReleaseBatch in transactions
// of their own. Edges of dependents that are gone are deleted too.
func (s *Store) ItemsDepsReleaseEdges(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID) ([]uuid.UUID, error) {
	edges, err := s.ItemsDepsEdgesFrom(ctx, tx, d, queue, prereqs, math.MaxInt32)
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
	if _, err := s.ItemsDepsDeleteEdgesGone(ctx, tx, d, queue, left); err != nil {
		return nil, err
	}
	return ready, nil
}

// ItemsDepsReleaseDependents releases, in tx, every dependent of the acked items
// prereqs of queue: ReleaseEdges, then MoveReady. It returns the ids it
// moved into the items table.
func (s *Store) ItemsDepsReleaseDependents(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID) ([]uuid.UUID, error) {
	ready, err := s.ItemsDepsReleaseEdges(ctx, tx, d, queue, prereqs)
	if err != nil || len(ready) == 0 {
		return nil, err
	}
	return s.ItemsDepsMoveReady(ctx, tx, d, queue, ready)
}

// ItemsDepsSweepPrereqs returns the prerequisites of the next limit edges of queue
// after prerequisite after, in order (repeated for each of their
// dependents; dependsStatements.SweepPrereqs).
func (s *Store) ItemsDepsSweepPrereqs(ctx context.Context, db DB, d Dialect, queue string, after uuid.UUID, limit int) ([]uuid.UUID, error) {
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

// ItemsDepsKillBatch ends, in tx, the waiting dependents of up to limit edges of
// queue from prereqs (the first in key order), prerequisites that ended
// without an ack (outcomes[i] says how prereqs[i] ended): it locks their
// waiting rows in id order, skipping those another transaction holds,
// moves them to the dead items with reason "dependency died:
// <prerequisite>", records them as ended (dead) and deletes their edges
// (dependsStatements.EdgesFrom, KillDependents, DeleteEdgesTo).
//
// A dependent whose run_after has a bit of spare (RunAfter bits: the
// prerequisites' outcomes that ReleaseAnyway releases it for) is left
// alone, its edges in Left; 0 spares none.
func (s *Store) ItemsDepsKillBatch(ctx context.Context, tx pgx.Tx, d Dialect, queue string, prereqs []uuid.UUID, outcomes []string, spare int64, limit int) (KillResult, error) {
	var res KillResult
	edges, err := s.ItemsDepsEdgesFrom(ctx, tx, d, queue, prereqs, limit)
	if err != nil || len(edges) == 0 {
		return res, err
	}
	res.More = len(edges) >= limit
	return s.killEdges(ctx, tx, d, queue, edges, prereqs, outcomes, spare, res)
}

// killEdges ends the dependents of edges (KillDependents, sparing those
// whose run_after has spare), adds the edges of dependents it did not end
// to res.Left, and deletes the ended dependents' edges: from their own
// queue's items and, with their hints, from items of other queues.
func (s *Store) killEdges(ctx context.Context, tx pgx.Tx, d Dialect, queue string, edges []Edge, prereqs []uuid.UUID, outcomes []string, spare int64, res KillResult) (KillResult, error) {
	ps, ds := edgeArrays(edges)
	rows, err := tx.Query(ctx, s.deps(d).KillDependents, queue, ps, ds, rawIDs(prereqs), outcomes, spare)
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
		if err := s.ItemsDepsDeleteAcrossTo(ctx, tx, queue, res.Killed); err != nil {
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

// ItemsDepsPrereqs returns the prerequisites that dependent still waits for in
// queue (dependsStatements.Prereqs).
func (s *Store) ItemsDepsPrereqs(ctx context.Context, db DB, queue string, dependent uuid.UUID) ([]uuid.UUID, error) {
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

// ItemsDepsDependents returns up to limit of the items of queue that wait for
// prereq (dependsStatements.Dependents).
func (s *Store) ItemsDepsDependents(ctx context.Context, db DB, queue string, prereq uuid.UUID, limit int) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, s.common().Dependents, queue, [16]byte(prereq), limit)
	if err != nil {
		return nil, err
	}
	return collectIDs(rows)
}

// waitingSQL is the text of dependsStatements.Waiting
// (rendered by newDependsStatements).
const waitingSQL = `SELECT remaining, enqueued_at, run_after FROM crdbwork_waiting WHERE id = $2 AND (queue = $1) IS TRUE`

// ItemsDepsWaiting reports whether id is a waiting item of queue, with its count of
// prerequisites not yet acked and its enqueue time
// (dependsStatements.Waiting).
func (s *Store) ItemsDepsWaiting(ctx context.Context, db DB, queue string, id uuid.UUID) (waiting bool, remaining int64, enqueuedAt time.Time, runAfter int64, err error) {
	err = db.QueryRow(ctx, s.common().Waiting, queue, [16]byte(id)).Scan(&remaining, &enqueuedAt, &runAfter)
	if err == pgx.ErrNoRows {
		return false, 0, time.Time{}, 0, nil
	}
	return err == nil, remaining, enqueuedAt, runAfter, err
}

// waitingCountSQL is the text of dependsStatements.WaitingCount
// (rendered by newDependsStatements).
const waitingCountSQL = `SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`

// ItemsDepsWaitingCount returns the number of waiting items of queue
// (dependsStatements.WaitingCount).
func (s *Store) ItemsDepsWaitingCount(ctx context.Context, db DB, queue string) (int64, error) {
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

// ItemsDepsHasEdges reports whether any item of queue waits for another
// (dependsStatements.HasEdges).
func (s *Store) ItemsDepsHasEdges(ctx context.Context, db DB, queue string) (bool, error) {
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

// QueuePurgeDependsBatch deletes up to limit of queue's waiting items with
// their edges and, once it has none, up to limit of its edges whose
// dependents are gone, and returns how many waiting items it deleted and
// whether anything was deleted (dependsStatements.PickWaiting,
// PurgeWaiting, PickOrphans, DeleteEdgesGone). Each batch's delete is one
// statement, which locks its waiting rows before their edges (the package
// comment's lock order).
func (s *Store) QueuePurgeDependsBatch(ctx context.Context, db DB, d Dialect, queue string, limit int) (waiting int64, more bool, err error) {
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
	n, err := s.ItemsDepsDeleteEdgesGone(ctx, db, d, queue, orphans)
	return 0, err == nil && n > 0, err
}

// cancelWaitingSQL is the text of dependsStatements.CancelWaiting
// (rendered by newDependsStatements).
var cancelWaitingSQL = "WITH gone AS (DELETE FROM crdbwork_waiting WHERE id = $1 AND (queue = $2) IS TRUE RETURNING id, queue, enqueued_at, kind),\n" +
	recordEnded(OutcomeCancelled, endedFromWaiting) + "\nSELECT id FROM gone"

// ItemsDepsCancelWaiting deletes, in tx, the waiting item id of queue and the edges
// to it, records it as ended (cancelled), and reports whether it was there
// (dependsStatements.CancelWaiting, DeleteEdgesTo). The items that wait for
// it are ended by the reaper, as for any cancelled prerequisite.
func (s *Store) ItemsDepsCancelWaiting(ctx context.Context, tx pgx.Tx, d Dialect, id uuid.UUID, queue string) (bool, error) {
	rows, err := tx.Query(ctx, s.common().CancelWaiting, [16]byte(id), queue)
	if err != nil {
		return false, err
	}
	gone, err := collectIDs(rows)
	if err != nil || len(gone) == 0 {
		return false, err
	}
	if _, err = tx.Exec(ctx, s.deps(d).DeleteEdgesTo, queue, rawIDs(gone)); err != nil {
		return false, err
	}
	// Its edges from items of other queues, with their hints.
	err = s.ItemsDepsDeleteAcrossTo(ctx, tx, queue, gone)
	return err == nil, err
}

// common returns the dependency statements whose text is the same on
// both engines (those of PostgreSQL's set).
func (s *Store) common() *dependsStatements { return s.deps(Postgres) }

// Dependencies: items that wait for other items of their queue.
//
// A dependent whose prerequisites are not all acked is a row of
// crdbwork_waiting, never of crdbwork_items, so no claim statement of any
// version can hand it out; each of its unsatisfied prerequisites is an edge
// of crdbwork_waits_for, and its remaining column counts them. Right after
// an ack commits, the acking process releases the acked items' dependents
// in bounded steps, each a short transaction of its own (READ COMMITTED on
// PostgreSQL; claim's releaseAcked): EdgesFrom reads up to a batch of the
// acked items' edges, Release locks their dependents, deletes those edges
// and lowers the dependents' remaining counts, and MoveReady moves the
// dependents at zero into the items table. A dependent is released exactly
// once: a row of crdbwork_waiting can be deleted once. The count is exact:
// each edge is deleted, and counted, by one transaction.
//
// Everything else that ends a prerequisite (a death, a cancel, an ack by a
// version-4 worker, which runs no release, or a release that failed or
// never ran) is found by every session's reaper: it walks the queue's edges
// by prerequisite (SweepPrereqs), classifies the prerequisites (Classify:
// queued or waiting, or how they ended, from crdbwork_ended, the dedup
// memory, and the dead items) and releases the dependents of acked ones
// (the SKIP LOCKED forms of the same statements) or ends the dependents of
// dead, cancelled or unknown ones (KillDependents, then DeleteEdgesTo and
// DeleteEdgesGone), level by level.
//
// # Lock order
//
// Every statement that locks rows of these tables takes them in one order,
// so that no two transactions of this version can wait for each other in a
// cycle (a deadlock), whatever they do at once:
//
//  1. the dependents' waiting rows, in id order, all in one statement
//     (FOR UPDATE under ORDER BY id, or a DELETE of one row), before
//     anything else of them;
//  2. only then their edges: an edge (prerequisite, dependent) is deleted
//     only by a transaction that holds its dependent's row locked, except
//     an edge whose dependent is gone (an orphan), which nobody holds;
//     several edges are deleted in (prerequisite, dependent) order;
//  3. then the rows written for the dependents (their items, dead items
//     and ended ids), keyed by the dependents' ids, which nobody else
//     writes while the dependents are locked.
//
// The release after an ack waits for the dependents' locks; the reaper's
// sweep never waits for one (FOR UPDATE SKIP LOCKED: a dependent locked by
// a release is that release's, or the next sweep's); a cancel of a waiting
// item locks its one row first; a purge locks a batch of waiting rows in
// id order, then deletes their edges. An ack, a claim and a cancel of an
// item lock only items rows, which no statement here locks before a
// waiting row. Version-5 workers during a rolling upgrade deleted edges
// before they locked the dependents; PostgreSQL finds such a deadlock and
// the retry helper runs the transaction again.
//
// # Plans
//
// A database that has lived estimates a queue the statistics never saw at
// about one row, whatever it holds; any index that starts with the queue
// then looks as cheap as the primary key, and PostgreSQL took the one with
// fewer conditions: the release of issue 29 read a queue's 16,000 edges
// through crdbwork_waits_for_by_dependent to find 3,332, and its 9,802
// waiting rows through crdbwork_waiting_by_queue for each of them
// (14 seconds). So (TestDependsPlans, TestDependsPlansLived):
//
//   - a row looked up by id compares its queue in IS TRUE, which is no
//     index condition: the primary key is the only index it can use;
//   - a lookup by a primary key that starts with the queue (the edges by
//     prerequisite, the ended ids) compares the queue, on PostgreSQL, with
//     (SELECT $1::TEXT), an InitPlan whose value the planner does not see:
//     it estimates the queue at its average size, so an index by the
//     queue alone costs what it reads and loses to the primary key. On
//     CockroachDB the text keeps $1 (a subquery there could become a join
//     the index spans do not see, docs/cockroachdb.md);
//   - rows of one table joined by id to rows of another are joined, on
//     PostgreSQL, with id = ANY(ARRAY[other.id]), which cannot be hashed or
//     merged: a nested loop of primary-key lookups, never a hash over a
//     scan; CockroachDB plans the plain equality as a lookup join; where
//     the joined table's key starts with the queue, PostgreSQL gets the
//     queue from the joined rows too (edgeKeys), a join condition, never a
//     condition on the table alone that it could read once into a
//     Materialize;
//   - a batch read in key order is read one prerequisite at a time on
//     PostgreSQL (EdgesFrom), whose index scans lose the key's order under
//     = ANY on a column after the first;
//   - the NOT EXISTS subqueries end in OFFSET 0, which keeps PostgreSQL
//     from turning them into anti-joins (it does not pull up a sublink
//     with an OFFSET; CockroachDB drops the OFFSET 0 and plans a lookup
//     anti-join by primary key); the dead items' lookup is ordered by
//     their key (id, death) and limited to a row, so that it goes by that
//     key, never through crdbwork_dead_items_by_queue.
//
// CockroachDB checked (docs, "Common Table Expressions"; "DELETE",
// "UPDATE ... FROM", "SELECT FOR UPDATE"): data-modifying CTEs run whether
// or not the main query reads them, each statement modifies each table
// once (Release deletes edges and updates waiting rows, after a locking
// read of the waiting rows; MoveReady deletes waiting rows and inserts
// items; KillDependents deletes waiting rows and inserts ended and dead
// rows), = ANY(placeholder array) constrains an index scan to sorted spans,
// whose rows a locking read locks in key order, and min(TEXT) is used
// where PostgreSQL has no min(UUID).

// Prerequisite states that Classify reports.
const (
	PrereqQueued  = "queued"  // an item of the queue, not ended
	PrereqWaiting = "waiting" // a waiting item of the queue
	PrereqOther   = "other"   // an item (or waiting item) of another queue
	PrereqUnknown = "unknown" // nowhere: never enqueued, or forgotten
	// Otherwise the outcome recorded in crdbwork_ended (OutcomeAcked,
	// OutcomeDead, OutcomeCancelled, OutcomeTaken), or OutcomeDead for an
	// id found among the queue's dead items only.
)

type dependsStatements struct {
	// Classify: $1 queue, $2 ids → id, queue of its item (NULL if none),
	// queue of its waiting row (NULL if none), its outcome in the queue's
	// ended ids (NULL if none), whether it is among the queue's dead
	// items. One primary-key lookup per table and id.
	Classify string
	// InsertWaiting adds waiting rows to queue $1 and returns the ids it
	// added; an id in the items table, in crdbwork_waiting, or ended in
	// the queue within its dedup window is skipped. Parameters, one
	// element per row: $2 ids, $3 hashes, $4 keys, $5 priorities, $6
	// delays (µs), $7 max attempts, $8 payloads, $9 metadata, $10 tenants,
	// $11 ttl (µs), $12 at-most-once, $13 remaining, $14 headers (TEXT[]
	// of JSON objects, NULL for none), $16 run_after (BIGINT[]: RunAfter
	// bits, schema version 6), $15 sequence orders (stored as
	// seq_order for the rows with a key while the queue is sequenced, read
	// in the same statement, as enqueue's Insert does: the move into the
	// items table carries both over), $17 handler timeouts (µs, 0 for
	// none: stored as NULL in timeout_us, carried over by the move too),
	// $18 kinds (TEXT[], NULL for none, carried over by the move too).
	InsertWaiting string
	// InsertWaitingUnique is InsertWaiting with one more parameter, $19
	// (BIGINT[]): each row's outcomes that do not keep it out (EndedFrees bits), as
	// enqueue's InsertUnique; the ended records of the rows added are
	// deleted in the same statement.
	InsertWaitingUnique string
	// InsertEdges adds the edges $2[i] → $3[i] (prerequisite, dependent)
	// of queue $1.
	InsertEdges string
	// EdgesFrom: $1 queue, $2 prerequisites, $3 limit → (prerequisite,
	// dependent) of up to $3 of their edges, in key order. No lock.
	EdgesFrom string
	// Release: $1 queue, $2 and $3 the edges read by EdgesFrom
	// (prerequisites and dependents, element by element) → (id,
	// remaining, edges deleted) of each dependent whose count it lowered. It locks the
	// dependents' waiting rows in id order, deletes those edges of the
	// locked dependents, and lowers each one's remaining count by its
	// edges deleted. (Edges of dependents that are gone are
	// DeleteEdgesGone's.)
	// SweepRelease is Release with FOR UPDATE SKIP LOCKED: a dependent
	// another transaction holds is left alone, with its edges.
	Release, SweepRelease string
	// ReleaseAnyway is SweepRelease for prerequisites that ended without
	// an ack, with one more parameter, $4 (a RunAfter bit): it locks, and
	// releases, only the dependents whose run_after has that bit.
	ReleaseAnyway string
	// MoveReady moves the waiting rows of queue $1 among ids $2 whose
	// remaining count is zero into the items table and returns their ids.
	MoveReady string
	// SweepPrereqs: $1 queue, $2 after, $3 limit → the prerequisite of
	// each of the next $3 edges after prerequisite $2, in order.
	SweepPrereqs string
	// KillDependents: $1 queue, $2 and $3 edges read by EdgesFrom from
	// prerequisites that ended without an ack, $4 those prerequisites,
	// $5 how each ended, $6 the RunAfter bits spared → the ids of the
	// dependents it ended. It locks the dependents' waiting rows in id
	// order, skipping those another transaction holds and those whose
	// run_after has a bit of $6, moves them to the dead items (reason 'dependency
	// died: <prerequisite>') and records them as ended (dead).
	KillDependents string
	// DeleteEdgesTo deletes the edges of queue $1 whose dependent is one
	// of $2 (dependents this transaction holds or deleted).
	DeleteEdgesTo string
	// DeleteEdgesGone deletes the edges $2[i] → $3[i] of queue $1 whose
	// dependent is no waiting item (any more), in the order given.
	DeleteEdgesGone string
	// Prereqs: $1 queue, $2 dependent → its prerequisites not yet
	// satisfied. Dependents: $1 queue, $2 prerequisite, $3 limit → the
	// dependents that wait for it. Both take the queue and the id as
	// columns of a one-row subquery (OFFSET 0 keeps PostgreSQL from
	// folding them into constants) that the edges are joined to: the
	// queue is then a join condition, whose share of the table the planner
	// takes as one over the number of queues, and the seek on both key
	// columns is the cheapest plan whatever the statistics say of the
	// queue. With queue = $1, in a database whose statistics predate the
	// queue (TestHotPlansInALivedDatabase), PostgreSQL believed the queue
	// held about one edge and read all of its edges through whichever index
	// gave the order, filtering the id. CockroachDB accepts the form (docs
	// checked: "Selection Queries", a selection query with its OFFSET
	// clause between parentheses as a subquery; "Limit Query Results");
	// its optimizer drops an OFFSET of 0 and constrains the scan by the
	// projected values, the same key seek (not run here: no binary).
	Prereqs, Dependents string
	// Waiting: $1 queue, $2 id → remaining, enqueued_at, run_after (no
	// row: not waiting). WaitingCount: $1 queue → number of waiting items.
	// HasEdges: $1 queue → a row if any item of the queue waits.
	// WaitedFor: $1 queue, $2 ids → those of the ids that items wait for
	// (one seek of the edges' primary key per id).
	Waiting, WaitingCount, HasEdges, WaitedFor string
	// PickWaiting returns up to $2 waiting items of queue $1, oldest
	// first; PurgeWaiting locks those of them ($2) still there in id
	// order, deletes their edges and them, and returns how many it
	// deleted. PickOrphans returns up to $2 edges (prerequisite,
	// dependent) of queue $1 whose dependent is no waiting item, in key
	// order, for DeleteEdgesGone (Purge).
	PickWaiting, PurgeWaiting, PickOrphans string
	// CancelWaiting deletes the waiting item $1 of queue $2, records it
	// as ended (cancelled) and returns its id.
	CancelWaiting string
}

// lockDependents is the CTE d of the statements that lock waiting rows:
// %[1]s is where the rows come from (lockIDs: the waiting rows of the
// queue whose ids an array parameter lists), %[2]s the lock's wait policy
// ("" or " SKIP LOCKED"). On CockroachDB the ids are a placeholder array,
// which becomes sorted index spans, whose rows a locking read locks in key
// order; on PostgreSQL they are looked up one at a time (an index scan of
// 1,000 ids looked dearer than a scan of the table), then sorted and
// locked in that order (a locking clause applies after ORDER BY). The
// queue's check names k too there: a join condition, not a filter on the
// table alone, which made a scan of an empty table look cheaper than the
// lookups (as PostgreSQL's MoveReady).
const lockDependents = `d AS MATERIALIZED (
    SELECT w.id FROM %[1]s
    ORDER BY w.id
    FOR UPDATE OF w%[2]s)`

// lockIDs returns where lockDependents's rows come from on engine d: the
// waiting rows of queue $1 whose ids the array parameter param lists.
func lockIDs(d Dialect, param string) string { return lockIDsWhere(d, param, "") }

// lockIDsWhere is lockIDs with a further condition cond on the waiting
// row w ("" for none). On PostgreSQL it joins the queue's check, in the
// condition that names k (a condition on w alone let PostgreSQL scan the
// table with it as a filter).
func lockIDsWhere(d Dialect, param, cond string) string {
	if cond != "" {
		cond = " AND " + cond
	}
	if d == Postgres {
		return `(SELECT DISTINCT u.dep FROM unnest(` + param + `::UUID[]) AS u (dep)) AS k, crdbwork_waiting AS w
    WHERE w.id = ANY(ARRAY[k.dep]) AND ((w.queue = $1` + cond + `) OR k.dep IS NULL)`
	}
	return `crdbwork_waiting AS w WHERE w.id = ANY(` + param + `::UUID[]) AND (w.queue = $1` + cond + `) IS TRUE`
}

// releaseTemplate is Release: %[1]s is the CTE d (lockDependents), %[2]s
// the edges' delete (releaseEdges), %[3]s the join of the waiting rows to
// the counts (whose check of the queue names c too on PostgreSQL, as in
// lockIDs).
const releaseTemplate = `WITH %[1]s,
gone AS (
    %[2]s
    RETURNING x.dependent),
c AS (SELECT dependent, count(*) AS n FROM gone GROUP BY dependent)
UPDATE crdbwork_waiting AS w SET remaining = w.remaining - c.n
FROM c
WHERE %[3]s
RETURNING w.id, w.remaining, c.n`

// releaseEdges deletes Release's edges: each edge read is looked up by
// its key, (queue, prerequisite, dependent), whichever index the planner
// takes: the primary key, or crdbwork_waits_for_by_dependent_prereq
// (queue, dependent, prerequisite) (schema version 6: the version-5 index
// by (queue, dependent) alone, one condition fewer, looked as cheap to
// PostgreSQL with statistics that believe the queue holds a row, and read
// all of a fan-in join's edges for each edge). %[1]s and %[2]s are the
// edges read and the queue's condition (edgeKeys), %[3]s and %[4]s the
// joins by id, %[5]s the test that the dependent is locked.
const releaseEdges = `DELETE FROM crdbwork_waits_for AS x
    USING %[1]s
    WHERE %[5]s AND %[2]s AND %[3]s AND %[4]s`

// The test that an edge's dependent is one the statement locked (d): a
// join on CockroachDB; on PostgreSQL a hashed subplan over all of d, built
// before the first edge is deleted (IS TRUE keeps it from becoming a join,
// which PostgreSQL's generic plan made a nested loop rescanning d for
// every edge: a million comparisons for a batch of 1,000).
const (
	lockedDep         = `k.dep IN (SELECT d.id FROM d)`
	postgresLockedDep = `(k.dep IN (SELECT d.id FROM d)) IS TRUE`
)

// edgeKeys returns, for engine d, a relation k of the rows of arrays (SQL
// of array parameters, named cols) to join the edges x to, and the
// condition on x's queue. On PostgreSQL k carries the queue too, so that
// the condition is a join condition, x.queue = ANY(ARRAY[k.q]), which
// cannot be applied to the table alone: a queue condition on x alone let
// PostgreSQL read the queue's edges once into a Materialize and join them
// all to every row of k (on a table believed empty).
func edgeKeys(d Dialect, arrays, cols string) (source, queue string) {
	if d == Postgres {
		return `(SELECT u.*, $1::TEXT AS q FROM unnest(` + arrays + `) AS u (` + cols + `) OFFSET 0) AS k`, `x.queue = ANY(ARRAY[k.q])`
	}
	return `unnest(` + arrays + `) AS k (` + cols + `)`, `x.queue = $1`
}

// moveColumns are what MoveReady computes, as enqueue's Insert does: the
// part from the hash and the queue's current parts, the vesting time (the
// enqueue's delay counted from the enqueue, never before now), the deadline
// from the enqueue, at-most-once from the item or its queue.
// The item keeps its headers (the producer's trace context) and its
// sequence order (schema version 6): with its enqueue time, its place among
// its key's items in a sequenced queue. (A row written by version-5 code
// has neither: its item runs without them, as it did.)
const moveReady = `WITH moved AS (
    DELETE FROM crdbwork_waiting AS w %s
    RETURNING id, hash, item_key, priority, delay_us, max_attempts, payload, metadata, tenant, ttl_us, at_most_once, enqueued_at,
              headers, seq_order, timeout_us, kind)
INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, max_attempts, payload, metadata,
     tenant, expires_at, at_most_once, headers, seq_order, timeout_us, kind)
SELECT m.id, $1, m.hash %% n.parts, m.item_key, m.priority,
       GREATEST(now(), m.enqueued_at + m.delay_us * INTERVAL '1 microsecond'),
       GREATEST(now(), m.enqueued_at + m.delay_us * INTERVAL '1 microsecond'),
       m.enqueued_at, CASE WHEN m.at_most_once OR n.amo THEN 1 ELSE m.max_attempts END, m.payload, m.metadata,
       m.tenant, CASE WHEN m.ttl_us > 0 THEN m.enqueued_at + m.ttl_us * INTERVAL '1 microsecond' END,
       m.at_most_once OR n.amo, m.headers, m.seq_order, m.timeout_us, m.kind
FROM moved AS m,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1) AS parts,
             COALESCE((SELECT at_most_once FROM crdbwork_queues WHERE name = $1), false) AS amo) AS n
ON CONFLICT (id) DO NOTHING
RETURNING id`

// killDependents is KillDependents: %[1]s is the CTE d
// (lockDependents), %[2]s the join of the waiting rows to it, %[3]s the CTE
// that records them as ended.
const killDependents = `WITH %[1]s,
k AS (
    SELECT u.dep, min(u.p::TEXT) AS prereq FROM unnest($2::UUID[], $3::UUID[]) AS u (p, dep) GROUP BY u.dep),
gone AS (
    DELETE FROM crdbwork_waiting AS w USING d
    WHERE %[2]s AND (w.queue = $1) IS TRUE
    RETURNING w.id, w.queue, w.hash, w.item_key, w.priority, w.max_attempts, w.payload, w.metadata, w.enqueued_at, w.tenant, w.kind),
%[3]s,
o AS (SELECT id::TEXT AS id, outcome FROM unnest($4::UUID[], $5::TEXT[]) AS u (id, outcome))
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, tenant, reason, kind)
SELECT g.id, g.queue, g.hash %% n.parts, g.item_key, g.priority, 0, g.max_attempts, g.payload, g.metadata,
       'prerequisite ' || k.prereq || ' ended without an ack (' || COALESCE((SELECT o.outcome FROM o WHERE o.id = k.prereq LIMIT 1), 'unknown') || ')',
       g.enqueued_at, g.tenant, 'dependency died: ' || k.prereq, g.kind
FROM gone AS g
JOIN k ON k.dep = g.id,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1) AS parts) AS n
RETURNING id`

// insertWaiting is InsertWaiting: %[1]s and %[2]s are a further array
// parameter and its column (the unique form's outcomes freed, u), %[3]s
// the queue's key (queueKey), %[4]s a further condition on the ended row e
// (the unique form's endedBlocks). $16 is each row's run_after, $17 its
// handler timeout (µs, 0: none, stored as NULL), $18 its kind (NULL: none).
const insertWaiting = `INSERT INTO crdbwork_waiting
    (id, queue, hash, item_key, priority, delay_us, max_attempts, payload, metadata, tenant, ttl_us, at_most_once, remaining,
     headers, seq_order, run_after, timeout_us, kind)
SELECT v.id, $1, v.h, v.k, v.p, v.d, v.m, v.b, v.meta, v.t, v.ttl, v.amo, v.n, v.hd::JSONB, CASE WHEN q.seq AND v.k IS NOT NULL THEN v.o END, v.ra,
       NULLIF(v.tmo, 0), v.kind
FROM (SELECT COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false) AS seq) AS q,
     unnest($2::UUID[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], $8::BYTEA[], $9::BYTEA[],
            $10::TEXT[], $11::BIGINT[], $12::BOOL[], $13::BIGINT[], $14::TEXT[], $15::BIGINT[], $16::BIGINT[], $17::BIGINT[], $18::TEXT[]%[1]s)
         AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, n, hd, o, ra, tmo, kind%[2]s)
WHERE NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v.id OFFSET 0)
  AND NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = %[3]s AND e.id = v.id AND e.ended_at > now() - ` + dedupWindow + `%[4]s OFFSET 0)
ON CONFLICT (id) DO NOTHING
RETURNING id`

// newDependsStatements renders the dependency statements for t and the
// engine d.
func newDependsStatements(t Tables, d Dialect) *dependsStatements {
	r := func(text string) string { return rewrite(t, text) }
	// queueKey is the queue's value in a lookup by a primary key that
	// starts with the queue (the package comment says why).
	queueKey := "$1"
	// byID joins a column to another relation's id.
	byID := func(col, other string) string { return col + " = " + other }
	if d == Postgres {
		queueKey = "(SELECT $1::TEXT)"
		byID = func(col, other string) string { return col + " = ANY(ARRAY[" + other + "])" }
	}
	ids := lockIDs(d, "$3")
	pairs, pairsQueue := edgeKeys(d, "$2::UUID[], $3::UUID[]", "p, dep")
	locks := lockedDep
	if d == Postgres {
		locks = postgresLockedDep
	}
	edges := fmt.Sprintf(releaseEdges, pairs, pairsQueue, byID("x.prereq", "k.p"), byID("x.dependent", "k.dep"), locks)
	to, toQueue := edgeKeys(d, "$2::UUID[]", "id")
	locked, lockedQueue := `d AS k`, `x.queue = $1`
	if d == Postgres {
		locked, lockedQueue = `(SELECT d.id, $1::TEXT AS q FROM d OFFSET 0) AS k`, `x.queue = ANY(ARRAY[k.q])`
	}
	counted := `w.id = c.dependent AND (w.queue = $1) IS TRUE`
	if d == Postgres {
		counted = `w.id = ANY(ARRAY[c.dependent]) AND (w.queue = $1 OR c.dependent IS NULL)`
	}
	release := func(wait string) string {
		return r(fmt.Sprintf(releaseTemplate, fmt.Sprintf(lockDependents, ids, wait), edges, counted))
	}
	// The dependents that run after their prerequisite's end ($4, a
	// RunAfter bit), and those that do not ($6, the bits spared).
	anyway := lockIDsWhere(d, "$3", `(w.run_after & $4::BIGINT) <> 0`)
	spared := lockIDsWhere(d, "$3", `(w.run_after & $6::BIGINT) = 0`)
	s := &dependsStatements{
		Classify: r(`SELECT v.id,
       (SELECT i.queue FROM crdbwork_items AS i WHERE i.id = v.id),
       (SELECT w.queue FROM crdbwork_waiting AS w WHERE w.id = v.id),
       (SELECT e.outcome FROM crdbwork_ended AS e WHERE e.queue = ` + queueKey + ` AND e.id = v.id),
       (SELECT d.queue FROM crdbwork_dead_items AS d WHERE d.id = v.id AND (d.queue = $1) IS TRUE ORDER BY d.id, d.death LIMIT 1) IS NOT NULL
FROM unnest($2::UUID[]) AS v (id)`),
		InsertWaiting: r(fmt.Sprintf(insertWaiting, "", "", queueKey, "")),
		InsertWaitingUnique: r(`WITH ins AS (` + fmt.Sprintf(insertWaiting, ", $19::BIGINT[]", ", u", queueKey, " AND "+endedBlocks) + `),
` + forgetEnded(d) + `
SELECT id FROM ins`),
		InsertEdges:   r(insertEdgesSQL),
		EdgesFrom:     r(dependsEdgesFromSQL),
		Release:       release(""),
		SweepRelease:  release(" SKIP LOCKED"),
		ReleaseAnyway: r(fmt.Sprintf(releaseTemplate, fmt.Sprintf(lockDependents, anyway, " SKIP LOCKED"), edges, counted)),
		MoveReady:     r(dependsMoveReadySQL),
		SweepPrereqs: r(`SELECT prereq FROM crdbwork_waits_for
WHERE queue = ` + queueKey + ` AND prereq > $2
ORDER BY prereq
LIMIT $3`),
		KillDependents: r(fmt.Sprintf(killDependents, fmt.Sprintf(lockDependents, spared, " SKIP LOCKED"), byID("w.id", "d.id"), recordEnded(OutcomeDead, endedFromWaiting))),
		DeleteEdgesTo: r(`DELETE FROM crdbwork_waits_for AS x USING ` + to + `
WHERE ` + toQueue + ` AND ` + byID("x.dependent", "k.id")),
		DeleteEdgesGone: r(`DELETE FROM crdbwork_waits_for AS x
USING ` + pairs + `
WHERE ` + pairsQueue + ` AND ` + byID("x.prereq", "k.p") + ` AND ` + byID("x.dependent", "k.dep") + `
  AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS o WHERE o.id = k.dep OFFSET 0)`),
		Prereqs:      r(prereqsSQL),
		Dependents:   r(dependentsSQL),
		Waiting:      r(waitingSQL),
		WaitingCount: r(waitingCountSQL),
		HasEdges:     r(hasEdgesSQL),
		WaitedFor:    r(waitedForSQL),
		PickWaiting:  r(pickWaitingSQL),
		PurgeWaiting: r(`WITH ` + fmt.Sprintf(lockDependents, lockIDs(d, "$2"), "") + `,
edges AS (
    DELETE FROM crdbwork_waits_for AS x USING ` + locked + `
    WHERE ` + lockedQueue + ` AND ` + byID("x.dependent", "k.id") + `
    RETURNING x.dependent),
gone AS (
    DELETE FROM crdbwork_waiting AS w USING d
    WHERE ` + byID("w.id", "d.id") + ` AND (w.queue = $1) IS TRUE
    RETURNING w.id)
SELECT count(*) FROM gone`),
		PickOrphans:   r(pickOrphansSQL),
		CancelWaiting: r(cancelWaitingSQL),
	}
	if d == Postgres {
		// One prerequisite at a time, each read in the primary key's order
		// up to the limit; then the first of all. PostgreSQL cannot keep
		// the key's order through = ANY on its second column, and its
		// generic plan for the form above read all of the queue's edges
		// in that order, filtering the prerequisites, to stop at the limit
		// (on tables never analyzed, where that looked cheap).
		s.EdgesFrom = r(`SELECT e.prereq, e.dependent
FROM (SELECT DISTINCT u.p FROM unnest($2::UUID[]) AS u (p)) AS k,
     LATERAL (SELECT x.prereq, x.dependent FROM crdbwork_waits_for AS x
              WHERE x.queue = (SELECT $1::TEXT) AND x.prereq = k.p
              ORDER BY x.dependent
              LIMIT $3) AS e
ORDER BY e.prereq, e.dependent
LIMIT $3`)
		// The rows looked up one id at a time; the checks name k too
		// (k.key_id is never NULL where w.id matched it): join conditions,
		// not filters on the table alone, which made a scan of an empty
		// table look cheaper than the lookups (as pgFencedTake).
		s.MoveReady = r(fmt.Sprintf(moveReady, `USING unnest($2::UUID[]) AS k (key_id)
    WHERE w.id = ANY(ARRAY[k.key_id]) AND ((w.queue = $1 AND w.remaining <= 0) OR k.key_id IS NULL)`))
	}
	return s
}

// deps returns the Store's dependency statements for engine d, rendered on
// first use.
func (s *Store) deps(d Dialect) *dependsStatements {
	if d == Cockroach {
		return s.lazyDeps[Cockroach]()
	}
	return s.lazyDeps[Postgres]()
}
