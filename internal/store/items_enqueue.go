package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The enqueue of package claim: the INSERT and the COPY of new items, the
// lookup of the ids an INSERT did not add, the fair turns' reads, and the
// pruning of the ended ids that the dedup window remembers. Errors are the
// driver's, as in items_claim.go.

// EnqueueRow is one item for EnqueueInsert (see enqueueStatements.Insert
// for what the statement computes from it).
type EnqueueRow struct {
	ID uuid.UUID
	// Hash is the item's key hash (non-negative): its part is Hash modulo
	// the queue's number of parts.
	Hash        int64
	Key         string // "" if none
	Priority    int
	Delay       time.Duration // at microsecond precision
	MaxAttempts int
	Payload     []byte // nil is stored as empty
	Metadata    []byte
	Tenant      string        // "" if none
	TTL         time.Duration // 0: no deadline; at microsecond precision
	AtMostOnce  bool
	// Turn is the fair turn enqueue stamped (nil: the vesting time).
	Turn *time.Time
	// Order is the item's sequence order, stored (as seq_order) if the
	// item has a key and the queue is sequenced: items of one key with the
	// same enqueue time are claimed in this order (see sequenceStatements).
	Order int64
	// Headers is a JSON object of string values (nil: none).
	Headers []byte
	// Frees is the set of outcomes (EndedFrees bits) whose ended id does
	// not keep the row out: an id that ended so is added again (claim's
	// UniqueStates). 0: every outcome keeps it out for the queue's dedup
	// window, as before unique states.
	Frees int64
	// Timeout is the item's own handler timeout (0: none, the worker's
	// default), at microsecond precision, stored as timeout_us.
	Timeout time.Duration
	// Kind is the item's kind ("" : none, stored as NULL).
	Kind string
}

// Bits of EnqueueRow.Frees and WaitingRow.Frees: outcomes recorded in
// crdbwork_ended that do not keep an enqueue of the same id out.
const (
	EndedFreesAcked     = 2 // OutcomeAcked and OutcomeTaken
	EndedFreesDead      = 4
	EndedFreesCancelled = 8
)

// endedBlocks is the condition, on a row e of crdbwork_ended and a row v
// of an enqueue with a column u (the row's Frees), that e's outcome keeps
// v out. An outcome this code does not know keeps it out.
const endedBlocks = `(v.u & CASE e.outcome WHEN '` + OutcomeAcked + `' THEN 2 WHEN '` + OutcomeTaken + `' THEN 2 WHEN '` +
	OutcomeDead + `' THEN 4 WHEN '` + OutcomeCancelled + `' THEN 8 ELSE 0 END) = 0`

// anyFrees reports whether some row frees some outcome: the enqueue then
// takes the statements' unique forms.
func anyFrees[T any](rows []T, frees func(*T) int64) bool {
	for i := range rows {
		if frees(&rows[i]) != 0 {
			return true
		}
	}
	return false
}

// insertSQL is the text of enqueueStatements.Insert
// (rendered by newEnqueueStatements).
const insertSQL = insertTemplate + insertTail

// postgresInsertSQL is the text of enqueueStatements.PostgresInsert
// (rendered by newEnqueueStatements).
var postgresInsertSQL = strings.Replace(strings.Replace(insertTemplate, dedupCheck, postgresDedupCheck, 1), waitingCheck, postgresWaitingCheck, 1) +
	` AND NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v.id FOR KEY SHARE OF x)` + insertTail

// ItemsEnqueue adds rows to queue with one INSERT … ON CONFLICT DO NOTHING
// that skips the ids ended within the queue's dedup window, and returns the
// ids it added (enqueueStatements.Insert, or PostgresInsert on PostgreSQL).
//
// A row whose Blocks leaves out some outcomes (claim's UniqueStates) makes
// it take the unique form of the statement (InsertUnique or
// PostgresInsertUnique): an id that ended with an outcome the row does not
// block on is added again, and its ended record deleted in the same
// statement, so that the id is live once more and its next end is recorded
// afresh.
func (s *Store) ItemsEnqueue(ctx context.Context, db DB, d Dialect, queue string, rows []EnqueueRow) ([]uuid.UUID, error) {
	stmt, args := byDialect(d, s.enq.Insert, s.enq.PostgresInsert), s.enqueueArgs(queue, rows)
	if anyFrees(rows, func(r *EnqueueRow) int64 { return r.Frees }) {
		frees := make([]int64, len(rows))
		for j := range rows {
			frees[j] = rows[j].Frees
		}
		stmt, args = byDialect(d, s.enq.InsertUnique, s.enq.PostgresInsertUnique), append(args, frees)
	}
	res, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	return collectIDs(res)
}

// enqueueArgs returns the arguments of enqueueStatements.Insert (and
// PostgresInsert) for rows.
func (s *Store) enqueueArgs(queue string, rows []EnqueueRow) []any {
	n := len(rows)
	// Ids as [16]byte, which pgx encodes directly (see rawIDs).
	ids := make([][16]byte, n)
	hashes, priorities, delays, maxAttempts := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	keys, tenants := make([]*string, n), make([]*string, n)
	ttls, amo, turns, orders := make([]int64, n), make([]bool, n), make([]*time.Time, n), make([]int64, n)
	payloads, metadata := make([][]byte, n), make([][]byte, n)
	headers, timeouts, kinds := make([]*string, n), make([]int64, n), make([]*string, n)
	for j := range rows {
		r := &rows[j]
		ids[j], hashes[j] = r.ID, r.Hash
		timeouts[j] = r.Timeout.Microseconds()
		if r.Kind != "" {
			kinds[j] = &r.Kind
		}
		if r.Key != "" {
			keys[j] = &r.Key
		}
		if r.Tenant != "" {
			tenants[j] = &r.Tenant
		}
		turns[j], orders[j] = r.Turn, r.Order
		ttls[j], amo[j] = r.TTL.Microseconds(), r.AtMostOnce
		priorities[j], delays[j], maxAttempts[j] = int64(r.Priority), r.Delay.Microseconds(), int64(r.MaxAttempts)
		payloads[j], metadata[j] = orEmpty(r.Payload), r.Metadata
		if r.Headers != nil {
			h := string(r.Headers)
			headers[j] = &h
		}
	}
	return []any{queue, ids, hashes, keys, priorities, delays, maxAttempts, payloads, metadata, tenants, ttls, amo, turns, orders, headers, timeouts, kinds}
}

// partsSQL is the text of enqueueStatements.Parts
// (rendered by newEnqueueStatements).
const partsSQL = `SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1), now(),
       COALESCE((SELECT at_most_once FROM crdbwork_queues WHERE name = $1), false),
       COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false)`

// ItemsEnqueueParts returns, for a COPY of new items into queue in the same
// transaction, the queue's number of parts (read under a share lock on its
// row), the transaction's timestamp, whether the queue is at-most-once and
// whether it is sequenced (enqueueStatements.Parts).
func (s *Store) ItemsEnqueueParts(ctx context.Context, db DB, queue string) (parts int64, now time.Time, atMostOnce, sequenced bool, err error) {
	err = db.QueryRow(ctx, s.enq.Parts, queue).Scan(&parts, &now, &atMostOnce, &sequenced)
	return parts, now, atMostOnce, sequenced, err
}

// CopyRow is one item for CopyItems, every column computed by the caller
// as enqueueStatements.Insert computes it in SQL (from EnqueueParts).
type CopyRow struct {
	ID          uuid.UUID
	Part        int64
	Key         string // "" if none
	Priority    int
	VestingAt   time.Time
	MaxAttempts int
	Payload     []byte // nil is stored as empty
	Metadata    []byte
	Tenant      string // "" if none
	TurnAt      time.Time
	ExpiresAt   time.Time // zero: no deadline
	AtMostOnce  bool
	// SeqOrder is the item's seq_order (nil: not sequenced).
	SeqOrder *int64
	Headers  []byte // a JSON object of string values; nil: none
	// Timeout is the item's own handler timeout (0: none), at microsecond
	// precision.
	Timeout time.Duration
	// Kind is the item's kind ("": none).
	Kind string
}

// Copier is what a COPY needs: pgx.Tx, *pgx.Conn and *pgxpool.Pool have it.
type Copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// ItemsEnqueueCopy streams n new items of queue with COPY through c (in binary
// format; enqueueStatements.CopyTable and CopyColumns), row(i) giving item
// i, and returns the rows written. The ids must not be in the items table
// (the COPY has no ON CONFLICT) nor ended (it does not look).
func (s *Store) ItemsEnqueueCopy(ctx context.Context, c Copier, queue string, n int, row func(i int) CopyRow) (int64, error) {
	src := &copySource{queue: queue, n: n, row: row, vals: make([]any, len(s.enq.CopyColumns)), at: -1}
	return c.CopyFrom(ctx, s.enq.CopyTable, s.enq.CopyColumns, src)
}

// copySource gives pgx the COPY rows, one at a time. pgx encodes each
// row's values before it asks for the next, so cur and vals are reused.
type copySource struct {
	queue string
	n     int
	row   func(i int) CopyRow
	cur   CopyRow
	vals  []any
	at    int
}

func (c *copySource) Next() bool { c.at++; return c.at < c.n }
func (c *copySource) Err() error { return nil }

// Values returns the current row in the order of
// enqueueStatements.CopyColumns.
func (c *copySource) Values() ([]any, error) {
	c.cur = c.row(c.at)
	r := &c.cur
	var key, tenant *string
	if r.Key != "" {
		key = &r.Key
	}
	if r.Tenant != "" {
		tenant = &r.Tenant
	}
	var expires *time.Time
	if !r.ExpiresAt.IsZero() {
		expires = &r.ExpiresAt
	}
	c.vals[0], c.vals[1], c.vals[2], c.vals[3] = [16]byte(r.ID), c.queue, r.Part, key
	c.vals[4], c.vals[5], c.vals[6] = int64(r.Priority), r.VestingAt, int64(r.MaxAttempts)
	c.vals[7], c.vals[8] = orEmpty(r.Payload), r.Metadata
	c.vals[9], c.vals[10], c.vals[11], c.vals[12] = tenant, r.TurnAt, expires, r.AtMostOnce
	c.vals[13] = r.SeqOrder
	c.vals[14] = nil
	if r.Headers != nil {
		c.vals[14] = r.Headers // raw JSON, which pgx sends as is
	}
	c.vals[15] = nil
	if us := r.Timeout.Microseconds(); us > 0 {
		c.vals[15] = us
	}
	c.vals[16] = nil
	if r.Kind != "" {
		c.vals[16] = r.Kind
	}
	return c.vals, nil
}

// FoundRow is an id an INSERT into a queue did not add, as EnqueueFound
// explains it.
type FoundRow struct {
	ID uuid.UUID
	// Queue is the queue of the item that holds the id (another queue),
	// or, when Ended, the queue it ended in.
	Queue string
	// Ended reports an id that ended in the queue within its dedup window
	// and is not in the items table.
	Ended bool
}

// foundSQL is the text of enqueueStatements.Found
// (rendered by newEnqueueStatements).
const foundSQL = `SELECT id, queue, false FROM crdbwork_items WHERE id = ANY($2::UUID[]) AND queue <> $1
UNION ALL
SELECT id, queue, false FROM crdbwork_waiting WHERE id = ANY($2::UUID[]) AND queue <> $1
UNION ALL
SELECT e.id, e.queue, true FROM crdbwork_ended AS e
WHERE e.queue = $1 AND e.id = ANY($2::UUID[]) AND e.ended_at > now() - ` + dedupWindow + `
  AND NOT EXISTS (SELECT 1 FROM crdbwork_items AS i WHERE i.id = e.id)
ORDER BY 3, 1`

// ItemsEnqueueFound returns, among ids that an EnqueueInsert into queue did not
// add, those of another queue's items and those that ended in queue within
// its dedup window, ordered by kind, then id (enqueueStatements.Found). The
// others are items of queue.
func (s *Store) ItemsEnqueueFound(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]FoundRow, error) {
	rows, err := db.Query(ctx, s.enq.Found, queue, rawIDs(ids))
	if err != nil {
		return nil, err
	}
	var out []FoundRow
	var id [16]byte
	var f FoundRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &f.Queue, &f.Ended}, func() error {
		f.ID = id
		out = append(out, f)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// pruneEndedSQL is the text of dedupStatements.PruneEnded
// (rendered by newDedupStatements).
const pruneEndedSQL = `WITH old AS MATERIALIZED (
    SELECT id FROM crdbwork_ended
    WHERE queue = $1 AND ended_at < now() - ` + dedupWindow + `
    ORDER BY ended_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM crdbwork_ended AS e
WHERE e.queue = $1 AND e.id IN (SELECT id FROM old) AND e.ended_at < now() - ` + dedupWindow + `
RETURNING e.id`

// EndedPrune deletes, in tx, up to limit of queue's ended ids older than
// its dedup window, oldest first, and returns how many it deleted
// (dedupStatements.PruneEnded). Run it in an explicit SERIALIZABLE
// transaction (it locks with SKIP LOCKED).
func (s *Store) EndedPrune(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, s.dedup.PruneEnded, queue, limit)
	return tag.RowsAffected(), err
}

// FairPair is a (tenant, priority) pair whose latest turn a fair enqueue
// reads.
type FairPair struct {
	Tenant   string
	Priority int64
}

// FairLast is the answer of FairLasts for one pair: the database's now()
// and the tenant's latest unclaimed turn of that priority (nil if none).
type FairLast struct {
	Now  time.Time
	Last *time.Time
}

// ItemsFairLasts reads the latest turns of 1 to MaxFairPairs pairs (it panics
// otherwise) of queue (fairStatements.Lasts): one FairLast per pair, in the
// order of pairs, or nil if the queue is not fair. Nothing is locked.
func (s *Store) ItemsFairLasts(ctx context.Context, db DB, queue string, pairs []FairPair) ([]FairLast, error) {
	rows, err := db.Query(ctx, s.fair.Lasts(len(pairs)), fairArgs(queue, pairs)...)
	if err != nil {
		return nil, err
	}
	return readFairLasts(rows, len(pairs))
}

// ItemsFairLastsQueue queues FairLasts onto b; ReadFairLasts reads its answer
// from the batch's results, in the order the statements were queued.
func (s *Store) ItemsFairLastsQueue(b *pgx.Batch, queue string, pairs []FairPair) {
	b.Queue(s.fair.Lasts(len(pairs)), fairArgs(queue, pairs)...)
}

// ItemsFairLastsRead reads the answer of a FairLasts of n pairs queued by
// QueueFairLasts, as FairLasts returns it.
func (s *Store) ItemsFairLastsRead(r pgx.BatchResults, n int) ([]FairLast, error) {
	rows, err := r.Query()
	if err != nil {
		return nil, err
	}
	return readFairLasts(rows, n)
}

func fairArgs(queue string, pairs []FairPair) []any {
	args := make([]any, 0, 1+2*len(pairs))
	args = append(args, queue)
	for _, p := range pairs {
		args = append(args, p.Tenant, p.Priority)
	}
	return args
}

// readFairLasts reads the rows of fairStatements.Lasts for n pairs: one per
// pair, or none if the queue is not fair.
func readFairLasts(rows pgx.Rows, n int) ([]FairLast, error) {
	defer rows.Close()
	out := make([]FairLast, n)
	got := 0
	for rows.Next() {
		var i int
		var now time.Time
		var last *time.Time
		if err := rows.Scan(&i, &now, &last); err != nil {
			return nil, err
		}
		if i < 0 || i >= n {
			return nil, fmt.Errorf("the fair turns read answered for pair %d of %d", i, n)
		}
		out[i].Now, out[i].Last = now, last
		got++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	switch got {
	case 0:
		return nil, nil
	case n:
		return out, nil
	}
	return nil, fmt.Errorf("the fair turns read answered %d rows for %d pairs", got, n)
}

// fairHeadSQL is the text of coreStatements.FairHead
// (rendered by newCoreStatements).
const fairHeadSQL = fairHead

// postgresFairHeadSQL is the text of coreStatements.PostgresFairHead
// (rendered by newCoreStatements).
var postgresFairHeadSQL = pgHideQueue(fairHead, fairHeadAnchor, "$1")

// ItemsFairHead reads the earliest turn of queue's unclaimed items of priority
// (nil if none; coreStatements.FairHead, or its PostgreSQL twin).
func (s *Store) ItemsFairHead(ctx context.Context, db DB, d Dialect, queue string, priority int64) (*time.Time, error) {
	rows, err := db.Query(ctx, byDialect(d, s.st.FairHead, s.st.PostgresFairHead), queue, priority)
	if err != nil {
		return nil, err
	}
	return readFairHead(rows)
}

// ItemsFairHeadQueue queues FairHead onto b; ReadFairHead reads its answer.
func (s *Store) ItemsFairHeadQueue(b *pgx.Batch, d Dialect, queue string, priority int64) {
	b.Queue(byDialect(d, s.st.FairHead, s.st.PostgresFairHead), queue, priority)
}

// ItemsFairHeadRead reads the answer of a FairHead queued by QueueFairHead.
func (s *Store) ItemsFairHeadRead(r pgx.BatchResults) (*time.Time, error) {
	rows, err := r.Query()
	if err != nil {
		return nil, err
	}
	return readFairHead(rows)
}

func readFairHead(rows pgx.Rows) (*time.Time, error) {
	defer rows.Close()
	var head *time.Time
	for rows.Next() {
		if err := rows.Scan(&head); err != nil {
			return nil, err
		}
	}
	return head, rows.Err()
}

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
	// none; cast to JSONB), $16 handler timeouts in microseconds
	// (BIGINT[], 0 for none: stored as NULL in timeout_us), $17 kinds
	// (TEXT[], NULL for none). Each
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
	// InsertUnique and PostgresInsertUnique are Insert and
	// PostgresInsert with one more parameter, $18 (BIGINT[]): each row's
	// outcomes that do not keep it out (EndedFrees bits). A row whose id
	// ended within the window with an outcome outside its set is added,
	// and the ended record of every row added is deleted in the same
	// statement (the id is live again; its next end records it anew).
	InsertUnique, PostgresInsertUnique string
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
	// payload, metadata, tenant, turn_at, expires_at, at_most_once, seq_order, headers,
	// timeout_us, kind.
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

		InsertUnique:         r(uniqueForm(insertSQL, Cockroach)),
		PostgresInsertUnique: r(uniqueForm(postgresInsertSQL, Postgres)),

		Parts:     r(partsSQL),
		Foreign:   r(`SELECT id, queue FROM crdbwork_items WHERE id = ANY($2::UUID[]) AND queue <> $1 ORDER BY id`),
		Found:     r(foundSQL),
		CopyTable: identifier(t, "items"),
		CopyColumns: []string{"id", "queue", "part", "item_key", "priority", "vesting_at", "max_attempts",
			"payload", "metadata", "tenant", "turn_at", "expires_at", "at_most_once", "seq_order", "headers", "timeout_us", "kind"},
	}
}

// insertTemplate is Insert without its ON CONFLICT clause, insertTail:
// PostgresInsert adds a condition to its WHERE clause between them.
const insertTemplate = `INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, max_attempts, payload, metadata,
     tenant, turn_at, expires_at, at_most_once, seq_order, headers, timeout_us, kind)
SELECT v.id, $1, v.h % n.parts, v.k, v.p, now() + v.d * INTERVAL '1 microsecond',
       CASE WHEN v.amo OR n.amo THEN 1 ELSE v.m END, v.b, v.meta, v.t,
       CASE WHEN v.turn IS NULL THEN now() + v.d * INTERVAL '1 microsecond'
            WHEN v.d > 0 THEN GREATEST(v.turn, now() + v.d * INTERVAL '1 microsecond')
            ELSE v.turn END,
       CASE WHEN v.ttl > 0 THEN now() + v.ttl * INTERVAL '1 microsecond' END,
       v.amo OR n.amo, CASE WHEN n.seq AND v.k IS NOT NULL THEN v.o END, v.hd::JSONB, NULLIF(v.tmo, 0), v.kind
FROM (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1) AS parts,
             COALESCE((SELECT at_most_once FROM crdbwork_queues WHERE name = $1), false) AS amo,
             COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false) AS seq,
             ` + dedupWindow + ` AS win) AS n,
     unnest($2::UUID[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[], $7::BIGINT[], $8::BYTEA[], $9::BYTEA[],
            $10::TEXT[], $11::BIGINT[], $12::BOOL[], $13::TIMESTAMPTZ[], $14::BIGINT[], $15::TEXT[], $16::BIGINT[], $17::TEXT[])
         AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, turn, o, hd, tmo, kind)
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

// uniqueForm returns the unique form of an insert's text (Insert,
// PostgresInsert): the rows take the outcomes they ignore from $18 (v.u),
// the dedup check skips only ids that ended with one of them, and the ended
// records of the ids added are deleted, in a data-modifying CTE (another
// table than the insert's: one modification of each table, as CockroachDB
// requires).
func uniqueForm(insert string, d Dialect) string {
	text := strings.Replace(insert, `$17::TEXT[])`, `$17::TEXT[], $18::BIGINT[])`, 1)
	text = strings.Replace(text, `AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, turn, o, hd, tmo, kind)`, `AS v (id, h, k, p, d, m, b, meta, t, ttl, amo, turn, o, hd, tmo, kind, u)`, 1)
	text = strings.Replace(text, `AND e.ended_at > now() - n.win`, `AND e.ended_at > now() - n.win AND `+endedBlocks, 1)
	return `WITH ins AS (` + text + `),
` + forgetEnded(d) + `
SELECT id FROM ins`
}

// forgetEnded returns the CTE, named forgot, that deletes the ended
// records of queue $1 of the ids of the CTE ins (the unique forms'
// inserts): by primary key, (queue, id). On PostgreSQL the ids are one
// array (= ANY(ARRAY(…)): a scan of the primary key for its values) and
// the queue a value the planner cannot see (as postgresDedupCheck): a
// semi-join let it read the queue's ended ids through
// crdbwork_ended_by_age. CockroachDB plans the IN as a lookup semi-join
// by primary key.
func forgetEnded(d Dialect) string {
	if d == Postgres {
		return `forgot AS (DELETE FROM crdbwork_ended AS e WHERE e.queue = (SELECT $1::TEXT) AND e.id = ANY(ARRAY(SELECT ins.id FROM ins)) RETURNING e.id)`
	}
	return `forgot AS (DELETE FROM crdbwork_ended AS e WHERE e.queue = $1 AND e.id IN (SELECT ins.id FROM ins) RETURNING e.id)`
}

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
