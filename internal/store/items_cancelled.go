package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Cancelled items kept for a requeue (schema version 6): every cancel
// that ends an item (an unclaimed item's cancel, the end of a claimed
// one's, the reaper's) writes what a requeue needs into
// crdbwork_cancelled_items, in the same statement as its ended record
// (keepCancelled), for the queue's dedup window; every session's reaper
// prunes the older rows with the ended ids (CancelledPrune). A requeue moves
// the row back into the items table and deletes its ended record, in one
// statement: the item is never in both tables, nor in neither, and its
// id is live again (an enqueue of it is a live duplicate, not done). The
// row is requeued only while the id's ended record says cancelled: once
// the id ran again (an enqueue with UniqueStates) or was forgotten, the row
// is stale and is not brought back.
//
// CockroachDB checked: data-modifying CTEs on other tables than the
// statement's own (one modification of each table), as the dead items'
// Requeue.

// cancelledRequeueSQL is the text of cancelledStatements.requeue.
//
// The kept row is looked up by id, its queue compared in IS TRUE (no index
// condition): the primary key (id, queue) is the only index the lookup can
// use. With the queue an index condition, PostgreSQL took
// crdbwork_cancelled_items_by_age (queue, cancelled_at) as just as cheap
// on a table whose statistics knew nothing of it, and would read the
// queue's kept rows through it (TestExplainCancelStatements).
var cancelledRequeueSQL = `WITH gone AS (
    DELETE FROM crdbwork_cancelled_items AS c
    WHERE c.id = $1 AND (c.queue = $2) IS TRUE
      AND EXISTS (SELECT 1 FROM crdbwork_ended AS e WHERE e.queue = $2 AND e.id = $1 AND e.outcome = '` + OutcomeCancelled + `')
      AND NOT EXISTS (SELECT 1 FROM crdbwork_items WHERE id = $1)
      AND NOT EXISTS (SELECT 1 FROM crdbwork_waiting WHERE id = $1)
    RETURNING c.id, c.queue, c.part, c.item_key, c.priority, c.max_attempts, c.payload, c.metadata, c.tenant, c.headers,
              c.enqueued_at, c.claim_token, c.seq_order, c.kind),
revived AS (DELETE FROM crdbwork_ended WHERE queue = $2 AND id IN (SELECT id FROM gone) RETURNING id),
` + historyWrite("hist", "gone", historyRequeued(OutcomeCancelled)) + `
INSERT INTO crdbwork_items
    (id, queue, part, item_key, priority, vesting_at, turn_at, max_attempts, payload, metadata, enqueued_at, claim_token, tenant, headers, seq_order, kind)
SELECT g.id, g.queue, g.part % n.parts, g.item_key, g.priority, now(), now(), g.max_attempts, g.payload, g.metadata, g.enqueued_at,
       g.claim_token, g.tenant, g.headers,
       ` + requeuedSeqOrder + `, g.kind
FROM gone AS g,
     (SELECT COALESCE((SELECT num_parts FROM crdbwork_queues WHERE name = $2 FOR SHARE), 1) AS parts,
             COALESCE((SELECT sequenced FROM crdbwork_queues WHERE name = $2), false) AS sequenced) AS n
RETURNING id`

// cancelledStateSQL is the text of cancelledStatements.state: why a
// requeue moved nothing.
const cancelledStateSQL = `SELECT (SELECT queue FROM crdbwork_items WHERE id = $1),
       (SELECT queue FROM crdbwork_waiting WHERE id = $1),
       EXISTS (SELECT 1 FROM crdbwork_cancelled_items AS c WHERE c.id = $1 AND (c.queue = $2) IS TRUE),
       COALESCE((SELECT e.outcome FROM crdbwork_ended AS e WHERE e.queue = $2 AND e.id = $1), '')`

// cancelledListSQL is the text of cancelledStatements.list.
const cancelledListSQL = `SELECT c.id, c.cancelled_at FROM crdbwork_cancelled_items AS c
WHERE c.queue = $1 AND (c.cancelled_at, c.id) > ($2::TIMESTAMPTZ, $3::UUID) AND ($5 = '' OR c.kind = $5)
ORDER BY c.cancelled_at, c.id
LIMIT $4`

// cancelledPruneSQL is the text of cancelledStatements.prune (as
// pruneEndedSQL).
const cancelledPruneSQL = `WITH old AS MATERIALIZED (
    SELECT id FROM crdbwork_cancelled_items
    WHERE queue = $1 AND cancelled_at < now() - ` + dedupWindow + `
    ORDER BY cancelled_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM crdbwork_cancelled_items AS c
WHERE c.queue = $1 AND c.id IN (SELECT id FROM old) AND c.cancelled_at < now() - ` + dedupWindow + `
RETURNING c.id`

// cancelledStatements are the statements of the cancelled items kept for
// a requeue, rendered for one set of table names; the text is identical
// on CockroachDB and PostgreSQL.
type cancelledStatements struct {
	requeue string // $1 id, $2 queue → id moved
	state   string // $1 id, $2 queue → item's queue, waiting item's queue, kept, ended outcome
	list    string // $1 queue, $2 after time, $3 after id, $4 limit, $5 kind ('': any) → id, cancelled_at
	prune   string // $1 queue, $2 limit → ids pruned
}

// cancelled returns the Store's cancelledStatements, rendered on first use.
func (s *Store) cancelled() *cancelledStatements { return s.lazyCancelled() }

func newCancelledStatements(t Tables) *cancelledStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &cancelledStatements{
		requeue: r(cancelledRequeueSQL),
		state:   r(cancelledStateSQL),
		list:    r(cancelledListSQL),
		prune:   r(cancelledPruneSQL),
	}
}

// CancelledRequeueResult is what CancelledRequeue did.
type CancelledRequeueResult struct {
	// Moved reports that the item went back into the items table.
	Moved bool
	// LiveQueue is the queue of an item or (Waiting) waiting item with the
	// id, if any (Live); read only when nothing moved.
	LiveQueue     string
	Live, Waiting bool
	// Kept reports that a kept row of the id was found (read only when
	// nothing moved); Outcome is the id's ended outcome ("" if none).
	Kept    bool
	Outcome string
}

// CancelledRequeue moves, in tx (SERIALIZABLE), the cancelled item id of
// queue kept in crdbwork_cancelled_items back into the items table, with a
// fresh attempt count, no delay and its claim token, and deletes its ended
// record. If nothing moved it reads why.
func (s *Store) CancelledRequeue(ctx context.Context, tx pgx.Tx, id uuid.UUID, queue string) (CancelledRequeueResult, error) {
	var r CancelledRequeueResult
	c := s.cancelled()
	tag, err := tx.Exec(ctx, c.requeue, [16]byte(id), queue)
	if err != nil {
		return r, err
	}
	if r.Moved = tag.RowsAffected() == 1; r.Moved {
		return r, nil
	}
	var live, waiting *string
	if err := tx.QueryRow(ctx, c.state, [16]byte(id), queue).Scan(&live, &waiting, &r.Kept, &r.Outcome); err != nil {
		return CancelledRequeueResult{}, err
	}
	switch {
	case live != nil:
		r.LiveQueue, r.Live = *live, true
	case waiting != nil:
		r.LiveQueue, r.Live, r.Waiting = *waiting, true, true
	}
	return r, nil
}

// KeptCancelled is one row of CancelledList.
type KeptCancelled struct {
	ID          uuid.UUID
	CancelledAt time.Time
}

// CancelledList returns up to limit of queue's kept cancelled items after
// (afterAt, afterID) in (cancelled_at, id) order, oldest first; only those
// of kind if it is not "".
func (s *Store) CancelledList(ctx context.Context, db DB, queue, kind string, afterAt time.Time, afterID uuid.UUID, limit int) ([]KeptCancelled, error) {
	rows, err := db.Query(ctx, s.cancelled().list, queue, afterAt, [16]byte(afterID), limit, kind)
	if err != nil {
		return nil, err
	}
	var out []KeptCancelled
	var id [16]byte
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		out = append(out, KeptCancelled{ID: id, CancelledAt: at})
		return nil
	})
	return out, err
}

// CancelledPrune deletes, in tx (SERIALIZABLE), up to limit of queue's
// kept cancelled items older than its dedup window, oldest first, and
// returns how many (cancelledStatements.prune).
func (s *Store) CancelledPrune(ctx context.Context, tx pgx.Tx, queue string, limit int) (int64, error) {
	tag, err := tx.Exec(ctx, s.cancelled().prune, queue, limit)
	return tag.RowsAffected(), err
}
