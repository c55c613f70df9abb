package sql

import (
	"fmt"
	"sync"
)

// Dependencies: items that wait for other items of their queue.
//
// A dependent whose prerequisites are not all acked is a row of
// crdbwork_waiting, never of crdbwork_items, so no claim statement of any
// version can hand it out; each of its unsatisfied prerequisites is an edge
// of crdbwork_waits_for, and its remaining column counts them. Right after
// an ack commits, the acking process runs Release and MoveReady in a short
// transaction of its own (READ COMMITTED on PostgreSQL; claim's
// releaseAcked): the edges of the acked items are deleted, their
// dependents' remaining counts go down, and the dependents at zero move
// into the items table in the same transaction. A dependent is released
// exactly once: a row of crdbwork_waiting can be deleted once. The count is
// exact: each edge is deleted, and counted, by one transaction, and the
// decrement is an UPDATE of the waiting row, so the releases of a
// dependent's last two prerequisites queue on that row's lock (and at READ
// COMMITTED the second counts from the first's committed value) instead of
// each seeing the other's edge still there.
//
// Everything else that ends a prerequisite (a death, a cancel, an ack by a
// version-4 worker, which runs no Release, or a Release that failed or
// never ran) is found by every session's
// reaper: it walks the queue's edges by prerequisite (SweepPrereqs),
// classifies the prerequisites (Classify: queued or waiting, or how they
// ended, from crdbwork_ended, the dedup memory, and the dead items) and
// releases the dependents of acked ones (Release, MoveReady) or ends the
// dependents of dead, cancelled or unknown ones (KillDependents and the
// edge deletes), level by level.
//
// CockroachDB checked (docs, "Common Table Expressions"; "DELETE",
// "UPDATE ... FROM"): data-modifying CTEs run whether or not the main query
// reads them, each statement modifies each table once (Release deletes
// edges and updates waiting rows; MoveReady deletes waiting rows and
// inserts items; KillDependents deletes waiting rows and inserts ended and
// dead rows), and = ANY(placeholder array) constrains an index scan.
// min(TEXT) is used where PostgreSQL has no min(UUID).
//
// Plans (TestDependsPlans, on empty and on large analyzed tables): every
// lookup of a given id is a primary-key lookup per id. The NOT EXISTS
// subqueries end in OFFSET 0, which keeps PostgreSQL from turning them into
// anti-joins (it does not pull up a sublink with an OFFSET), which it ran
// as a hash over a scan of the table when it believed the table small;
// CockroachDB drops the OFFSET 0 and plans a lookup anti-join by primary
// key. The dead items' queue is compared in IS TRUE so that it is no index
// condition (as the waiting items' queue in MoveReady, which PostgreSQL
// otherwise read through crdbwork_waiting_by_queue, every waiting item of
// the queue, to intersect with the ids), and the lookup is ordered by the dead items' key (id, death)
// and limited to a row, so that it goes by that key, never through
// crdbwork_dead_items_by_queue nor, on an empty table, by a scan.

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
	// Release deletes the edges of queue $1 whose prerequisite is one of
	// $2, lowers their dependents' remaining counts and returns the
	// dependents (id, remaining). PostgresRelease is its twin, which finds
	// the waiting rows by a primary-key lookup per dependent (see fenced:
	// a join on w.id = c.dependent could become a hash join over a scan).
	Release, PostgresRelease string
	// MoveReady moves the waiting rows of queue $1 among ids $2 whose
	// remaining count is zero into the items table and returns their ids.
	// PostgresMoveReady is its twin (the rows looked up one id at a time,
	// as in PostgresRelease).
	MoveReady, PostgresMoveReady string
	// SweepPrereqs: $1 queue, $2 after, $3 limit → the prerequisite of
	// each of the next $3 edges after prerequisite $2, in order.
	SweepPrereqs string
	// KillDependents moves the waiting dependents of the prerequisites $2
	// (with their outcomes $3) of queue $1 to the dead items, reason
	// 'dependency died: <prerequisite>', records them as ended (dead) and
	// returns their ids. PostgresKillDependents is its twin (the waiting
	// rows looked up one dependent at a time).
	KillDependents, PostgresKillDependents string
	// DeleteEdgesFrom deletes the edges of queue $1 whose prerequisite is
	// one of $2; DeleteEdgesTo those whose dependent is one of $2.
	DeleteEdgesFrom, DeleteEdgesTo string
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
	// PurgeEdges deletes up to $2 edges of queue $1 (Purge). PickWaiting
	// returns up to $2 waiting items of queue $1, oldest first, and
	// DeleteWaiting (PostgresDeleteWaiting on PostgreSQL) deletes those of
	// them, $2, still there.
	PurgeEdges, PickWaiting, DeleteWaiting, PostgresDeleteWaiting string
	// CancelWaiting deletes the waiting item $1 of queue $2, records it
	// as ended (cancelled) and returns its id.
	CancelWaiting string
}

const releaseTemplate = `WITH e AS (
    DELETE FROM crdbwork_waits_for WHERE queue = $1 AND prereq = ANY($2::UUID[])
    RETURNING dependent),
c AS (SELECT dependent, count(*) AS n FROM e GROUP BY dependent)
UPDATE crdbwork_waiting AS w SET remaining = w.remaining - c.n
FROM c
WHERE %s
RETURNING w.id, w.remaining`

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

const killDependents = `WITH d AS (
    SELECT e.dependent, min(e.prereq::TEXT) AS prereq
    FROM crdbwork_waits_for AS e
    WHERE e.queue = $1 AND e.prereq = ANY($2::UUID[])
    GROUP BY e.dependent),
gone AS (
    DELETE FROM crdbwork_waiting AS w %s AND (w.queue = $1) IS TRUE
    RETURNING w.id, w.queue, w.hash, w.item_key, w.priority, w.max_attempts, w.payload, w.metadata, w.enqueued_at, w.tenant),
` + `%s,
o AS (SELECT id::TEXT AS id, outcome FROM unnest($2::UUID[], $3::TEXT[]) AS u (id, outcome))
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, tenant, reason)
SELECT g.id, g.queue, g.hash %% n.parts, g.item_key, g.priority, 0, g.max_attempts, g.payload, g.metadata,
       'prerequisite ' || d.prereq || ' ended without an ack (' || COALESCE((SELECT o.outcome FROM o WHERE o.id = d.prereq LIMIT 1), 'unknown') || ')',
       g.enqueued_at, g.tenant, 'dependency died: ' || d.prereq
FROM gone AS g
JOIN d ON d.dependent = g.id,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1) AS parts) AS n
RETURNING id`

func newDependsStatements(t Tables) *dependsStatements {
	r := t.rewrite
	return &dependsStatements{
		Classify: r(`SELECT v.id,
       (SELECT i.queue FROM crdbwork_items AS i WHERE i.id = v.id),
       (SELECT w.queue FROM crdbwork_waiting AS w WHERE w.id = v.id),
       (SELECT e.outcome FROM crdbwork_ended AS e WHERE e.queue = $1 AND e.id = v.id),
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
  AND NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = $1 AND e.id = v.id AND e.ended_at > now() - ` + dedupWindow + ` OFFSET 0)
ON CONFLICT (id) DO NOTHING
RETURNING id`),
		InsertEdges: r(`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
SELECT $1, v.p, v.d FROM unnest($2::UUID[], $3::UUID[]) AS v (p, d)
ON CONFLICT (queue, prereq, dependent) DO NOTHING`),
		// The waiting rows' queue in conditions that no index of them
		// serves alone (IS TRUE; on PostgreSQL a join condition naming c),
		// so that the planner looks each dependent up by primary key: on a
		// table it believed empty, PostgreSQL read the queue's waiting
		// items through crdbwork_waiting_by_queue instead.
		Release:         r(fmt.Sprintf(releaseTemplate, `w.id = c.dependent AND (w.queue = $1) IS TRUE`)),
		PostgresRelease: r(fmt.Sprintf(releaseTemplate, `w.id = ANY(ARRAY[c.dependent]) AND (w.queue = $1 OR c.dependent IS NULL)`)),
		MoveReady:       r(fmt.Sprintf(moveReady, `WHERE w.id = ANY($2::UUID[]) AND (w.queue = $1) IS TRUE AND w.remaining <= 0`)),
		// The checks name k too (k.key_id is never NULL where w.id matched
		// it): join conditions, not filters on the table alone, which made
		// a scan of an empty table look cheaper than the lookups (as
		// pgFencedTake).
		PostgresMoveReady: r(fmt.Sprintf(moveReady, `USING unnest($2::UUID[]) AS k (key_id)
    WHERE w.id = ANY(ARRAY[k.key_id]) AND ((w.queue = $1 AND w.remaining <= 0) OR k.key_id IS NULL)`)),
		SweepPrereqs: r(`SELECT prereq FROM crdbwork_waits_for
WHERE queue = $1 AND prereq > $2
ORDER BY prereq
LIMIT $3`),
		KillDependents:         r(fmt.Sprintf(killDependents, `WHERE w.id IN (SELECT dependent FROM d)`, recordEnded(OutcomeDead))),
		PostgresKillDependents: r(fmt.Sprintf(killDependents, `USING d WHERE w.id = ANY(ARRAY[d.dependent])`, recordEnded(OutcomeDead))),
		DeleteEdgesFrom:        r(`DELETE FROM crdbwork_waits_for WHERE queue = $1 AND prereq = ANY($2::UUID[])`),
		DeleteEdgesTo:          r(`DELETE FROM crdbwork_waits_for WHERE queue = $1 AND dependent = ANY($2::UUID[])`),
		Prereqs: r(`SELECT e.prereq FROM (SELECT $1::TEXT AS q, $2::UUID AS d OFFSET 0) AS k
JOIN crdbwork_waits_for AS e ON e.queue = k.q AND e.dependent = k.d
ORDER BY e.prereq`),
		Dependents: r(`SELECT e.dependent FROM (SELECT $1::TEXT AS q, $2::UUID AS p OFFSET 0) AS k
JOIN crdbwork_waits_for AS e ON e.queue = k.q AND e.prereq = k.p
ORDER BY e.dependent LIMIT $3`),
		Waiting:      r(`SELECT remaining, enqueued_at FROM crdbwork_waiting WHERE id = $2 AND (queue = $1) IS TRUE`),
		WaitingCount: r(`SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`),
		// In primary-key order with a limit, not EXISTS: PostgreSQL ran an
		// EXISTS as a scan of the table, expecting to meet the queue's
		// edges early.
		HasEdges: r(`SELECT prereq FROM crdbwork_waits_for WHERE queue = $1 ORDER BY prereq LIMIT 1`),
		// As the ack's hasDependents, a subplan per id, the queue a
		// column of a one-row subquery as in Prereqs (a constant queue
		// made PostgreSQL read the queue's every edge per id when its
		// statistics predated the queue).
		WaitedFor: r(`SELECT g.id FROM (SELECT $1::TEXT AS q OFFSET 0) AS k, unnest($2::UUID[]) AS g (id)
WHERE EXISTS (SELECT 1 FROM crdbwork_waits_for AS x WHERE x.queue = k.q AND x.prereq = g.id OFFSET 0)`),
		PurgeEdges: r(`DELETE FROM crdbwork_waits_for
WHERE queue = $1 AND (prereq, dependent) IN (
    SELECT prereq, dependent FROM crdbwork_waits_for WHERE queue = $1 ORDER BY prereq, dependent LIMIT $2)`),
		CancelWaiting: r(deleteEnded(`DELETE FROM crdbwork_waiting WHERE id = $1 AND (queue = $2) IS TRUE`, OutcomeCancelled)),
		PickWaiting:   r(`SELECT id FROM crdbwork_waiting WHERE queue = $1 ORDER BY enqueued_at LIMIT $2`),
		DeleteWaiting: r(`DELETE FROM crdbwork_waiting WHERE id = ANY($2::UUID[]) AND queue = $1`),
		PostgresDeleteWaiting: r(`DELETE FROM crdbwork_waiting AS w USING unnest($2::UUID[]) AS k (key_id)
WHERE w.id = ANY(ARRAY[k.key_id]) AND (w.queue = $1 OR k.key_id IS NULL)`),
	}
}

// dependsByTables caches the rendered statements per table set, as
// NewStore caches Stores.
var dependsByTables sync.Map // Tables → *dependsStatements

func (s *Store) deps() *dependsStatements {
	if d, ok := dependsByTables.Load(s.t); ok {
		return d.(*dependsStatements)
	}
	d, _ := dependsByTables.LoadOrStore(s.t, newDependsStatements(s.t))
	return d.(*dependsStatements)
}
