package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The operator statements: dead items filtered, paged and counted, and a
// queue's rows counted and purged in bounded batches. They back claim's
// admin API (claim/admin.go) and the crdbwork command.
//
// Both engines: the filters are written so that an empty filter value means
// "any" (each compares $n with the empty string first, then the column with
// $n), which keeps one statement text per purpose; strpos(string,
// substring) is in PostgreSQL and CockroachDB (docs checked: CockroachDB
// "Functions and Operators", String and byte functions, strpos). The pages compare row values, (a, b, c) < (x, y, z),
// as deathStatements.DeadItemsBefore does, with the leading column bounded
// so that crdbwork_dead_items_by_queue (queue, died_at) is seeked. Each
// purge batch picks up to a limit of ids through an index that leads with
// the queue (the items in two halves: unclaimed through one of the partial
// indexes WHERE claim IS NULL, claimed through crdbwork_items_lease, which
// together hold every item; the dead items through
// crdbwork_dead_items_by_queue; the ended ids through their primary key
// (queue, id)), then deletes them by key, the list given as
// id IN (SELECT unnest($2::UUID[])) as the reaper's by-id moves do (see
// deathStatements: a lookup join by primary key on both engines). A DELETE
// whose subquery reads its own table was planned as a sequential scan and a
// hash join by PostgreSQL; the two steps are not. PostgreSQL plans are
// checked in internal/store/dead_test.go.
type adminStatements struct {
	deadFirst   string // $1 queue, $2 tenant, $3 reason, $4 error text, $5 limit → dead item columns
	deadAfter   string // $1 queue, $2 tenant, $3 reason, $4 error text, $5 died_at, $6 id, $7 death, $8 limit → dead item columns
	deadCount   string // $1 queue, $2 tenant, $3 reason, $4 error text → count
	endedCount  string // $1 queue → count
	schedCount  string // $1 queue → count
	ownerCount  string // $1 queue → count
	pickFree    string // $1 queue, $2 limit → id
	pickHeld    string // $1 queue, $2 limit → id
	pickDead    string // $1 queue, $2 limit → id
	pickEnded   string // $1 queue, $2 limit → id
	purgeItems  string // $1 queue, $2 ids → rows affected
	purgeDead   string // $1 queue, $2 ids → rows affected
	purgeEnded  string // $1 queue, $2 ids → rows affected
	purgeRest   []string
	ownersOne   string // $1 queue → queue, part, session_id
	ownersAll   string // → queue, part, session_id
	purgeQueues string // $1 queue → rows affected
}

const deadColumns = `id, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, died_at, tenant, reason, death, kind`

const deadFilter = `queue = $1 AND ($2 = '' OR tenant = $2) AND ($3 = '' OR strpos(reason, $3) = 1) AND ($4 = '' OR strpos(last_error, $4) > 0) AND ($5 = '' OR kind = $5)`

func newAdminStatements(t Tables) *adminStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &adminStatements{
		deadFirst:  r(admindeadFirstSQL),
		deadAfter:  r(admindeadAfterSQL),
		deadCount:  r(deadCountSQL),
		endedCount: r(endedCountSQL),
		schedCount: r(schedCountSQL),
		ownerCount: r(ownerCountSQL),
		pickFree:   r(pickFreeSQL),
		pickHeld:   r(pickHeldSQL),
		pickDead:   r(pickDeadSQL),
		pickEnded:  r(pickEndedSQL),
		purgeItems: r(purgeItemsSQL),
		purgeDead:  r(purgeDeadSQL),
		purgeEnded: r(purgeEndedSQL),
		purgeRest: []string{
			r(`DELETE FROM crdbwork_session_parts WHERE queue = $1`),
			r(`DELETE FROM crdbwork_tenant_limits WHERE queue = $1`),
			r(`DELETE FROM crdbwork_schedules WHERE queue = $1`),
		},
		purgeQueues: r(purgeQueuesSQL),
		ownersOne:   r(`SELECT queue, part, session_id FROM crdbwork_session_parts WHERE queue = $1 ORDER BY queue, part`),
		ownersAll:   r(`SELECT queue, part, session_id FROM crdbwork_session_parts ORDER BY queue, part`),
	}
}

// admin returns the Store's adminStatements, rendered on first use.
func (s *Store) admin() *adminStatements { return s.lazyAdmin() }

// DeadFilter selects dead items: each field set must match (an empty field
// matches any).
type DeadFilter struct {
	// Tenant is the tenant's name, exactly.
	Tenant string
	// ReasonPrefix is the start of the reason of death: a whole reason
	// ("failed", "crash loop"; none is the start of another) or the start
	// of "dependency died: <id>".
	ReasonPrefix string
	// ErrorContains is a substring of the last error (case-sensitive).
	ErrorContains string
	// Kind is the item's kind, exactly.
	Kind string
}

// DeadPosition is a place in the order of dead items (died_at, id, death,
// all descending): the last row of a page.
type DeadPosition struct {
	DiedAt    time.Time
	ID, Death uuid.UUID
}

// admindeadFirstSQL is the text of adminStatements.deadFirst
// (rendered by newAdminStatements).
const admindeadFirstSQL = `SELECT ` + deadColumns + `
FROM crdbwork_dead_items
WHERE ` + deadFilter + `
ORDER BY died_at DESC, id DESC, death DESC
LIMIT $6`

// admindeadAfterSQL is the text of adminStatements.deadAfter
// (rendered by newAdminStatements).
const admindeadAfterSQL = `SELECT ` + deadColumns + `
FROM crdbwork_dead_items
WHERE ` + deadFilter + ` AND died_at <= $6 AND (died_at, id, death) < ($6, $7, $8)
ORDER BY died_at DESC, id DESC, death DESC
LIMIT $9`

// DeadPageFilter returns up to limit deaths of queue that match f, newest
// first, after the position after (nil: from the newest).
func (s *Store) DeadPageFilter(ctx context.Context, db DB, queue string, f DeadFilter, after *DeadPosition, limit int) ([]DeadItemRow, error) {
	a := s.admin()
	if after == nil {
		return queryDead(ctx, db, a.deadFirst, queue, f.Tenant, f.ReasonPrefix, f.ErrorContains, f.Kind, limit)
	}
	return queryDead(ctx, db, a.deadAfter, queue, f.Tenant, f.ReasonPrefix, f.ErrorContains, f.Kind, after.DiedAt, after.ID, after.Death, limit)
}

// deadCountSQL is the text of adminStatements.deadCount
// (rendered by newAdminStatements).
const deadCountSQL = `SELECT count(*) FROM crdbwork_dead_items WHERE ` + deadFilter

// DeadCount counts the deaths of queue that match f.
func (s *Store) DeadCount(ctx context.Context, db DB, queue string, f DeadFilter) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.admin().deadCount, queue, f.Tenant, f.ReasonPrefix, f.ErrorContains, f.Kind).Scan(&n)
	return n, err
}

// QueueRowCounts are the rows of one queue outside its items and dead
// items, as CountQueueRows reads them.
type QueueRowCounts struct {
	// Ended ids remembered for deduplication.
	Ended int64
	// Schedules with a stored period mark.
	Schedules int64
	// OwnedParts are the parts sessions own now.
	OwnedParts int64
}

// endedCountSQL is the text of adminStatements.endedCount
// (rendered by newAdminStatements).
const endedCountSQL = `SELECT count(*) FROM crdbwork_ended WHERE queue = $1`

// schedCountSQL is the text of adminStatements.schedCount
// (rendered by newAdminStatements).
const schedCountSQL = `SELECT count(*) FROM crdbwork_schedules WHERE queue = $1`

// ownerCountSQL is the text of adminStatements.ownerCount
// (rendered by newAdminStatements).
const ownerCountSQL = `SELECT count(*) FROM crdbwork_session_parts WHERE queue = $1`

// QueuePurgeCount counts queue's ended ids, schedule marks and owned parts.
func (s *Store) QueuePurgeCount(ctx context.Context, db DB, queue string) (QueueRowCounts, error) {
	a := s.admin()
	var c QueueRowCounts
	for _, q := range []struct {
		text string
		n    *int64
	}{{a.endedCount, &c.Ended}, {a.schedCount, &c.Schedules}, {a.ownerCount, &c.OwnedParts}} {
		if err := db.QueryRow(ctx, q.text, queue).Scan(q.n); err != nil {
			return QueueRowCounts{}, err
		}
	}
	return c, nil
}

// PurgeTable names what one PurgeBatch deletes.
type PurgeTable int

// The tables PurgeBatch deletes from, a batch at a time.
const (
	PurgeUnclaimed PurgeTable = iota // the queue's unclaimed items
	PurgeClaimed                     // the queue's claimed items
	PurgeDead                        // the queue's dead items (oldest deaths first)
	PurgeEnded                       // the queue's ended ids
)

// pickFreeSQL is the text of adminStatements.pickFree
// (rendered by newAdminStatements).
const pickFreeSQL = `SELECT id FROM crdbwork_items WHERE queue = $1 AND claim IS NULL LIMIT $2`

// pickHeldSQL is the text of adminStatements.pickHeld
// (rendered by newAdminStatements).
const pickHeldSQL = `SELECT id FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL LIMIT $2`

// pickDeadSQL is the text of adminStatements.pickDead
// (rendered by newAdminStatements).
const pickDeadSQL = `SELECT id FROM crdbwork_dead_items WHERE queue = $1 ORDER BY died_at LIMIT $2`

// pickEndedSQL is the text of adminStatements.pickEnded
// (rendered by newAdminStatements).
const pickEndedSQL = `SELECT id FROM crdbwork_ended WHERE queue = $1 LIMIT $2`

// purgeItemsSQL is the text of adminStatements.purgeItems
// (rendered by newAdminStatements).
const purgeItemsSQL = `DELETE FROM crdbwork_items WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1`

// purgeDeadSQL is the text of adminStatements.purgeDead
// (rendered by newAdminStatements).
const purgeDeadSQL = `DELETE FROM crdbwork_dead_items WHERE id IN (SELECT unnest($2::UUID[])) AND queue = $1`

// purgeEndedSQL is the text of adminStatements.purgeEnded
// (rendered by newAdminStatements).
// The cancelled items kept for a requeue (version 6) go with their ended
// records.
const purgeEndedSQL = `WITH kept AS (DELETE FROM crdbwork_cancelled_items WHERE queue = $1 AND id IN (SELECT unnest($2::UUID[])) RETURNING id)
DELETE FROM crdbwork_ended WHERE queue = $1 AND id IN (SELECT unnest($2::UUID[]))`

// QueuePurgeBatch deletes up to limit of queue's rows of one table and returns
// how many it deleted; 0 means none was left. It picks the rows, then
// deletes them by key (two statements, no transaction: a row that went
// meanwhile is not counted).
func (s *Store) QueuePurgeBatch(ctx context.Context, db DB, queue string, t PurgeTable, limit int) (int64, error) {
	a := s.admin()
	var pick, del string
	switch t {
	case PurgeUnclaimed:
		pick, del = a.pickFree, a.purgeItems
	case PurgeClaimed:
		pick, del = a.pickHeld, a.purgeItems
	case PurgeDead:
		pick, del = a.pickDead, a.purgeDead
	case PurgeEnded:
		pick, del = a.pickEnded, a.purgeEnded
	default:
		return 0, fmt.Errorf("unknown purge table %d", t)
	}
	rows, err := db.Query(ctx, pick, queue, limit)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	tag, err := db.Exec(ctx, del, queue, ids)
	return tag.RowsAffected(), err
}

// purgeQueuesSQL is the text of adminStatements.purgeQueues
// (rendered by newAdminStatements).
const purgeQueuesSQL = `DELETE FROM crdbwork_queues WHERE name = $1`

// QueuePurgeRows deletes queue's small rows in one transaction the caller
// gives: its part owners, tenant limits, schedule marks, and its row in the
// queues table (part count, settings, pause). It reports whether the queue
// had a row.
func (s *Store) QueuePurgeRows(ctx context.Context, tx pgx.Tx, queue string) (bool, error) {
	a := s.admin()
	for _, text := range a.purgeRest {
		if _, err := tx.Exec(ctx, text, queue); err != nil {
			return false, err
		}
	}
	tag, err := tx.Exec(ctx, a.purgeQueues, queue)
	return tag.RowsAffected() == 1, err
}

// deathStatements are the statements that keep the reaper and the nacks
// going when an item cannot be moved to the dead items (schema version 4
// keys dead items by (id, death), so a reused id no longer conflicts; a
// move may still be refused for something about one item: a constraint, a
// trigger, a row over a size limit), and that page through every death of
// the dead items. Rendered for one set of table names.
//
// The reaper's batches (coreStatements.ReapLeases, ReapExhausted and
// ReapExpired) stay as they are; when one fails for an item,
// claim.Queue.Reap reads the batch's candidates (ExpiredLeaseIDs,
// ExhaustedIDs, ExpiredIDs) and releases or moves them by id
// (ReapLeasesIDs, ReapExhaustedIDs, ReapExpiredIDs), splitting the list
// until each refused item fails alone.
// The by-id moves are the batches' statements with the candidates given
// instead of picked: the same conditions (rechecked on the locked rows), the
// same columns, the same reasons. Any CTE added to the batch statements (the
// ended ids of crdbwork_ended, for instance) belongs in these too.
//
// CockroachDB: the by-id moves have the batches' shape (a MATERIALIZED CTE
// that selects FOR UPDATE SKIP LOCKED, a DELETE ... RETURNING, an INSERT
// from it), which the batches' comments cite the docs for, and take their
// list of keys as id IN (SELECT unnest($2::UUID[])), the form of the fenced
// acks (see fenced in statements.go: a lookup semi-join by primary key).
// Not checked on a cluster (no CockroachDB binary here). The page of dead
// items compares row values, (a, b, c) < (x, y, z), which both engines order
// lexicographically, and bounds the leading column (died_at <= $2) so that
// the index on (queue, died_at) is seeked, not scanned, whichever way the
// engine treats the row comparison.
// PostgreSQL checked: the plans of every statement here are in
// internal/store/explain_test.go (no sequential scan of the items or dead items; the
// by-id moves look their ids up by primary key, or, when the planner expects
// few candidates, read them from the step's partial index).
type deathStatements struct {
	// ExhaustedIDs lists up to $2 ids of queue $1's unclaimed items whose
	// attempts are used up (the candidates of ReapExhausted), through
	// crdbwork_items_exhausted. It locks nothing.
	ExhaustedIDs string // $1 queue, $2 limit → id
	// ExpiredIDs lists up to $2 ids of queue $1's unclaimed items past
	// their deadline, earliest deadline first (the candidates of
	// ReapExpired), through crdbwork_items_expiry. It locks nothing.
	ExpiredIDs string // $1 queue, $2 limit → id
	// ExpiredLeaseIDs lists up to $2 ids of queue $1's claimed items whose
	// lease ended, oldest lease first (the candidates of ReapLeases),
	// through crdbwork_items_lease. It locks nothing.
	ExpiredLeaseIDs string // $1 queue, $2 limit → id
	// ReapLeasesIDs is ReapLeases for the given ids: it releases those
	// that are still claimed with an ended lease, skipping rows another
	// transaction holds.
	ReapLeasesIDs string // $1 queue, $2 ids → ids released
	// ReapExhaustedIDs is ReapExhausted for the given ids: it moves those
	// that are still unclaimed with their attempts used up, skipping rows
	// another transaction holds.
	ReapExhaustedIDs string // $1 queue, $2 ids, $3 error → ids moved (reason 'crash loop')
	// ReapExpiredIDs is ReapExpired for the given ids.
	ReapExpiredIDs string // $1 queue, $2 ids → ids moved (reason 'expired')
	// Exhaust is Nack's fallback when the move of a claimed item to the
	// dead items is refused: it releases the claim (fenced like
	// DeadLetter) with the item's attempts used up and its last error
	// set, so that no claim hands it out again and the reaper moves it
	// once it can.
	Exhaust string // $1 id, $2 session, $3 token, $4 error → rows affected
	// DeadItemsBefore is coreStatements.DeadItems' next page: the dead items
	// of queue $1 after the death ($2 died_at, $3 id, $4 death) in its
	// order (died_at, id, death, all descending), through
	// crdbwork_dead_items_by_queue.
	DeadItemsBefore string // $1 queue, $2 died_at, $3 id, $4 death, $5 limit → dead item columns
	// RequeueState says why Requeue moved nothing: the queue of the live
	// item with id $1 (NULL if none), the queue of the waiting item with id
	// $1 (NULL if none) and how many deaths of $1 in queue $2 match $3
	// (NULL: any).
	RequeueState string // $1 id, $2 queue, $3 death or NULL → live queue, waiting queue, deaths
}

// newDeathStatements renders the statements for t.
func newDeathStatements(t Tables) *deathStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &deathStatements{
		ExhaustedIDs:     r(exhaustedIDsSQL),
		ExpiredIDs:       r(expiredIDsSQL),
		ExpiredLeaseIDs:  r(expiredLeaseIDsSQL),
		ReapLeasesIDs:    r(reapLeasesIDsSQL),
		ReapExhaustedIDs: r(reapExhaustedIDsSQL),
		ReapExpiredIDs:   r(reapExpiredIDsSQL),
		Exhaust:          r(exhaustSQL),
		DeadItemsBefore:  r(deadItemsBeforeSQL),
		RequeueState:     r(requeueStateSQL),
	}
}
