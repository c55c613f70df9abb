package store

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Prerequisites in other queues (schema version 6, claim.NewItem.AfterIn).
//
// An edge from an item P of queue A to a waiting item D of queue B is a row
// (A, P, B, D) of crdbwork_waits_across, counted in D's remaining like any
// edge, and a hint (A, P, D) in crdbwork_waits_for: the ack of P finds the
// hint with the seek every ack makes (hasDependents), and its release
// (claim's releaseAcked) reads P's rows here (AcrossFrom) and releases D
// with AcrossRelease, which deletes the row and its hint together. The row
// is the truth, the hint only a trigger: version-5 code, which never reads
// this table, deletes the hint when it acks or ends P and lowers no count
// (D is no waiting item of A), and the sweep of B's reaper (AcrossInto,
// then the same statements, skipping locked dependents) settles the row by
// how P ended in A. This code's same-queue statements leave a hint alone
// while D waits (its dependent is no waiting row of A) and delete it with
// the orphans once D is gone.
//
// The lock order is the package's: the dependents' waiting rows in id
// order first (lockDependents), then their rows here and their hints, then
// the rows written for them.

// AcrossEdge is one cross-queue edge: Dependent, a waiting item of
// DependentQueue, waits for Prereq, an item of PrereqQueue.
type AcrossEdge struct {
	PrereqQueue    string
	Prereq         uuid.UUID
	DependentQueue string
	Dependent      uuid.UUID
}

// acrossStatements are the statements of cross-queue edges for one table
// set and engine.
type acrossStatements struct {
	// Insert: $1 dependent queue, $2 prerequisite queues, $3 prerequisites,
	// $4 dependents → adds the rows and their hints.
	Insert string
	// From: $1 prerequisite queue, $2 prerequisites, $3 limit →
	// prerequisite, dependent queue, dependent, in key order.
	From string
	// Into: $1 dependent queue, $2 the last dependent of the previous
	// batch, $3 limit → prerequisite queue, prerequisite, dependent, in
	// (dependent, prerequisite queue, prerequisite) order.
	Into string
	// Release, SweepRelease: $1 dependent queue, $2 prerequisites, $3
	// dependents (pairs), $4 prerequisite queue → locks the dependents
	// (waiting for, or skipping, those another transaction holds), deletes
	// those rows and their hints, lowers the counts: id, remaining, n.
	// ReleaseAnyway is SweepRelease for dependents whose run_after has the
	// bit $5.
	Release, SweepRelease, ReleaseAnyway string
	// DeleteTo: $1 dependent queue, $2 dependents → deletes their rows and
	// hints (the dependents ended).
	DeleteTo string
	// DeleteGone: $1 prerequisite queue, $2 prerequisites, $3 dependents
	// (pairs) → deletes those rows and hints whose dependent is no waiting
	// item.
	DeleteGone string
	// Prereqs: $1 dependent queue, $2 dependent → prerequisite queue,
	// prerequisite. Dependents: $1 prerequisite queue, $2 prerequisite, $3
	// limit → dependent queue, dependent.
	Prereqs, Dependents string
}

// acrossReleaseTemplate is Release: %[1]s is the CTE d (lockDependents),
// %[2]s the relation k of the pairs (prerequisite p, dependent dep) and
// %[3]s the condition that finds an edge x by its key from k (acrossKeys),
// %[4]s the test that k's dependent is locked, %[5]s the hints' key from
// the deleted rows g, %[6]s the join of the waiting rows to the counts c
// (as the same-queue Release's).
const acrossReleaseTemplate = `WITH %[1]s,
gone AS (
    DELETE FROM crdbwork_waits_across AS x
    USING %[2]s
    WHERE %[3]s AND %[4]s
    RETURNING x.prereq_queue, x.prereq, x.dependent),
hints AS (
    DELETE FROM crdbwork_waits_for AS h USING gone AS g
    WHERE %[5]s
    RETURNING h.dependent),
c AS (SELECT g.dependent, count(*) AS n FROM gone AS g GROUP BY g.dependent)
UPDATE crdbwork_waiting AS w SET remaining = w.remaining - c.n
FROM c
WHERE %[6]s
RETURNING w.id, w.remaining, c.n`

// acrossKeys returns, for engine d, the relation k of the pairs of array
// parameters ps and ds (prerequisites and dependents) of the prerequisite
// queue pq (a parameter), the condition that finds the edge x of each by
// its primary key, and the condition that finds the hint h of each row g
// deleted. On PostgreSQL the queue is a column of k and every key column
// is compared with = ANY(ARRAY[…]): one primary-key lookup per pair,
// never a read of the prerequisite queue's rows through the key's first
// column (the same-queue statements' edgeKeys says why).
func acrossKeys(d Dialect, pq, ps, ds string) (source, edge, hint string) {
	if d == Postgres {
		return `(SELECT u.p, u.dep, ` + pq + `::TEXT AS pq FROM unnest(` + ps + `::UUID[], ` + ds + `::UUID[]) AS u (p, dep) OFFSET 0) AS k`,
			`x.prereq_queue = ANY(ARRAY[k.pq]) AND x.prereq = ANY(ARRAY[k.p]) AND x.dependent = ANY(ARRAY[k.dep])`,
			`h.queue = ANY(ARRAY[g.prereq_queue]) AND h.prereq = ANY(ARRAY[g.prereq]) AND h.dependent = ANY(ARRAY[g.dependent])`
	}
	return `unnest(` + ps + `::UUID[], ` + ds + `::UUID[]) AS k (p, dep)`,
		`x.prereq_queue = ` + pq + ` AND x.prereq = k.p AND x.dependent = k.dep`,
		`h.queue = g.prereq_queue AND h.prereq = g.prereq AND h.dependent = g.dependent`
}

// newAcrossStatements renders the cross-queue statements for t and d.
func newAcrossStatements(t Tables, d Dialect) *acrossStatements {
	r := func(text string) string { return rewrite(t, text) }
	queueKey := "$1"
	if d == Postgres {
		queueKey = "(SELECT $1::TEXT)"
	}
	source, edge, hint := acrossKeys(d, "$4", "$2", "$3")
	locked, counted := lockedDep, `w.id = c.dependent AND (w.queue = $1) IS TRUE`
	if d == Postgres {
		locked, counted = postgresLockedDep, `w.id = ANY(ARRAY[c.dependent]) AND (w.queue = $1 OR c.dependent IS NULL)`
	}
	release := func(ids, wait string) string {
		return r(fmt.Sprintf(acrossReleaseTemplate, fmt.Sprintf(lockDependents, ids, wait), source, edge, locked, hint, counted))
	}
	goneSource, goneEdge, goneHint := acrossKeys(d, "$1", "$2", "$3")
	s := &acrossStatements{
		Insert: r(`WITH x AS (
    INSERT INTO crdbwork_waits_across (prereq_queue, prereq, dependent_queue, dependent)
    SELECT v.q, v.p, $1, v.d FROM unnest($2::TEXT[], $3::UUID[], $4::UUID[]) AS v (q, p, d)
    ON CONFLICT (prereq_queue, prereq, dependent) DO NOTHING
    RETURNING prereq_queue, prereq, dependent)
INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT x.prereq_queue, x.prereq, x.dependent FROM x
ON CONFLICT (queue, prereq, dependent) DO NOTHING`),
		From: r(`SELECT prereq, dependent_queue, dependent FROM crdbwork_waits_across
WHERE prereq_queue = $1 AND prereq = ANY($2::UUID[])
ORDER BY prereq, dependent
LIMIT $3`),
		Into: r(`SELECT prereq_queue, prereq, dependent FROM crdbwork_waits_across
WHERE dependent_queue = ` + queueKey + ` AND dependent > $2
ORDER BY dependent, prereq_queue, prereq
LIMIT $3`),
		Release:       release(lockIDs(d, "$3"), ""),
		SweepRelease:  release(lockIDs(d, "$3"), " SKIP LOCKED"),
		ReleaseAnyway: release(lockIDsWhere(d, "$3", `(w.run_after & $5::BIGINT) <> 0`), " SKIP LOCKED"),
		DeleteTo: r(`WITH gone AS (
    DELETE FROM crdbwork_waits_across AS x
    WHERE x.dependent_queue = $1 AND x.dependent = ANY($2::UUID[])
    RETURNING x.prereq_queue, x.prereq, x.dependent)
DELETE FROM crdbwork_waits_for AS h USING gone AS g
WHERE h.queue = g.prereq_queue AND h.prereq = g.prereq AND h.dependent = g.dependent`),
		DeleteGone: r(`WITH gone AS (
    DELETE FROM crdbwork_waits_across AS x
    USING ` + goneSource + `
    WHERE ` + goneEdge + `
      AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS o WHERE o.id = k.dep OFFSET 0)
    RETURNING x.prereq_queue, x.prereq, x.dependent)
DELETE FROM crdbwork_waits_for AS h USING gone AS g
WHERE ` + goneHint),
		Prereqs: r(`SELECT prereq_queue, prereq FROM crdbwork_waits_across
WHERE dependent_queue = $1 AND dependent = $2
ORDER BY prereq_queue, prereq`),
		Dependents: r(`SELECT dependent_queue, dependent FROM crdbwork_waits_across
WHERE prereq_queue = $1 AND prereq = $2
ORDER BY dependent LIMIT $3`),
	}
	if d == Postgres {
		// One prerequisite at a time, in the primary key's order, as the
		// same-queue EdgesFrom (its comment says why).
		s.From = r(`SELECT e.prereq, e.dependent_queue, e.dependent
FROM (SELECT DISTINCT u.p FROM unnest($2::UUID[]) AS u (p)) AS k,
     LATERAL (SELECT x.prereq, x.dependent_queue, x.dependent FROM crdbwork_waits_across AS x
              WHERE x.prereq_queue = (SELECT $1::TEXT) AND x.prereq = k.p
              ORDER BY x.dependent
              LIMIT $3) AS e
ORDER BY e.prereq, e.dependent
LIMIT $3`)
	}
	return s
}

// across returns the Store's cross-queue statements for engine d,
// rendered on first use.
func (s *Store) across(d Dialect) *acrossStatements {
	if d == Cockroach {
		return s.lazyAcross[Cockroach]()
	}
	return s.lazyAcross[Postgres]()
}

// ItemsDepsInsertAcross records, for the waiting items dependents[i] of
// dependentQueue, that each waits for prereqs[i], an item of
// prereqQueues[i], with the hints the prerequisites' acks find
// (acrossStatements.Insert).
func (s *Store) ItemsDepsInsertAcross(ctx context.Context, db DB, dependentQueue string, prereqQueues []string, prereqs, dependents []uuid.UUID) error {
	_, err := db.Exec(ctx, s.across(Postgres).Insert, dependentQueue, prereqQueues, rawIDs(prereqs), rawIDs(dependents))
	return err
}

// ItemsDepsAcrossFrom returns up to limit of the cross-queue edges from
// prereqs, items of prereqQueue, in key order (acrossStatements.From).
func (s *Store) ItemsDepsAcrossFrom(ctx context.Context, db DB, d Dialect, prereqQueue string, prereqs []uuid.UUID, limit int) ([]AcrossEdge, error) {
	rows, err := db.Query(ctx, s.across(d).From, prereqQueue, rawIDs(prereqs), limit)
	if err != nil {
		return nil, err
	}
	var out []AcrossEdge
	var p, dep [16]byte
	var dq string
	_, err = pgx.ForEachRow(rows, []any{&p, &dq, &dep}, func() error {
		out = append(out, AcrossEdge{PrereqQueue: prereqQueue, Prereq: p, DependentQueue: dq, Dependent: dep})
		return nil
	})
	return out, err
}

// ItemsDepsAcrossInto returns up to limit of the cross-queue edges into
// dependentQueue whose dependents come after the id after, in
// (dependent, prerequisite queue, prerequisite) order: the dependent
// queue's sweep (acrossStatements.Into).
func (s *Store) ItemsDepsAcrossInto(ctx context.Context, db DB, d Dialect, dependentQueue string, after uuid.UUID, limit int) ([]AcrossEdge, error) {
	rows, err := db.Query(ctx, s.across(d).Into, dependentQueue, [16]byte(after), limit)
	if err != nil {
		return nil, err
	}
	var out []AcrossEdge
	var p, dep [16]byte
	var pq string
	_, err = pgx.ForEachRow(rows, []any{&pq, &p, &dep}, func() error {
		out = append(out, AcrossEdge{PrereqQueue: pq, Prereq: p, DependentQueue: dependentQueue, Dependent: dep})
		return nil
	})
	return out, err
}

// ItemsDepsAcrossRelease releases, in tx, the dependents of edges (all from
// prerequisites of prereqQueue that are acked, or, with runAfter, that
// ended with that RunAfter bit, to dependents of dependentQueue): it locks
// the dependents' waiting rows in id order (skipping those another
// transaction holds if skipLocked; runAfter implies it), deletes the edges
// and their hints, lowers the counts and moves the dependents at zero into
// their queue's items table (acrossStatements.Release, SweepRelease or
// ReleaseAnyway, then MoveReady). Left are the edges whose dependents it
// did not hold: gone (DeleteAcrossGone), held by another transaction, or,
// with runAfter, not running after that end.
func (s *Store) ItemsDepsAcrossRelease(ctx context.Context, tx pgx.Tx, d Dialect, dependentQueue, prereqQueue string, edges []Edge, skipLocked bool, runAfter int64) (ReleaseResult, error) {
	var res ReleaseResult
	if len(edges) == 0 {
		return res, nil
	}
	st := s.across(d)
	ps, ds := edgeArrays(edges)
	args := []any{dependentQueue, ps, ds, prereqQueue}
	stmt := st.Release
	switch {
	case runAfter != 0:
		stmt, args = st.ReleaseAnyway, append(args, runAfter)
	case skipLocked:
		stmt = st.SweepRelease
	}
	rows, err := tx.Query(ctx, stmt, args...)
	if err != nil {
		return res, err
	}
	return s.moveReleased(ctx, tx, d, dependentQueue, rows, edges, res)
}

// ItemsDepsAcrossKill ends, in tx, the dependents of edges (from
// prerequisites of prereqQueue that ended without an ack, outcomes[i]
// saying how prereqs[i] ended, to dependents of dependentQueue) that
// another transaction does not hold and whose run_after has no bit of
// spare: dead with reason "dependency died: <prerequisite>", recorded as
// ended (dead), their same-queue edges and cross-queue rows and hints
// deleted (dependsStatements.KillDependents, DeleteEdgesTo;
// acrossStatements.DeleteTo).
func (s *Store) ItemsDepsAcrossKill(ctx context.Context, tx pgx.Tx, d Dialect, dependentQueue string, edges []Edge, prereqs []uuid.UUID, outcomes []string, spare int64) (KillResult, error) {
	var res KillResult
	if len(edges) == 0 {
		return res, nil
	}
	return s.killEdges(ctx, tx, d, dependentQueue, edges, prereqs, outcomes, spare, res)
}

// ItemsDepsDeleteAcrossTo deletes the cross-queue edges into dependents,
// items of dependentQueue that ended or left (and their hints):
// acrossStatements.DeleteTo.
func (s *Store) ItemsDepsDeleteAcrossTo(ctx context.Context, db DB, dependentQueue string, dependents []uuid.UUID) error {
	_, err := db.Exec(ctx, s.across(Postgres).DeleteTo, dependentQueue, rawIDs(dependents))
	return err
}

// ItemsDepsDeleteAcrossGone deletes those of edges (from prerequisites of
// prereqQueue) whose dependents are no waiting items, with their hints,
// and returns how many it deleted (acrossStatements.DeleteGone).
func (s *Store) ItemsDepsDeleteAcrossGone(ctx context.Context, db DB, prereqQueue string, edges []Edge) (int64, error) {
	if len(edges) == 0 {
		return 0, nil
	}
	ps, ds := edgeArrays(edges)
	tag, err := db.Exec(ctx, s.across(Postgres).DeleteGone, prereqQueue, ps, ds)
	return tag.RowsAffected(), err
}

// ItemsDepsAcrossPrereqs returns the prerequisites in other queues that
// dependent, a waiting item of dependentQueue, still waits for
// (acrossStatements.Prereqs).
func (s *Store) ItemsDepsAcrossPrereqs(ctx context.Context, db DB, dependentQueue string, dependent uuid.UUID) ([]AcrossEdge, error) {
	rows, err := db.Query(ctx, s.across(Postgres).Prereqs, dependentQueue, [16]byte(dependent))
	if err != nil {
		return nil, err
	}
	var out []AcrossEdge
	var p [16]byte
	var pq string
	_, err = pgx.ForEachRow(rows, []any{&pq, &p}, func() error {
		out = append(out, AcrossEdge{PrereqQueue: pq, Prereq: p, DependentQueue: dependentQueue, Dependent: dependent})
		return nil
	})
	return out, err
}

// ItemsDepsAcrossDependents returns up to limit of the items of other
// queues that wait for prereq, an item of prereqQueue
// (acrossStatements.Dependents).
func (s *Store) ItemsDepsAcrossDependents(ctx context.Context, db DB, prereqQueue string, prereq uuid.UUID, limit int) ([]AcrossEdge, error) {
	rows, err := db.Query(ctx, s.across(Postgres).Dependents, prereqQueue, [16]byte(prereq), limit)
	if err != nil {
		return nil, err
	}
	var out []AcrossEdge
	var dep [16]byte
	var dq string
	_, err = pgx.ForEachRow(rows, []any{&dq, &dep}, func() error {
		out = append(out, AcrossEdge{PrereqQueue: prereqQueue, Prereq: prereq, DependentQueue: dq, Dependent: dep})
		return nil
	})
	return out, err
}
