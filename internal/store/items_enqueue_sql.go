package store

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// enqueueStatements are the statements of claim.Queue's enqueue, rendered
// for one set of table names. The text is identical on CockroachDB and
// PostgreSQL. Rows are passed as one array per column (unnest), so that a
// statement takes the same nine parameters whatever its number of rows, and
// as a COPY in binary format, which both engines accept (CockroachDB
// requires the INSERT privilege on the table, as PostgreSQL does).
type enqueueStatements struct {
	// Insert adds rows to queue $1 and returns the id of each row it added;
	// a row whose id is already in the items table is skipped (ON CONFLICT
	// DO NOTHING), and so is a row whose id is a waiting item's
	// (crdbwork_waiting, of any queue) or ended in queue $1 within the
	// queue's dedup window (crdbwork_ended: a lookup by primary key per
	// row), so running it again after an unknown outcome adds no
	// duplicates, even once the first copy was acked. Parameters, one array element per row: $2 ids (UUID[]),
	// $3 key hashes (BIGINT[], non-negative), $4 keys (TEXT[], NULL for
	// none), $5 priorities (BIGINT[]), $6 delays in microseconds
	// (BIGINT[]), $7 max attempts (BIGINT[]), $8 payloads (BYTEA[]), $9
	// metadata (BYTEA[]), $10 tenants (TEXT[], NULL for none), $11 time to
	// live in microseconds (BIGINT[], 0 for none), $12 at-most-once
	// (BOOL[]), $13 fair turns (TIMESTAMPTZ[], NULL: the vesting time), $14
	// sequence orders (BIGINT[]: stored as seq_order for the items with a
	// key of a sequenced queue, read in the same statement; see
	// sequenceStatements), $15 headers (TEXT[] of JSON objects, NULL for
	// none; cast to JSONB). Each
	// row's part is its key hash modulo the queue's number of parts, read in
	// the same statement under a share lock, so that no enqueue can slip an
	// item into a part that SetParts removes. An item is at-most-once if it
	// says so or its queue does; an at-most-once item has one attempt. A
	// delayed item's turn is never before its vesting time (so that claims,
	// which read in turn order, do not walk over items not yet vested).
	Insert string
	// PostgresInsert is Insert on PostgreSQL: the same parameters and
	// results, its dedup check kept a per-row primary-key probe
	// (postgresDedupCheck), and a row whose id is an item of the table is skipped by a
	// locking read of that item (FOR KEY SHARE) before the insert. The
	// lock closes a race the dedup check alone leaves open there: an ack
	// of the id that commits while the insert waits for the item's row has
	// recorded the id as ended after the insert's snapshot, so the insert
	// neither sees the record nor, once the acked row is gone, a conflict,
	// and added the id again (TestEnqueueOfAnIDBeingAckedAddsNothing). The
	// locking read waits for the ack instead, and in the SERIALIZABLE
	// transaction an enqueue of caller-given ids runs in on PostgreSQL
	// (claim's needsTx) a row deleted by a transaction that committed after
	// the snapshot is a serialization failure ("could not serialize access
	// due to concurrent delete"): the enqueue is retried, and its new
	// snapshot finds the ended id. Acks do not prevent it on PostgreSQL:
	// they run at READ COMMITTED (AckTxOptions), whose writes take part in
	// no serializable conflict check — and under SERIALIZABLE acks the
	// check did not catch it either (the test failed on the former code
	// too). CockroachDB's SERIALIZABLE transactions serialize the insert
	// after the ack (or fail it), and its FOR KEY SHARE is no lock by
	// default under SERIALIZABLE: it keeps Insert.
	PostgresInsert string
	// Parts returns the queue $1's number of parts (1 when it has no row),
	// taking a share lock on its row, the transaction's timestamp (now())
	// whether the queue is at-most-once and whether it is sequenced (its
	// items with a key then get their seq_order). A COPY that follows it in the
	// same transaction computes parts, vesting times, turns, deadlines and
	// delivery from these, exactly as Insert does in SQL.
	Parts string
	// Foreign returns the id and queue of the rows among ids $2 (UUID[])
	// that belong to a queue other than $1.
	Foreign string
	// Found returns, for the ids $2 (UUID[]) that an Insert into queue $1
	// did not add, those that belong to another queue's item or waiting
	// item (false, the item's queue) and those that ended in queue $1 within its dedup
	// window and are not in the items table (true, $1): the others are
	// items of queue $1. Ordered by kind, then id.
	Found string
	// CopyTable and CopyColumns name the COPY's target; a row gives, in
	// order: id, queue, part, item_key, priority, vesting_at, max_attempts,
	// payload, metadata, tenant, turn_at, expires_at, at_most_once, seq_order, headers.
	// enqueued_at takes its default, now().
	CopyTable   pgx.Identifier
	CopyColumns []string
}

// newEnqueueStatements renders the enqueue statements for t.
func newEnqueueStatements(t Tables) *enqueueStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &enqueueStatements{
		Insert:         r(insertSQL),
		PostgresInsert: r(postgresInsertSQL),

		Parts:     r(partsSQL),
		Foreign:   r(`SELECT id, queue FROM crdbwork_items WHERE id = ANY($2::UUID[]) AND queue <> $1 ORDER BY id`),
		Found:     r(foundSQL),
		CopyTable: identifier(t, "items"),
		CopyColumns: []string{"id", "queue", "part", "item_key", "priority", "vesting_at", "max_attempts",
			"payload", "metadata", "tenant", "turn_at", "expires_at", "at_most_once", "seq_order", "headers"},
	}
}

// insertTemplate is Insert without its ON CONFLICT clause, insertTail:
// PostgresInsert adds a condition to its WHERE clause between them.
const insertTemplate = `INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, max_attempts, payload, metadata,
     tenant, turn_at, expires_at, at_most_once, seq_order, headers)
SELECT v.id, $1, v.h % n.parts, v.k, v.p, now() + v.d * INTERVAL '1 microsecond',
       CASE WHEN v.amo OR n.amo THEN 1 ELSE v.m END, v.b, v.meta, v.t,
       CASE WHEN v.turn IS NULL THEN now() + v.d * INTERVAL '1 microsecond'
            WHEN v.d > 0 THEN GREATEST(v.turn, now() + v.d * INTERVAL '1 microsecond')
            ELSE v.turn END,
       CASE WHEN v.ttl > 0 THEN now() + v.ttl * INTERVAL '1 microsecond' END,
       v.amo OR n.amo, CASE WHEN n.seq AND v.k IS NOT NULL THEN v.o END, v.hd::JSONB
FROM (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1) AS parts,
             COALESCE((SELECT at_most_once FROM crdbwork_queues WHERE name = $1), false) AS amo,
             COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false) AS seq,
             ` + dedupWindow + ` AS win) AS n,
     unnest($2::UUID[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], $8::BYTEA[], $9::BYTEA[],
            $10::TEXT[], $11::BIGINT[], $12::BOOL[], $13::TIMESTAMPTZ[], $14::BIGINT[], $15::TEXT[])
         AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, turn, o, hd)
WHERE ` + dedupCheck + ` AND ` + waitingCheck

// waitingCheck is the insert's check that the id is not a waiting item's
// (crdbwork_waiting, docs/dependencies.md), of any queue: an enqueue of
// such an id, with or without NewItem.After, is a duplicate, never a second,
// claimable copy next to the item that waits (a primary-key lookup per row).
// A waiting item that moves into the items table while the insert runs is
// caught by the insert's ON CONFLICT on the items' primary key instead.
const waitingCheck = `NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS w WHERE w.id = v.id)`

// postgresWaitingCheck is waitingCheck on PostgreSQL, kept a per-row probe
// for the reason of postgresDedupCheck.
const postgresWaitingCheck = `NOT EXISTS (SELECT 1 FROM crdbwork_waiting AS w WHERE w.id = v.id OFFSET 0)`

// dedupCheck is the insert's dedup check: no row of the id ended in queue
// $1 within its window.
const dedupCheck = `NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = $1 AND e.id = v.id AND e.ended_at > now() - n.win)`

// postgresDedupCheck is dedupCheck on PostgreSQL: OFFSET 0 keeps the
// planner from pulling the subquery up into an anti-join (PostgreSQL
// turns an EXISTS into a join only when the subquery has no OFFSET; see
// simplify_EXISTS_query in its planner, subselect.c), so it stays a
// subplan run per inserted row, which can only look the id up: one
// primary-key probe (queue, id) per row whatever the statistics say. As a
// join, while the statistics of crdbwork_ended said it was empty (never
// analyzed, or analyzed empty), the planner chose a hash anti-join over
// every id the queue ended within its window, read through
// crdbwork_ended_by_age: up to a day of acks per enqueue on a busy queue,
// until autovacuum analyzed the table (TestHotPlansInEveryState).
//
// The queue is compared with (SELECT $1::TEXT), an InitPlan's value that
// the planner cannot see, not with $1: for a queue the statistics do not
// know (a queue that filled after the last ANALYZE while other queues held
// the ended ids), PostgreSQL estimated the queue's ended ids at about one
// row, and crdbwork_ended_by_age (queue, ended_at) then cost the same as
// the primary key (queue, id): the probe of each row read every id the
// queue ended within its window (TestHotPlansWhenTheStatisticsMissAQueue).
// Against a value it cannot see, the planner takes the queue's share as
// one over the number of queues, and only the seek on both key columns is
// cheap.
const postgresDedupCheck = `NOT EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = (SELECT $1::TEXT) AND e.id = v.id AND e.ended_at > now() - n.win OFFSET 0)`

const insertTail = `
ON CONFLICT (id) DO NOTHING
RETURNING id`

// identifier returns the unquoted parts of one table's name, by its default
// name without the prefix, for APIs that quote names themselves (CopyFrom).
func identifier(t Tables, suffix string) pgx.Identifier {
	name := prefix(t) + strings.TrimPrefix(suffix, defaultPrefix)
	if t.Schema != "" {
		return pgx.Identifier{t.Schema, name}
	}
	return pgx.Identifier{name}
}
