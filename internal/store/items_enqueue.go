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
}

// insertSQL is the text of enqueueStatements.Insert
// (rendered by newEnqueueStatements).
const insertSQL = insertTemplate + insertTail

// postgresInsertSQL is the text of enqueueStatements.PostgresInsert
// (rendered by newEnqueueStatements).
var postgresInsertSQL = strings.Replace(strings.Replace(insertTemplate, dedupCheck, postgresDedupCheck, 1), waitingCheck, postgresWaitingCheck, 1) +
	` AND NOT EXISTS (SELECT 1 FROM crdbwork_items AS x WHERE x.id = v.id FOR KEY SHARE OF x)` + insertTail

// EnqueueInsert adds rows to queue with one INSERT … ON CONFLICT DO NOTHING
// that skips the ids ended within the queue's dedup window, and returns the
// ids it added (enqueueStatements.Insert, or PostgresInsert on PostgreSQL).
func (s *Store) EnqueueInsert(ctx context.Context, db DB, d Dialect, queue string, rows []EnqueueRow) ([]uuid.UUID, error) {
	res, err := db.Query(ctx, byDialect(d, s.enq.Insert, s.enq.PostgresInsert), s.enqueueArgs(queue, rows)...)
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
	headers := make([]*string, n)
	for j := range rows {
		r := &rows[j]
		ids[j], hashes[j] = r.ID, r.Hash
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
	return []any{queue, ids, hashes, keys, priorities, delays, maxAttempts, payloads, metadata, tenants, ttls, amo, turns, orders, headers}
}

// partsSQL is the text of enqueueStatements.Parts
// (rendered by newEnqueueStatements).
const partsSQL = `SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $1 FOR SHARE), 1), now(),
       COALESCE((SELECT at_most_once FROM crdbwork_queues WHERE name = $1), false),
       COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $1), false)`

// EnqueueParts returns, for a COPY of new items into queue in the same
// transaction, the queue's number of parts (read under a share lock on its
// row), the transaction's timestamp, whether the queue is at-most-once and
// whether it is sequenced (enqueueStatements.Parts).
func (s *Store) EnqueueParts(ctx context.Context, db DB, queue string) (parts int64, now time.Time, atMostOnce, sequenced bool, err error) {
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
}

// Copier is what a COPY needs: pgx.Tx, *pgx.Conn and *pgxpool.Pool have it.
type Copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// CopyItems streams n new items of queue with COPY through c (in binary
// format; enqueueStatements.CopyTable and CopyColumns), row(i) giving item
// i, and returns the rows written. The ids must not be in the items table
// (the COPY has no ON CONFLICT) nor ended (it does not look).
func (s *Store) CopyItems(ctx context.Context, c Copier, queue string, n int, row func(i int) CopyRow) (int64, error) {
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

// EnqueueFound returns, among ids that an EnqueueInsert into queue did not
// add, those of another queue's items and those that ended in queue within
// its dedup window, ordered by kind, then id (enqueueStatements.Found). The
// others are items of queue.
func (s *Store) EnqueueFound(ctx context.Context, db DB, queue string, ids []uuid.UUID) ([]FoundRow, error) {
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

// PruneEnded deletes, in tx, up to limit of queue's ended ids older than
// its dedup window, oldest first, and returns how many it deleted
// (dedupStatements.PruneEnded). Run it in an explicit SERIALIZABLE
// transaction (it locks with SKIP LOCKED).
func (s *Store) PruneEnded(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
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

// FairLasts reads the latest turns of 1 to MaxFairPairs pairs (it panics
// otherwise) of queue (fairStatements.Lasts): one FairLast per pair, in the
// order of pairs, or nil if the queue is not fair. Nothing is locked.
func (s *Store) FairLasts(ctx context.Context, db DB, queue string, pairs []FairPair) ([]FairLast, error) {
	rows, err := db.Query(ctx, s.fair.Lasts(len(pairs)), fairArgs(queue, pairs)...)
	if err != nil {
		return nil, err
	}
	return readFairLasts(rows, len(pairs))
}

// QueueFairLasts queues FairLasts onto b; ReadFairLasts reads its answer
// from the batch's results, in the order the statements were queued.
func (s *Store) QueueFairLasts(b *pgx.Batch, queue string, pairs []FairPair) {
	b.Queue(s.fair.Lasts(len(pairs)), fairArgs(queue, pairs)...)
}

// ReadFairLasts reads the answer of a FairLasts of n pairs queued by
// QueueFairLasts, as FairLasts returns it.
func (s *Store) ReadFairLasts(r pgx.BatchResults, n int) ([]FairLast, error) {
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

// FairHead reads the earliest turn of queue's unclaimed items of priority
// (nil if none; coreStatements.FairHead, or its PostgreSQL twin).
func (s *Store) FairHead(ctx context.Context, db DB, d Dialect, queue string, priority int64) (*time.Time, error) {
	rows, err := db.Query(ctx, byDialect(d, s.st.FairHead, s.st.PostgresFairHead), queue, priority)
	if err != nil {
		return nil, err
	}
	return readFairHead(rows)
}

// QueueFairHead queues FairHead onto b; ReadFairHead reads its answer.
func (s *Store) QueueFairHead(b *pgx.Batch, d Dialect, queue string, priority int64) {
	b.Queue(byDialect(d, s.st.FairHead, s.st.PostgresFairHead), queue, priority)
}

// ReadFairHead reads the answer of a FairHead queued by QueueFairHead.
func (s *Store) ReadFairHead(r pgx.BatchResults) (*time.Time, error) {
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
