package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The demo's statements (cmd/demo): what the demo reads of crdbwork's tables
// to check its own runs, and what its cleanup deletes. Applications do not
// need them; the operator CLI has its own.
//
// CockroachDB checked (docs, "Common Table Expressions", "Aggregate
// functions", "DELETE"): count(*) FILTER (WHERE ...), multi-argument unnest
// in FROM with a column alias list, EXISTS subqueries, EXTRACT(EPOCH FROM
// interval), DELETE ... WHERE (a, b) IN (SELECT ... LIMIT n) and DROP TABLE
// IF EXISTS are accepted; the text is identical on both engines. Not run on
// a cluster here (no CockroachDB binary). PostgreSQL plans: internal/store/explain_test.go
// (TestDemoPlans).

// demoStatements are the demo's statements for one set of tables.
type demoStatements struct {
	// countItems counts queue $1's items, claimed or not.
	countItems string // $1 queue → count
	// itemFates classifies the ids $2 (of queues $1, pairwise): in the items
	// table (and of those: claimed, claimed past their lease, the oldest
	// claim's age in seconds), else dead, else cancelled (an ended row with
	// outcome cancelled). Items by id (primary key), dead items by id (the
	// primary key's prefix), ended ids by (queue, id) (primary key).
	itemFates string // $1 queues, $2 ids → pending, claimed, past lease, oldest claim s, dead, cancelled
	// workedQueues lists the queues that live sessions (heartbeat within
	// their expiry, as LiveSessions) own parts of or are members of.
	workedQueues string // → queue names
	// deleteItems deletes up to $2 unclaimed and up to $2 claimed items of
	// queue $1 (through the partial indexes, as countItems);
	// deleteDeadItems and deleteEnded delete up to $2 rows of queue $1 from
	// the dead items (through crdbwork_dead_items_by_queue) and ended
	// (primary key) tables.
	deleteItems     string // $1 queue, $2 limit
	deleteDeadItems string // $1 queue, $2 limit
	deleteEnded     string // $1 queue, $2 limit
	// deleteQueueRest delete queue $1's part owners, memberships, tenant
	// limits, schedules and its row in the queues table.
	deleteQueueRest []string // each: $1 queue
	// dropTables drops every crdbwork table, children before parents.
	dropTables []string
}

// demoTableOrder is the order the crdbwork tables are dropped in: children
// before the tables their foreign keys name.
var demoTableOrder = []string{"items", "dead_items", "ended", "cancelled_items", "waits_for", "waits_across", "waiting", "audit", "attempt_errors",
	"session_parts", "session_queues", "sessions", "queues", "tenant_limits", "schedules", "reaps", "schema_version"}

// demoSQL returns the Store's demo statements, rendered on first use.
func (s *Store) demoSQL() *demoStatements { return s.lazyDemo() }

// newDemoStatements renders the demo's statements for t.
func newDemoStatements(t Tables) *demoStatements {
	d := &demoStatements{
		countItems:      rewrite(t, countItemsSQL),
		itemFates:       rewrite(t, itemFatesSQL),
		workedQueues:    rewrite(t, workedQueuesSQL),
		deleteItems:     rewrite(t, deleteItemsSQL),
		deleteDeadItems: rewrite(t, deleteDeadItemsSQL),
		deleteEnded:     rewrite(t, deleteEndedSQL),
	}
	for _, table := range []string{"session_parts", "session_queues", "tenant_limits", "schedules"} {
		d.deleteQueueRest = append(d.deleteQueueRest, `DELETE FROM `+t.Table(table)+` WHERE queue = $1`)
	}
	d.deleteQueueRest = append(d.deleteQueueRest, `DELETE FROM `+t.Table("queues")+` WHERE name = $1`)
	for _, table := range demoTableOrder {
		d.dropTables = append(d.dropTables, `DROP TABLE IF EXISTS `+t.Table(table))
	}
	// And the SQL enqueue function (enqueue_function.go), which names them.
	fn := pgx.Identifier{prefix(t) + "enqueue"}
	if t.Schema != "" {
		fn = pgx.Identifier{t.Schema, prefix(t) + "enqueue"}
	}
	d.dropTables = append(d.dropTables, `DROP FUNCTION IF EXISTS `+fn.Sanitize())
	return d
}

// countItemsSQL is the text of demoStatements.countItems
// (rendered by newDemoStatements).
//
// Two counts, each through a partial index on the queue (the items
// table has none on the queue alone): the unclaimed items through
// crdbwork_items_part_turn, the claimed ones through
// crdbwork_items_lease.
const countItemsSQL = `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL)
    + (SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL)`

// VerifyCountItems returns the number of queue's items, claimed or not. It reads
// every item of the queue (through the partial indexes of unclaimed and of
// claimed items on the queue), not the other queues' items.
func (s *Store) VerifyCountItems(ctx context.Context, db DB, queue string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, s.demoSQL().countItems, queue).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the items of %q: %w", queue, Classify(err))
	}
	return n, nil
}

// ItemRef names an item by its queue and id.
type ItemRef struct {
	Queue string
	ID    uuid.UUID
}

// ItemFates counts where a set of items are now (Store.VerifyItemFates).
type ItemFates struct {
	// Pending items are in the items table; of them, Claimed are held by
	// a session, PastLease held past their lease, and OldestClaim is the
	// age of the oldest claim (0 if none).
	Pending, Claimed, PastLease int64
	OldestClaim                 time.Duration
	// Dead items are not in the items table and have a death in the dead
	// items table.
	Dead int64
	// Cancelled items are in neither, and their queue's ended ids record
	// them as cancelled (Queue.Cancel), within the queue's dedup window.
	Cancelled int64
}

// itemFatesSQL is the text of demoStatements.itemFates
// (rendered by newDemoStatements).
const itemFatesSQL = `SELECT
    count(*) FILTER (WHERE f.item IS NOT NULL),
    count(*) FILTER (WHERE f.claim IS NOT NULL),
    count(*) FILTER (WHERE f.claim IS NOT NULL AND f.lease_until < now()),
    COALESCE(EXTRACT(EPOCH FROM now() - min(f.claimed_at) FILTER (WHERE f.claim IS NOT NULL)), 0)::FLOAT8,
    count(*) FILTER (WHERE f.item IS NULL AND f.dead),
    count(*) FILTER (WHERE f.item IS NULL AND NOT f.dead AND f.outcome = 'cancelled')
FROM (
    SELECT i.id AS item, i.claim, i.lease_until, i.claimed_at,
        EXISTS (SELECT 1 FROM crdbwork_dead_items AS d WHERE d.id = e.id) AS dead,
        n.outcome
    FROM unnest($1::TEXT[], $2::UUID[]) AS e (queue, id)
    LEFT JOIN crdbwork_items AS i ON i.id = e.id
    LEFT JOIN crdbwork_ended AS n ON n.queue = e.queue AND n.id = e.id
) AS f`

// VerifyItemFates classifies items: pending (and claimed), dead or cancelled.
// Items in none of these (acked, taken at most once, pruned from the ended
// ids, or never enqueued) are counted nowhere. Each item costs a point read
// of the items, dead items and ended tables; pass them in batches of some
// thousands.
func (s *Store) VerifyItemFates(ctx context.Context, db DB, items []ItemRef) (ItemFates, error) {
	queues := make([]string, len(items))
	ids := make([][16]byte, len(items))
	for i, it := range items {
		queues[i], ids[i] = it.Queue, it.ID
	}
	var f ItemFates
	var oldest float64
	err := db.QueryRow(ctx, s.demoSQL().itemFates, queues, ids).Scan(&f.Pending, &f.Claimed, &f.PastLease, &oldest, &f.Dead, &f.Cancelled)
	if err != nil {
		return ItemFates{}, fmt.Errorf("reading the items' fates: %w", Classify(err))
	}
	f.OldestClaim = time.Duration(oldest * float64(time.Second))
	return f, nil
}

// workedQueuesSQL is the text of demoStatements.workedQueues
// (rendered by newDemoStatements).
const workedQueuesSQL = `SELECT p.queue FROM crdbwork_session_parts AS p
    JOIN crdbwork_sessions AS s ON s.id = p.session_id WHERE s.heartbeat_at + s.expiry >= now()
UNION
SELECT m.queue FROM crdbwork_session_queues AS m
    JOIN crdbwork_sessions AS s ON s.id = m.session_id WHERE s.heartbeat_at + s.expiry >= now()
ORDER BY 1`

// VerifyWorkedQueues returns, in order, the queues whose parts a live session
// owns or that a live session is a member of (live: its heartbeat within its
// expiry, by the database clock, as session.List).
func (s *Store) VerifyWorkedQueues(ctx context.Context, db DB) ([]string, error) {
	rows, err := db.Query(ctx, s.demoSQL().workedQueues)
	if err != nil {
		return nil, fmt.Errorf("listing the queues sessions work on: %w", Classify(err))
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the queues sessions work on: %w", Classify(err))
	}
	return names, nil
}

// QueueRows is what DeleteQueueRows deleted.
type QueueRows struct {
	Items, DeadItems, Ended int64
}

// deleteItemsSQL is the text of demoStatements.deleteItems
// (rendered by newDemoStatements).
const deleteItemsSQL = `DELETE FROM crdbwork_items WHERE id IN (
    (SELECT id FROM crdbwork_items WHERE queue = $1 AND claim IS NULL LIMIT $2)
    UNION ALL
    (SELECT id FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL LIMIT $2))`

// deleteDeadItemsSQL is the text of demoStatements.deleteDeadItems
// (rendered by newDemoStatements).
const deleteDeadItemsSQL = `DELETE FROM crdbwork_dead_items WHERE queue = $1 AND (id, death) IN
    (SELECT id, death FROM crdbwork_dead_items WHERE queue = $1 LIMIT $2)`

// deleteEndedSQL is the text of demoStatements.deleteEnded
// (rendered by newDemoStatements).
const deleteEndedSQL = `DELETE FROM crdbwork_ended WHERE queue = $1 AND id IN
    (SELECT id FROM crdbwork_ended WHERE queue = $1 LIMIT $2)`

// VerifyDeleteQueueRows deletes a batch of queue's rows: up to limit unclaimed
// and limit claimed items, up to limit dead items and up to limit ended ids,
// each table in its own statement, and returns how many it deleted: call it
// until it deletes nothing. It
// does not record the deleted items as ended: they are gone without an
// outcome. Claimed items are deleted too (their acks then fail).
func (s *Store) VerifyDeleteQueueRows(ctx context.Context, db DB, queue string, limit int) (QueueRows, error) {
	d := s.demoSQL()
	var r QueueRows
	for _, step := range []struct {
		what string
		stmt string
		n    *int64
	}{{"items", d.deleteItems, &r.Items}, {"dead items", d.deleteDeadItems, &r.DeadItems}, {"ended ids", d.deleteEnded, &r.Ended}} {
		tag, err := db.Exec(ctx, step.stmt, queue, limit)
		if err != nil {
			return r, fmt.Errorf("deleting the %s of %q: %w", step.what, queue, Classify(err))
		}
		*step.n = tag.RowsAffected()
	}
	return r, nil
}

// VerifyDeleteQueueRest deletes queue's part owners, memberships, tenant limits,
// schedules and its row in the queues table (its part count, settings and
// pause), each in its own statement. Run it after DeleteQueueRows removed
// the queue's items.
func (s *Store) VerifyDeleteQueueRest(ctx context.Context, db DB, queue string) error {
	for _, stmt := range s.demoSQL().deleteQueueRest {
		if _, err := db.Exec(ctx, stmt, queue); err != nil {
			return fmt.Errorf("removing queue %q: %w", queue, Classify(err))
		}
	}
	return nil
}

// VerifyDropTables drops every crdbwork table of the Store's table set that
// exists, with everything in it, children before parents. It checks
// nothing: the caller makes sure no queue and no session is left.
func (s *Store) VerifyDropTables(ctx context.Context, db DB) error {
	for _, stmt := range s.demoSQL().dropTables {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("dropping the crdbwork tables (%s): %w", stmt, Classify(err))
		}
	}
	return nil
}
