package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The reads of one queue's state (claim.Queue.Inspect, claim.Queues), its
// settings, pause and tenant limits, and their writes. Errors are the
// driver's, as in items_claim.go.

// QueueRow is a queue's stored row, as InspectQueue reads it.
type QueueRow struct {
	// Stored reports whether the queue has a row in the queues table.
	Stored bool
	// NumParts is the stored part count (1 without a row).
	NumParts int
	// Paused reports a paused queue (false without a row).
	Paused bool
}

// inspectQueueSQL is the text of inspectStatements.Queue
// (rendered by newInspectStatements).
const inspectQueueSQL = `SELECT q.name IS NOT NULL, COALESCE(q.num_parts, 1), COALESCE(q.paused, false)
FROM (SELECT 1) AS one LEFT JOIN crdbwork_queues AS q ON q.name = $1`

// QueueInspect reads queue's stored row (inspectStatements.Queue): a
// primary-key lookup.
func (s *Store) QueueInspect(ctx context.Context, db DB, queue string) (QueueRow, error) {
	var r QueueRow
	var numParts int64
	if err := db.QueryRow(ctx, s.insp.Queue, queue).Scan(&r.Stored, &numParts, &r.Paused); err != nil {
		return QueueRow{}, err
	}
	r.NumParts = int(numParts)
	return r, nil
}

// UnclaimedPart is one part's unclaimed items, as InspectUnclaimed reads
// them.
type UnclaimedPart struct {
	Part int
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
	// OldestDue is the vesting time of the oldest due item (nil if none is
	// due), and Now the database clock when it was read.
	OldestDue *time.Time
	Now       time.Time
}

// unclaimedSQL is the text of inspectStatements.Unclaimed
// (rendered by newInspectStatements).
const unclaimedSQL = `SELECT part, count(*), count(*) FILTER (WHERE vesting_at <= now()),
       min(vesting_at) FILTER (WHERE vesting_at <= now()), now()
FROM crdbwork_items WHERE queue = $1 AND claim IS NULL
GROUP BY part ORDER BY part`

// QueueInspectUnclaimed reads queue's unclaimed items by part, ordered by part
// (inspectStatements.Unclaimed). It reads every unclaimed item of the
// queue: its entries in crdbwork_items_part_turn, and each row's
// vesting_at.
func (s *Store) QueueInspectUnclaimed(ctx context.Context, db DB, queue string) ([]UnclaimedPart, error) {
	rows, err := db.Query(ctx, s.insp.Unclaimed, queue)
	if err != nil {
		return nil, err
	}
	var out []UnclaimedPart
	var p int64
	var oldest *time.Time
	var u UnclaimedPart
	if _, err := pgx.ForEachRow(rows, []any{&p, &u.Unclaimed, &u.Due, &oldest, &u.Now}, func() error {
		u.Part, u.OldestDue = int(p), nil
		if oldest != nil {
			t := *oldest // a copy of its own: the scan may reuse oldest
			u.OldestDue = &t
		}
		out = append(out, u)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// ClaimedPart counts the items of one part that one session holds, as
// InspectClaimed reads them.
type ClaimedPart struct {
	Part    int
	Session uuid.UUID
	Claimed int64
}

// claimedSQL is the text of inspectStatements.Claimed
// (rendered by newInspectStatements).
const claimedSQL = `SELECT part, claim, count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL
GROUP BY part, claim ORDER BY part, claim`

// QueueInspectClaimed reads queue's claimed items by part and session, ordered
// by part and session (inspectStatements.Claimed): only the queue's
// claimed items, through crdbwork_items_lease.
func (s *Store) QueueInspectClaimed(ctx context.Context, db DB, queue string) ([]ClaimedPart, error) {
	rows, err := db.Query(ctx, s.insp.Claimed, queue)
	if err != nil {
		return nil, err
	}
	var out []ClaimedPart
	var p int64
	var c ClaimedPart
	if _, err := pgx.ForEachRow(rows, []any{&p, &c.Session, &c.Claimed}, func() error {
		c.Part = int(p)
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// TenantBacklog is one tenant's unclaimed items, as InspectTenants reads
// them.
type TenantBacklog struct {
	Tenant string
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
}

// tenantsSQL is the text of inspectStatements.Tenants
// (rendered by newInspectStatements).
const tenantsSQL = `SELECT tenant, count(*) AS unclaimed, count(*) FILTER (WHERE vesting_at <= now())
FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND tenant IS NOT NULL
GROUP BY tenant ORDER BY unclaimed DESC, tenant LIMIT $2`

// QueueInspectTenants reads the at most limit tenants of queue with the most
// unclaimed items, most first, then by name (inspectStatements.Tenants).
// Items without a tenant are not counted. It reads every unclaimed item of
// the queue that has a tenant (crdbwork_items_tenant_turn and each row's
// vesting_at).
func (s *Store) QueueInspectTenants(ctx context.Context, db DB, queue string, limit int) ([]TenantBacklog, error) {
	rows, err := db.Query(ctx, s.insp.Tenants, queue, limit)
	if err != nil {
		return nil, err
	}
	var out []TenantBacklog
	var t TenantBacklog
	if _, err := pgx.ForEachRow(rows, []any{&t.Tenant, &t.Unclaimed, &t.Due}, func() error {
		out = append(out, t)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// inspectDeadCountSQL is the text of inspectStatements.DeadCount
// (rendered by newInspectStatements).
const inspectDeadCountSQL = `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`

// QueueInspectDead counts the deaths of queue (inspectStatements.DeadCount):
// the queue's entries of crdbwork_dead_items_by_queue.
func (s *Store) QueueInspectDead(ctx context.Context, db DB, queue string) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, s.insp.DeadCount, queue).Scan(&n)
	return n, err
}

// storedQueuesSQL is the text of inspectStatements.StoredQueues
// (rendered by newInspectStatements).
const storedQueuesSQL = `SELECT name FROM crdbwork_queues WHERE name > $1 ORDER BY name LIMIT $2`

// QueuesStored returns the names of the queues with a row in the queues
// table after after, in order, at most limit of them
// (inspectStatements.StoredQueues).
func (s *Store) QueuesStored(ctx context.Context, db DB, after string, limit int) ([]string, error) {
	rows, err := db.Query(ctx, s.insp.StoredQueues, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// nextUnclaimedQueueSQL is the text of inspectStatements.NextUnclaimedQueue
// (rendered by newInspectStatements).
const nextUnclaimedQueueSQL = `SELECT min(queue) FROM crdbwork_items WHERE claim IS NULL AND queue > $1`

// QueuesNextUnclaimed returns the smallest queue name after after that has
// unclaimed items, and false if there is none: one index seek
// (inspectStatements.NextUnclaimedQueue).
func (s *Store) QueuesNextUnclaimed(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextUnclaimedQueue, after)
}

// nextClaimedQueueSQL is the text of inspectStatements.NextClaimedQueue
// (rendered by newInspectStatements).
const nextClaimedQueueSQL = `SELECT min(queue) FROM crdbwork_items WHERE claim IS NOT NULL AND queue > $1`

// QueuesNextClaimed is NextUnclaimedQueue for claimed items
// (inspectStatements.NextClaimedQueue).
func (s *Store) QueuesNextClaimed(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextClaimedQueue, after)
}

// nextDeadQueueSQL is the text of inspectStatements.NextDeadQueue
// (rendered by newInspectStatements).
const nextDeadQueueSQL = `SELECT min(queue) FROM crdbwork_dead_items WHERE queue > $1`

// QueuesNextDead is NextUnclaimedQueue for dead items
// (inspectStatements.NextDeadQueue).
func (s *Store) QueuesNextDead(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextDeadQueue, after)
}

// nextAnyQueueSQL is the text of inspectStatements.NextAnyQueue
// (rendered by newInspectStatements).
const nextAnyQueueSQL = `SELECT min(n.q) FROM (
    SELECT min(name) AS q FROM crdbwork_queues WHERE name > $1
    UNION ALL SELECT min(queue) FROM crdbwork_items WHERE claim IS NULL AND queue > $1
    UNION ALL SELECT min(queue) FROM crdbwork_items WHERE claim IS NOT NULL AND queue > $1
    UNION ALL SELECT min(queue) FROM crdbwork_dead_items WHERE queue > $1
    UNION ALL SELECT min(queue) FROM crdbwork_waiting WHERE queue > $1
    UNION ALL SELECT min(queue) FROM crdbwork_ended WHERE queue > $1
    UNION ALL SELECT min(queue) FROM crdbwork_schedules WHERE queue > $1) AS n`

// QueuesNextAny returns the smallest queue name after after that has
// anything in the tables: a stored row, unclaimed, claimed, dead or waiting
// items, ended ids (kept for the queue's dedup window) or schedules, and
// false if there is none. One statement of seven one-entry index seeks (the
// queues' primary key, crdbwork_items_turn_next and _lease, the dead and
// waiting items' queue indexes, the ended ids' and schedules' primary
// keys), so listing n queues takes n+1 round trips
// (inspectStatements.NextAnyQueue).
func (s *Store) QueuesNextAny(ctx context.Context, db DB, after string) (string, bool, error) {
	return nextQueue(ctx, db, s.insp.NextAnyQueue, after)
}

func nextQueue(ctx context.Context, db DB, stmt, after string) (string, bool, error) {
	var n *string
	if err := db.QueryRow(ctx, stmt, after).Scan(&n); err != nil || n == nil {
		return "", false, err
	}
	return *n, true, nil
}

// QueueSettingsRow is a queue's stored settings.
type QueueSettingsRow struct {
	Fair, AtMostOnce  bool
	MaxInFlight       int64
	Rate              float64
	TenantMaxInFlight int64
	TenantRate        float64
	// DedupWindow is how long the queue remembers ended ids, at
	// microsecond precision (0: none).
	DedupWindow time.Duration
}

// queueSettingsSQL is the text of coreStatements.QueueSettings
// (rendered by newCoreStatements).
const queueSettingsSQL = `SELECT fair, at_most_once, max_in_flight, rate_limit, tenant_max_in_flight, tenant_rate_limit,
       (EXTRACT(EPOCH FROM dedup_window) * 1000000)::BIGINT
FROM crdbwork_queues WHERE name = $1`

// QueueSettings reads queue's settings, and false if it has no row
// (coreStatements.QueueSettings).
func (s *Store) QueueSettings(ctx context.Context, db DB, queue string) (QueueSettingsRow, bool, error) {
	var r QueueSettingsRow
	var window int64
	err := db.QueryRow(ctx, s.st.QueueSettings, queue).Scan(&r.Fair, &r.AtMostOnce, &r.MaxInFlight, &r.Rate,
		&r.TenantMaxInFlight, &r.TenantRate, &window)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return QueueSettingsRow{}, false, nil
	case err != nil:
		return QueueSettingsRow{}, false, err
	}
	r.DedupWindow = time.Duration(window) * time.Microsecond
	return r, true, nil
}

// configureQueueSQL is the text of coreStatements.ConfigureQueue
// (rendered by newCoreStatements).
const configureQueueSQL = `INSERT INTO crdbwork_queues AS q
    (name, fair, at_most_once, max_in_flight, rate_limit, tenant_max_in_flight, tenant_rate_limit, dedup_window)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::BIGINT * INTERVAL '1 microsecond')
ON CONFLICT (name) DO UPDATE SET fair = excluded.fair, at_most_once = excluded.at_most_once,
    max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit,
    tenant_max_in_flight = excluded.tenant_max_in_flight, tenant_rate_limit = excluded.tenant_rate_limit,
    dedup_window = excluded.dedup_window, changes = q.changes + 1`

// QueueConfigure stores queue's settings, replacing all of them; a queue
// without a row gets one, with one part (coreStatements.ConfigureQueue).
func (s *Store) QueueConfigure(ctx context.Context, db DB, queue string, r QueueSettingsRow) error {
	_, err := db.Exec(ctx, s.st.ConfigureQueue, queue, r.Fair, r.AtMostOnce,
		r.MaxInFlight, r.Rate, r.TenantMaxInFlight, r.TenantRate, r.DedupWindow.Microseconds())
	return err
}

// queuePausedSQL is the text of coreStatements.QueuePaused
// (rendered by newCoreStatements).
const queuePausedSQL = `SELECT COALESCE((SELECT paused FROM crdbwork_queues WHERE name = $1), false)`

// QueuePaused reads whether queue is paused (coreStatements.QueuePaused).
func (s *Store) QueuePaused(ctx context.Context, db DB, queue string) (bool, error) {
	var paused bool
	err := db.QueryRow(ctx, s.st.QueuePaused, queue).Scan(&paused)
	return paused, err
}

// pauseQueueSQL is the text of coreStatements.PauseQueue
// (rendered by newCoreStatements).
const pauseQueueSQL = `INSERT INTO crdbwork_queues AS q (name, paused) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused`

// QueuePause pauses or resumes queue (coreStatements.PauseQueue).
func (s *Store) QueuePause(ctx context.Context, db DB, queue string, paused bool) error {
	_, err := db.Exec(ctx, s.st.PauseQueue, queue, paused)
	return err
}

// TenantLimitRow is one tenant's own limit on a queue.
type TenantLimitRow struct {
	Tenant      string
	MaxInFlight int64
	Rate        float64
}

// tenantLimitsSQL is the text of limitStatements.TenantLimits
// (rendered by newLimitStatements).
const tenantLimitsSQL = `SELECT tenant, max_in_flight, rate_limit FROM crdbwork_tenant_limits WHERE queue = $1 ORDER BY tenant`

// QueueTenantLimits reads queue's tenant limits, ordered by tenant
// (limitStatements.TenantLimits).
func (s *Store) QueueTenantLimits(ctx context.Context, db DB, queue string) ([]TenantLimitRow, error) {
	rows, err := db.Query(ctx, s.lim.TenantLimits, queue)
	if err != nil {
		return nil, err
	}
	var out []TenantLimitRow
	var l TenantLimitRow
	if _, err := pgx.ForEachRow(rows, []any{&l.Tenant, &l.MaxInFlight, &l.Rate}, func() error {
		out = append(out, l)
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// setTenantLimitSQL is the text of limitStatements.SetTenantLimit
// (rendered by newLimitStatements).
const setTenantLimitSQL = `WITH bump AS (` + limitsChangeSQL + `)
INSERT INTO crdbwork_tenant_limits (queue, tenant, max_in_flight, rate_limit) VALUES ($1, $2, $3, $4)
ON CONFLICT (queue, tenant) DO UPDATE SET max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit`

// limitsChangeSQL records a change of queue $1's limits in its change
// counter (the row is created if the queue has none), in the statement
// that writes them: the queue's sessions read the counter with their
// heartbeats and read limits that limit nothing again only when it moved
// (package worker's maintenance loop). ConfigureQueue raises it too.
const limitsChangeSQL = `INSERT INTO crdbwork_queues AS q (name) VALUES ($1)
    ON CONFLICT (name) DO UPDATE SET changes = q.changes + 1 RETURNING 1`

// QueueTenantLimitSet stores tenant's own limit on queue
// (limitStatements.SetTenantLimit).
func (s *Store) QueueTenantLimitSet(ctx context.Context, db DB, queue, tenant string, maxInFlight int64, rate float64) error {
	_, err := db.Exec(ctx, s.lim.SetTenantLimit, queue, tenant, maxInFlight, rate)
	return err
}

// removeTenantLimitSQL is the text of limitStatements.RemoveTenantLimit
// (rendered by newLimitStatements).
const removeTenantLimitSQL = `WITH bump AS (` + limitsChangeSQL + `)
DELETE FROM crdbwork_tenant_limits WHERE queue = $1 AND tenant = $2`

// QueueTenantLimitRemove deletes tenant's own limit on queue and reports whether
// there was one (limitStatements.RemoveTenantLimit).
func (s *Store) QueueTenantLimitRemove(ctx context.Context, db DB, queue, tenant string) (bool, error) {
	tag, err := db.Exec(ctx, s.lim.RemoveTenantLimit, queue, tenant)
	return tag.RowsAffected() > 0, err
}

// inspectStatements are the reads behind claim.Queue.Inspect and
// claim.Queues: one queue's state for metrics, the demo's status and
// dashboards, rendered for one set of table names. Each is a read-only
// single statement; what each reads is said below, and internal/store/explain_test.go
// checks on PostgreSQL (custom and generic plans) that none scans a table
// sequentially. CockroachDB cannot run here: its plans are not checked. The
// forms are ones the existing statements already run on CockroachDB:
// count(*) FILTER (WHERE …) as in coreStatements.Backlog, the LEFT JOIN of a
// one-row subquery as in limitStatements.QueueLimits, and min() over an
// indexed column, which its optimizer turns into a limited scan.
//
// No read here is a count over the whole items table. Counting a queue's
// backlog cannot avoid reading the backlog, though: Unclaimed reads every
// unclaimed item of the queue (its entries in crdbwork_items_part_turn, and
// each row's vesting_at, which no index holds, to tell the due ones), so its
// cost grows with that queue's backlog; Tenants reads the same items that
// have a tenant (crdbwork_items_tenant_turn) and returns at most its limit
// of tenants. Claimed reads only the queue's claimed items
// (crdbwork_items_lease), as many as its workers hold. The dead count reads
// the queue's entries of crdbwork_dead_items_by_queue. The queue list seeks
// one index entry per queue (see NextUnclaimedQueue).
type inspectStatements struct {
	// Queue returns queue $1's stored row: stored (whether the queue has a
	// row in the queues table), num_parts (1 without a row) and paused
	// (false without a row). A primary-key lookup.
	Queue string
	// Unclaimed returns queue $1's unclaimed items by part: part,
	// unclaimed, due (unclaimed and vesting_at <= now()), the oldest due
	// item's vesting_at (NULL if none is due) and the database clock,
	// now(), ordered by part. It reads every unclaimed item of the queue
	// (crdbwork_items_part_turn and each row's vesting_at).
	Unclaimed string
	// Claimed returns queue $1's claimed items by part and session: part,
	// claim (the session), claimed, ordered by part and claim. It reads
	// the queue's claimed items only (crdbwork_items_lease, WHERE claim IS
	// NOT NULL).
	Claimed string
	// Tenants returns queue $1's tenants with the most unclaimed items, at
	// most $2 of them: tenant, unclaimed, due, ordered by unclaimed
	// descending then tenant. It reads every unclaimed item of the queue
	// that has a tenant (crdbwork_items_tenant_turn and each row's
	// vesting_at); items without a tenant are not counted.
	Tenants string
	// DeadCount returns the number of deaths of queue $1 (rows of the dead
	// items table): the queue's entries of crdbwork_dead_items_by_queue.
	DeadCount string
	// StoredQueues returns the names of the queues with a row in the
	// queues table after $1, in order, at most $2 of them (a limited scan
	// of its primary key).
	StoredQueues string
	// NextUnclaimedQueue, NextClaimedQueue and NextDeadQueue return the
	// smallest queue name after $1 that has unclaimed items, claimed items
	// or dead items, or NULL: one seek in crdbwork_items_turn_next,
	// crdbwork_items_lease and crdbwork_dead_items_by_queue. Calling them
	// from "" on, each time after the last name returned, lists the
	// queues that have items at one seek per queue (a loose index scan),
	// however many items each holds. Queue names are never empty
	// (claim.New names an unnamed queue "default").
	NextUnclaimedQueue, NextClaimedQueue, NextDeadQueue string
	// NextAnyQueue returns the smallest queue name above $1 that has a
	// stored row or rows of any kind (QueuesNextAny).
	NextAnyQueue string
}

// newInspectStatements renders the inspection statements for t.
func newInspectStatements(t Tables) *inspectStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &inspectStatements{
		Queue:              r(inspectQueueSQL),
		Unclaimed:          r(unclaimedSQL),
		Claimed:            r(claimedSQL),
		Tenants:            r(tenantsSQL),
		DeadCount:          r(inspectDeadCountSQL),
		StoredQueues:       r(storedQueuesSQL),
		NextUnclaimedQueue: r(nextUnclaimedQueueSQL),
		NextClaimedQueue:   r(nextClaimedQueueSQL),
		NextDeadQueue:      r(nextDeadQueueSQL),
		NextAnyQueue:       r(nextAnyQueueSQL),
	}
}
