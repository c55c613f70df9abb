package sql

import (
	"fmt"
	"strings"
)

// Statements holds every statement of packages session, partition and claim,
// rendered for one set of table names. The text is identical on CockroachDB
// and PostgreSQL: each statement uses only forms both engines accept
// (UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) instead of
// CockroachDB's UPDATE ... LIMIT, for instance).
type Statements struct {
	// Sessions.
	CreateSession  string // $1 expiry (microseconds), $2 host, $3 pid, $4 name → id
	Heartbeat      string // $1 id → rows affected (0: the session is gone)
	ReapSessions   string // → rows affected
	DeleteSession  string // $1 id
	LiveSessions   string // → id, name, host, pid, created_at, heartbeat_at, expiry(µs), age(µs), since heartbeat(µs)
	LiveSessionIDs string // → id, ordered

	// Queues and parts.
	QueueParts       string // $1 queue → num_parts (no row: 1 part)
	UpsertQueueParts string // $1 queue, $2 num_parts
	AcquirePart      string // $1 session, $2 queue, $3 part → rows affected (0: owned by another)
	ReleasePart      string // $1 session, $2 queue, $3 part
	OwnedParts       string // $1 session, $2 queue → part
	PartOwners       string // $1 queue → session_id, part
	DropPartsAbove   string // $1 queue, $2 num_parts: deletes part rows >= num_parts
	MovePartsAbove   string // $1 queue, $2 num_parts: moves items of parts >= num_parts

	// Items.
	Enqueue         string // prefix; see EnqueueRows
	ClaimAny        string // $1 session, $2 queue, $3 limit → item columns
	ClaimParts      string // $1 session, $2 queue, $3 limit, $4 parts → item columns
	AckAny          string // $1 id, $2 session, $3 attempts
	AckPart         string // $1 id, $2 session, $3 attempts, $4 part
	Nack            string // $1 id, $2 session, $3 attempts, $4 delay(µs), $5 error
	Release         string // $1 id, $2 session, $3 attempts
	DeadLetter      string // $1 id, $2 session, $3 attempts, $4 error
	Cancel          string // $1 id, $2 queue → rows affected
	DeadItems       string // $1 queue, $2 limit → dead item columns, newest first
	Requeue         string // $1 id, $2 queue → id of the item put back
	Backlog         string // → queue, part, unclaimed, vested, claimed
	DeadCount       string // $1 queue → count
	ItemColumns     string
	enqueueTemplate string
}

// itemColumns are the columns every claim statement returns, in order.
const itemColumns = `id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, enqueued_at, vesting_at, last_error, claim_part`

// NewStatements renders the statements for t.
func NewStatements(t Tables) *Statements {
	r := t.rewrite
	return &Statements{
		CreateSession: r(`INSERT INTO crdbwork_sessions (expiry, host, pid, name)
VALUES ($1::BIGINT * INTERVAL '1 microsecond', $2, $3, $4) RETURNING id`),
		Heartbeat:     r(`UPDATE crdbwork_sessions SET heartbeat_at = now() WHERE id = $1`),
		ReapSessions:  r(`DELETE FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()`),
		DeleteSession: r(`DELETE FROM crdbwork_sessions WHERE id = $1`),
		LiveSessions: r(`SELECT id, name, host, pid, created_at, heartbeat_at,
       (EXTRACT(EPOCH FROM expiry) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - created_at) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - heartbeat_at) * 1000000)::BIGINT
FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id`),
		LiveSessionIDs: r(`SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id`),

		QueueParts: r(`SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1), 1)`),
		UpsertQueueParts: r(`INSERT INTO crdbwork_queues AS q (name, num_parts) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET num_parts = excluded.num_parts`),
		AcquirePart: r(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING`),
		ReleasePart:    r(`DELETE FROM crdbwork_session_parts WHERE session_id = $1 AND queue = $2 AND part = $3`),
		OwnedParts:     r(`SELECT part FROM crdbwork_session_parts WHERE session_id = $1 AND queue = $2 ORDER BY part`),
		PartOwners:     r(`SELECT session_id, part FROM crdbwork_session_parts WHERE queue = $1 ORDER BY part`),
		DropPartsAbove: r(`DELETE FROM crdbwork_session_parts WHERE queue = $1 AND part >= $2`),
		MovePartsAbove: r(`UPDATE crdbwork_items SET part = part % $2, claim_queue = NULL, claim_part = NULL
WHERE queue = $1 AND part >= $2`),

		ClaimAny: r(`UPDATE crdbwork_items
SET claim = $1, claimed_at = now(), attempts = attempts + 1
WHERE id = ANY(ARRAY(
    SELECT id FROM crdbwork_items
    WHERE queue = $2 AND claim IS NULL AND vesting_at <= now()
    ORDER BY priority, vesting_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))
  AND claim IS NULL
RETURNING ` + itemColumns),
		ClaimParts: r(`UPDATE crdbwork_items
SET claim = $1, claim_queue = queue, claim_part = part, claimed_at = now(), attempts = attempts + 1
WHERE id = ANY(ARRAY(
    SELECT id FROM crdbwork_items
    WHERE queue = $2 AND part = ANY($4::BIGINT[]) AND claim IS NULL AND vesting_at <= now()
    ORDER BY priority, vesting_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))
  AND claim IS NULL
RETURNING ` + itemColumns),
		AckAny:  r(`DELETE FROM crdbwork_items WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3`),
		AckPart: r(`DELETE FROM crdbwork_items WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3 AND claim_part = $4`),
		Nack: r(`UPDATE crdbwork_items
SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL,
    vesting_at = now() + $4::BIGINT * INTERVAL '1 microsecond', last_error = $5
WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3`),
		Release: r(`UPDATE crdbwork_items
SET claim = NULL, claim_queue = NULL, claim_part = NULL, claimed_at = NULL, attempts = attempts - 1
WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3`),
		DeadLetter: r(`WITH gone AS (
    DELETE FROM crdbwork_items WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3
    RETURNING id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, enqueued_at)
INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, $4, enqueued_at FROM gone
RETURNING id`),
		Cancel: r(`DELETE FROM crdbwork_items WHERE id = $1 AND queue = $2`),
		DeadItems: r(`SELECT id, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, died_at
FROM crdbwork_dead_items WHERE queue = $1
ORDER BY died_at DESC, id
LIMIT $2`),
		// A requeued item keeps its id, key, priority and enqueue time, gets
		// fresh attempts and is claimable at once. Its part is taken modulo
		// the queue's current number of parts, as SetParts does for items.
		Requeue: r(`WITH gone AS (
    DELETE FROM crdbwork_dead_items WHERE id = $1 AND queue = $2
    RETURNING id, queue, part, item_key, priority, max_attempts, payload, metadata, last_error, enqueued_at)
INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, max_attempts, payload, metadata, last_error, enqueued_at)
SELECT g.id, g.queue, g.part % n.parts, g.item_key, g.priority, now(), g.max_attempts, g.payload, g.metadata, g.last_error, g.enqueued_at
FROM gone AS g,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $2 FOR SHARE), 1) AS parts) AS n
RETURNING id`),
		Backlog: r(`SELECT queue, part,
       count(*) FILTER (WHERE claim IS NULL),
       count(*) FILTER (WHERE claim IS NULL AND vesting_at <= now()),
       count(*) FILTER (WHERE claim IS NOT NULL)
FROM crdbwork_items GROUP BY queue, part ORDER BY queue, part`),
		DeadCount:   r(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`),
		ItemColumns: itemColumns,
		enqueueTemplate: r(`INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, max_attempts, payload, metadata)
SELECT v.id, $1, v.h % n.parts, v.k, v.p, now() + v.d * INTERVAL '1 microsecond', v.m, v.b, v.meta
FROM (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1) AS parts) AS n,
     (VALUES %s) AS v (id, h, k, p, d, m, b, meta)`),
	}
}

// EnqueueParams is the number of parameters each row of EnqueueRows takes.
const EnqueueParams = 8

// EnqueueRows returns the statement that inserts rows items into queue $1.
// Row i takes parameters 2+8i .. 9+8i: id, key hash (non-negative), key,
// priority, delay (µs), max attempts, payload, metadata. Each item's part is
// its key hash modulo the queue's number of parts, read in the same statement
// so that every producer agrees with the database.
func (s *Statements) EnqueueRows(rows int) string {
	var b strings.Builder
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		p := 2 + EnqueueParams*i
		fmt.Fprintf(&b, "($%d::UUID, $%d::BIGINT, $%d::TEXT, $%d::BIGINT, $%d::BIGINT, $%d::BIGINT, $%d::BYTEA, $%d::BYTEA)",
			p, p+1, p+2, p+3, p+4, p+5, p+6, p+7)
	}
	return strings.Replace(s.enqueueTemplate, "%s", b.String(), 1)
}
