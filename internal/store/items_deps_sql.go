package store

import (
	"fmt"
)

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
	// of JSON objects, NULL for none), $15 sequence orders (stored as
	// seq_order for the rows with a key while the queue is sequenced, read
	// in the same statement, as enqueue's Insert does: the move into the
	// items table carries both over).
	InsertWaiting string
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
	// MoveReady moves the waiting rows of queue $1 among ids $2 whose
	// remaining count is zero into the items table and returns their ids.
	MoveReady string
	// SweepPrereqs: $1 queue, $2 after, $3 limit → the prerequisite of
	// each of the next $3 edges after prerequisite $2, in order.
	SweepPrereqs string
	// KillDependents: $1 queue, $2 and $3 edges read by EdgesFrom from
	// prerequisites that ended without an ack, $4 those prerequisites,
	// $5 how each ended → the ids of the dependents it ended. It locks the
	// dependents' waiting rows in id order, skipping those another
	// transaction holds, moves them to the dead items (reason 'dependency
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
	// Waiting: $1 queue, $2 id → remaining, enqueued_at (no row: not
	// waiting). WaitingCount: $1 queue → number of waiting items.
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
func lockIDs(d Dialect, param string) string {
	if d == Postgres {
		return `(SELECT DISTINCT u.dep FROM unnest(` + param + `::UUID[]) AS u (dep)) AS k, crdbwork_waiting AS w
    WHERE w.id = ANY(ARRAY[k.dep]) AND (w.queue = $1 OR k.dep IS NULL)`
	}
	return `crdbwork_waiting AS w WHERE w.id = ANY(` + param + `::UUID[]) AND (w.queue = $1) IS TRUE`
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
              headers, seq_order)
INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, turn_at, enqueued_at, max_attempts, payload, metadata,
     tenant, expires_at, at_most_once, headers, seq_order)
SELECT m.id, $1, m.hash %% n.parts, m.item_key, m.priority,
       GREATEST(now(), m.enqueued_at + m.delay_us * INTERVAL '1 microsecond'),
       GREATEST(now(), m.enqueued_at + m.delay_us * INTERVAL '1 microsecond'),
       m.enqueued_at, CASE WHEN m.at_most_once OR n.amo THEN 1 ELSE m.max_attempts END, m.payload, m.metadata,
       m.tenant, CASE WHEN m.ttl_us > 0 THEN m.enqueued_at + m.ttl_us * INTERVAL '1 microsecond' END,
       m.at_most_once OR n.amo, m.headers, m.seq_order
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
    RETURNING w.id, w.queue, w.hash, w.item_key, w.priority, w.max_attempts, w.payload, w.metadata, w.enqueued_at, w.tenant),
%[3]s,
o AS (SELECT id::TEXT AS id, outcome FROM unnest($4::UUID[], $5::TEXT[]) AS u (id, outcome))
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, tenant, reason)
SELECT g.id, g.queue, g.hash %% n.parts, g.item_key, g.priority, 0, g.max_attempts, g.payload, g.metadata,
       'prerequisite ' || k.prereq || ' ended without an ack (' || COALESCE((SELECT o.outcome FROM o WHERE o.id = k.prereq LIMIT 1), 'unknown') || ')',
       g.enqueued_at, g.tenant, 'dependency died: ' || k.prereq
FROM gone AS g
JOIN k ON k.dep = g.id,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1) AS parts) AS n
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
	s := &dependsStatements{
		Classify: r(`SELECT v.id,
       (SELECT i.queue FROM crdbwork_items AS i WHERE i.id = v.id),
       (SELECT w.queue FROM crdbwork_waiting AS w WHERE w.id = v.id),
       (SELECT e.outcome FROM crdbwork_ended AS e WHERE e.queue = ` + queueKey + ` AND e.id = v.id),
       (SELECT d.queue FROM crdbwork_dead_items AS d WHERE d.id = v.id AND (d.queue = $1) IS TRUE ORDER BY d.id, d.death LIMIT 1) IS NOT NULL
FROM unnest($2::UUID[]) AS v (id)`),
		InsertWaiting: r(`INSERT INTO crdbwork_waiting
    (id, queue, hash, item_key, priority, delay_us, max_attempts, payload, metadata, tenant, ttl_us, at_most_once, remaining,
     headers, seq_order)
SELECT v.id, $1, v.h, v.k, v.p, v.d, v.m, v.b, v.meta, v.t, v.ttl, v.amo, v.n, v.hd::JSONB, CASE WHEN q.seq AND v.k IS NOT NULL THEN v.o END
FROM (SELECT COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false) AS seq) AS q,
     unnest($2::UUID[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], $8::BYTEA[], $9::BYTEA[],
            $10::TEXT[], $11::BIGINT[], $12::BOOL[], $13::BIGINT[], $14::TEXT[], $15::BIGINT[])
         AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, n, hd, o)
WHERE NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v.id OFFSET 0)
  AND NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = ` + queueKey + ` AND e.id = v.id AND e.ended_at > now() - ` + dedupWindow + ` OFFSET 0)
ON CONFLICT (id) DO NOTHING
RETURNING id`),
		InsertEdges:  r(insertEdgesSQL),
		EdgesFrom:    r(dependsEdgesFromSQL),
		Release:      release(""),
		SweepRelease: release(" SKIP LOCKED"),
		MoveReady:    r(dependsMoveReadySQL),
		SweepPrereqs: r(`SELECT prereq FROM crdbwork_waits_for
WHERE queue = ` + queueKey + ` AND prereq > $2
ORDER BY prereq
LIMIT $3`),
		KillDependents: r(fmt.Sprintf(killDependents, fmt.Sprintf(lockDependents, ids, " SKIP LOCKED"), byID("w.id", "d.id"), recordEnded(OutcomeDead))),
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
