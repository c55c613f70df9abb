package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The fleet's bounded reads (internal/fleet: crdbwork status, the
// dashboard and the metrics collector render one read model of the
// fleet). Each statement's text stands beside the method that runs it;
// fleetStatements renders them once per Store (on first use).

// fleetStatements are the fleet's statements rendered for one table set.
type fleetStatements struct {
	queue, liveSessions, sessionCounts string
	waitingItem, endedOfID             string
	auditFilter, kinds                 string
}

func newFleetStatements(t Tables) *fleetStatements {
	return &fleetStatements{queue: rewrite(t, queueSQL), liveSessions: rewrite(t, liveSessionsSQL),
		sessionCounts: rewrite(t, sessionCountsSQL), waitingItem: rewrite(t, waitingItemSQL), endedOfID: rewrite(t, endedOfIDSQL),
		auditFilter: rewrite(t, auditFilterSQL), kinds: rewrite(t, kindsSQL)}
}

// fleetLiveSessions: $1 limit → the first limit live sessions by id, as
// coreStatements.LiveSessions reads them. The sessions table holds one
// row per worker process.
const fleetLiveSessions = `SELECT id, name, host, pid, created_at, heartbeat_at,
       (EXTRACT(EPOCH FROM expiry) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - created_at) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - heartbeat_at) * 1000000)::BIGINT,
       claimed, acked, failed, in_flight
FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id LIMIT $1`

// liveSessionsSQL is the text of fleetStatements.liveSessions
// (rendered by newFleetStatements).
const liveSessionsSQL = fleetLiveSessions

// FleetLiveSessions returns the first limit live sessions (heartbeat
// within their expiry, by the database clock), ordered by id
// (fleetLiveSessions).
func (s *Store) FleetLiveSessions(ctx context.Context, db DB, limit int) ([]SessionRow, error) {
	rows, err := db.Query(ctx, s.lazyFleet().liveSessions, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SessionRow, error) {
		var r SessionRow
		var exp, age, since int64
		err := row.Scan(&r.ID, &r.Name, &r.Host, &r.PID, &r.CreatedAt, &r.HeartbeatAt, &exp, &age, &since,
			&r.Reported.Claimed, &r.Reported.Acked, &r.Reported.Failed, &r.Reported.InFlight)
		r.Expiry, r.Age, r.SinceHeartbeat = time.Duration(exp)*time.Microsecond, time.Duration(age)*time.Microsecond, time.Duration(since)*time.Microsecond
		return r, err
	})
}

// fleetSessionCounts: → the live sessions and the expired ones that no
// peer has reaped yet, by the database clock: one read of the sessions
// table (count(*) FILTER, as inspectStatements).
const fleetSessionCounts = `SELECT count(*) FILTER (WHERE heartbeat_at + expiry >= now()),
       count(*) FILTER (WHERE heartbeat_at + expiry < now())
FROM crdbwork_sessions`

// sessionCountsSQL is the text of fleetStatements.sessionCounts
// (rendered by newFleetStatements).
const sessionCountsSQL = fleetSessionCounts

// FleetSessionCounts counts the live sessions and the expired ones not yet
// reaped (fleetSessionCounts).
func (s *Store) FleetSessionCounts(ctx context.Context, db DB) (live, expired int64, err error) {
	err = db.QueryRow(ctx, s.lazyFleet().sessionCounts).Scan(&live, &expired)
	return live, expired, err
}

// fleetQueue: $1 queue, $2 cap, $3 ended since → the queue's row (stored,
// num_parts, paused, fair, sequenced, max_in_flight, rate_limit; defaults
// without one), then each count stopping at $2 rows: unclaimed, due and
// the oldest due vesting time among the first $2 unclaimed items in claim
// order (crdbwork_items_turn_next), claimed (crdbwork_items_lease), dead
// (crdbwork_dead_items_by_queue), ended since $3 (crdbwork_ended_by_age),
// waiting (crdbwork_waiting_by_queue), snoozed unclaimed
// (crdbwork_items_snoozed), asked to stop
// (crdbwork_items_cancel_requested); and now(); then the queue's last
// activity: its latest end (crdbwork_ended_by_age), latest death
// (crdbwork_dead_items_by_queue), each the last entry of the queue's
// index, and its schedules (their count, up to $2, and latest mark, by the
// primary key). One statement: a limited
// read of an index that leads with the queue for each count (the shapes
// of dashboardStatements: the LEFT JOIN of a one-row subquery, count(*)
// FILTER), none correlated (each subquery stands alone), so both engines
// plan each as a seek that stops at its limit. $2 may be the largest
// BIGINT: the counts are then exact.
const fleetQueue = `SELECT q.name IS NOT NULL, COALESCE(q.num_parts, 1), COALESCE(q.paused, false),
       COALESCE(q.fair, false), COALESCE(q.sequenced, false), COALESCE(q.max_in_flight, 0), COALESCE(q.rate_limit, 0),
       u.unclaimed, u.due, u.oldest, c.claimed, d.dead, e.ended, w.waiting, s.snoozed, x.cancelling, now(),
       (SELECT y.ended_at FROM crdbwork_ended AS y WHERE y.queue = $1 ORDER BY y.ended_at DESC LIMIT 1),
       (SELECT y.died_at FROM crdbwork_dead_items AS y WHERE y.queue = $1 ORDER BY y.died_at DESC LIMIT 1),
       h.schedules, h.marked
FROM (SELECT 1) AS one
LEFT JOIN crdbwork_queues AS q ON q.name = $1
CROSS JOIN (
    SELECT count(*) AS unclaimed, count(*) FILTER (WHERE r.vesting_at <= now()) AS due,
           min(r.vesting_at) FILTER (WHERE r.vesting_at <= now()) AS oldest
    FROM (SELECT i.vesting_at FROM crdbwork_items AS i WHERE i.queue = $1 AND i.claim IS NULL
          ORDER BY i.priority, i.turn_at, i.part LIMIT $2) AS r) AS u
CROSS JOIN (
    SELECT count(*) AS claimed
    FROM (SELECT 1 FROM crdbwork_items AS i WHERE i.queue = $1 AND i.claim IS NOT NULL
          ORDER BY i.lease_until LIMIT $2) AS r) AS c
CROSS JOIN (
    SELECT count(*) AS dead
    FROM (SELECT 1 FROM crdbwork_dead_items AS y WHERE y.queue = $1 ORDER BY y.died_at LIMIT $2) AS r) AS d
CROSS JOIN (
    SELECT count(*) AS ended
    FROM (SELECT 1 FROM crdbwork_ended AS y WHERE y.queue = $1 AND y.ended_at > $3 ORDER BY y.ended_at LIMIT $2) AS r) AS e
CROSS JOIN (
    SELECT count(*) AS waiting
    FROM (SELECT 1 FROM crdbwork_waiting AS y WHERE y.queue = $1 ORDER BY y.enqueued_at LIMIT $2) AS r) AS w
CROSS JOIN (
    SELECT count(*) AS snoozed
    FROM (SELECT 1 FROM crdbwork_items AS i WHERE i.queue = $1 AND i.snoozes > 0 AND i.claim IS NULL LIMIT $2) AS r) AS s
CROSS JOIN (
    SELECT count(*) AS cancelling
    FROM (SELECT 1 FROM crdbwork_items AS i WHERE i.queue = $1 AND i.cancel_requested_at IS NOT NULL
          ORDER BY i.cancel_requested_at LIMIT $2) AS r) AS x
CROSS JOIN (
    SELECT count(*) AS schedules, max(r.updated_at) AS marked
    FROM (SELECT y.updated_at FROM crdbwork_schedules AS y WHERE y.queue = $1 ORDER BY y.name LIMIT $2) AS r) AS h`

// FleetQueueRow is one queue's figures, as FleetQueue reads them. The
// counts stop at the cap given: a count equal to it means "cap or more".
type FleetQueueRow struct {
	// Stored: the queue has a row in the queues table; NumParts, Paused,
	// Fair, Sequenced, MaxInFlight and Rate come from it (defaults
	// without one).
	Stored                  bool
	NumParts                int
	Paused, Fair, Sequenced bool
	MaxInFlight             int64
	Rate                    float64
	// Unclaimed items (≤ cap); Due and OldestDue (the vesting time of the
	// oldest due item, nil if none) are counted among the first cap of
	// them in claim order (exact when Unclaimed < cap).
	Unclaimed, Due int64
	OldestDue      *time.Time
	// Claimed, Dead, Waiting, Snoozed and Cancelling items, and items
	// Ended since the time given (all ≤ cap).
	Claimed, Dead, Ended, Waiting, Snoozed, Cancelling int64
	// Now is the database clock.
	Now time.Time
	// LastEnded and LastDied are the queue's latest end (acked, dead,
	// cancelled, taken: an ended id, kept for the dedup window) and
	// latest death (nil: none); Schedules counts its schedules (≤ cap),
	// ScheduleMarked is the latest period mark of one of them (nil: none).
	LastEnded, LastDied, ScheduleMarked *time.Time
	Schedules                           int64
}

// queueSQL is the text of fleetStatements.queue
// (rendered by newFleetStatements).
const queueSQL = fleetQueue

// FleetQueue reads the figures of the queue named, each count stopping at
// capAt rows (fleetQueue): one statement of limited index reads.
func (s *Store) FleetQueue(ctx context.Context, db DB, name string, capAt int64, endedSince time.Time) (FleetQueueRow, error) {
	var q FleetQueueRow
	var parts int64
	err := db.QueryRow(ctx, s.lazyFleet().queue, name, capAt, endedSince).Scan(&q.Stored, &parts, &q.Paused, &q.Fair,
		&q.Sequenced, &q.MaxInFlight, &q.Rate, &q.Unclaimed, &q.Due, &q.OldestDue, &q.Claimed, &q.Dead, &q.Ended,
		&q.Waiting, &q.Snoozed, &q.Cancelling, &q.Now, &q.LastEnded, &q.LastDied, &q.Schedules, &q.ScheduleMarked)
	q.NumParts = int(parts)
	return q, err
}

// kindsSQL is the text of fleetStatements.kinds: $1 queue, $2 limit → the
// queue's items by kind (the empty string for none): unclaimed, due
// (unclaimed and past its vesting time), the oldest due vesting time,
// claimed, and dead; the kinds with the most unclaimed items first (then
// claimed, dead, by name), at most $2 of them. Three branches, each over
// the index of its own count, grouped first and then summed: the unclaimed
// items through crdbwork_items_part_turn or crdbwork_items_turn_next
// (claim IS NULL), the claimed ones through crdbwork_items_lease (claim IS
// NOT NULL), the dead ones through crdbwork_dead_items_by_queue. No index
// holds the kind: each branch reads each of the queue's rows (as the
// backlog by part, inspectStatements.Unclaimed, which reads vesting_at); on
// a queue that holds much of the table, both engines may rather scan it.
// A filter on the queue alone, without the claim's predicate, would match
// no partial index and scan the table whatever the queue. The same text on
// both engines (sum of BIGINT is NUMERIC in PostgreSQL and DECIMAL in
// CockroachDB: cast back).
const kindsSQL = `SELECT k.kind, sum(k.unclaimed)::BIGINT, sum(k.due)::BIGINT, min(k.oldest), sum(k.claimed)::BIGINT, sum(k.dead)::BIGINT
FROM (
    SELECT COALESCE(i.kind, '') AS kind, count(*) AS unclaimed, count(*) FILTER (WHERE i.vesting_at <= now()) AS due,
           min(i.vesting_at) FILTER (WHERE i.vesting_at <= now()) AS oldest, 0::BIGINT AS claimed, 0::BIGINT AS dead
    FROM crdbwork_items AS i WHERE i.queue = $1 AND i.claim IS NULL
    GROUP BY COALESCE(i.kind, '')
    UNION ALL
    SELECT COALESCE(i.kind, ''), 0::BIGINT, 0::BIGINT, NULL::TIMESTAMPTZ, count(*), 0::BIGINT
    FROM crdbwork_items AS i WHERE i.queue = $1 AND i.claim IS NOT NULL
    GROUP BY COALESCE(i.kind, '')
    UNION ALL
    SELECT COALESCE(y.kind, ''), 0::BIGINT, 0::BIGINT, NULL::TIMESTAMPTZ, 0::BIGINT, count(*)
    FROM crdbwork_dead_items AS y WHERE y.queue = $1
    GROUP BY COALESCE(y.kind, '')) AS k
GROUP BY k.kind
ORDER BY sum(k.unclaimed) DESC, sum(k.claimed) DESC, sum(k.dead) DESC, k.kind
LIMIT $2`

// KindCount is one kind's items in a queue, as FleetKinds reads them.
type KindCount struct {
	// Kind is the kind ("" for the items without one).
	Kind string
	// Unclaimed items, of which Due are past their vesting time; OldestDue
	// is the vesting time of the oldest due one (nil: none is due).
	Unclaimed, Due int64
	OldestDue      *time.Time
	// Claimed and Dead items.
	Claimed, Dead int64
}

// FleetKinds reads the queue's items by kind (fleetStatements.kinds): at
// most limit kinds, those with the most unclaimed items first. It reads
// every item and dead item of the queue.
func (s *Store) FleetKinds(ctx context.Context, db DB, queue string, limit int) ([]KindCount, error) {
	rows, err := db.Query(ctx, s.lazyFleet().kinds, queue, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (KindCount, error) {
		var k KindCount
		err := row.Scan(&k.Kind, &k.Unclaimed, &k.Due, &k.OldestDue, &k.Claimed, &k.Dead)
		return k, err
	})
}

// waitingItemSQL is the text of fleetStatements.waitingItem: $1 id → the
// waiting item (enqueued with prerequisites not yet all acked), by its
// primary key.
const waitingItemSQL = `SELECT queue, item_key, priority, max_attempts, payload, metadata, tenant, enqueued_at, remaining, kind
FROM crdbwork_waiting WHERE id = $1`

// WaitingItemRow is a waiting item, as WaitingItem reads it.
type WaitingItemRow struct {
	Queue, Key, Tenant string
	Priority           int64
	MaxAttempts        int64
	Payload, Metadata  []byte
	EnqueuedAt         time.Time
	// Remaining counts the prerequisites not yet acked.
	Remaining int64
	// Kind is its kind ("" if none).
	Kind string
}

// WaitingItem reads the waiting item id, and false if id is not waiting
// (fleetStatements.waitingItem).
func (s *Store) WaitingItem(ctx context.Context, db DB, id uuid.UUID) (WaitingItemRow, bool, error) {
	var w WaitingItemRow
	var key, tenant, kind *string
	err := db.QueryRow(ctx, s.lazyFleet().waitingItem, id).Scan(&w.Queue, &key, &w.Priority, &w.MaxAttempts, &w.Payload,
		&w.Metadata, &tenant, &w.EnqueuedAt, &w.Remaining, &kind)
	if err == pgx.ErrNoRows {
		return WaitingItemRow{}, false, nil
	}
	if err != nil {
		return WaitingItemRow{}, false, err
	}
	w.Key, w.Tenant, w.Kind = deref(key), deref(tenant), deref(kind)
	return w, true, nil
}

// endedOfIDSQL is the text of fleetStatements.endedOfID: $1 the queues
// to look in, $2 id → the id's ended records in those queues: one
// primary-key lookup (queue, id) per queue, joined from the unnested
// list (no index leads with the id alone). Last, the record's kind, and
// the kind of the row a cancel kept for a requeue of the id
// (cancelledKind, one primary-key lookup), which EndedOfID falls back on
// for a cancelled record that holds no kind only: a row kept by an earlier
// cancel of an id that ran again since is stale. (A plain subquery:
// CockroachDB may not hoist one out of a CASE branch.)
var endedOfIDSQL = `SELECT e.queue, e.outcome, e.ended_at, e.cancel_by, e.cancel_reason, e.cancel_requested_at, e.was_running,
       e.attempts, e.enqueued_at, e.started_at, e.session, ` + attemptErrorsOf("e") + `, e.kind, ` + cancelledKind + `
FROM unnest($1::TEXT[]) AS u (q)
JOIN crdbwork_ended AS e ON e.queue = u.q AND e.id = $2
ORDER BY e.ended_at DESC`

// EndedRow is one ended record of an id (the item ended, and its queue
// remembers it for its dedup window).
type EndedRow struct {
	Queue string
	// Outcome is OutcomeAcked, OutcomeDead, OutcomeCancelled or
	// OutcomeTaken.
	Outcome string
	EndedAt time.Time
	// CancelBy, CancelReason, CancelRequestedAt and WasRunning describe a
	// cancel (zero for other outcomes, and for cancels before version 5).
	CancelBy, CancelReason string
	CancelRequestedAt      *time.Time
	WasRunning             bool
	// The history (schema version 6): the item's attempts (nil: the row
	// was written by older code, which recorded no history), its enqueue
	// time, its last attempt's start and session, and the item's errors
	// array of crdbwork_attempt_errors, read at lookup time (read it with
	// ParseHistory).
	Attempts   *int64
	EnqueuedAt *time.Time
	StartedAt  *time.Time
	Session    *uuid.UUID
	History    []byte
	// Kind is the item's kind, as its ended record holds it (schema
	// version 6), or for a cancelled item whose record holds none, from
	// the row its cancel kept for a requeue. "": none, or a record of code
	// older than version 6 (which records no kind).
	Kind string
}

// EndedOfID returns the ended records of id in the queues given, the most
// recent first (fleetStatements.endedOfID).
func (s *Store) EndedOfID(ctx context.Context, db DB, queues []string, id uuid.UUID) ([]EndedRow, error) {
	rows, err := db.Query(ctx, s.lazyFleet().endedOfID, queues, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EndedRow, error) {
		var r EndedRow
		var by, reason *string
		var running *bool
		var kind, keptKind *string
		err := row.Scan(&r.Queue, &r.Outcome, &r.EndedAt, &by, &reason, &r.CancelRequestedAt, &running,
			&r.Attempts, &r.EnqueuedAt, &r.StartedAt, &r.Session, &r.History, &kind, &keptKind)
		r.CancelBy, r.CancelReason, r.Kind = deref(by), deref(reason), deref(kind)
		if r.Kind == "" && r.Outcome == OutcomeCancelled {
			r.Kind = deref(keptKind)
		}
		r.WasRunning = running != nil && *running
		return r, err
	})
}

// auditFilterSQL is the text of fleetStatements.auditFilter: $1 actor, $2
// action, $3 queue ("" for any), $4 within, in microseconds before now()
// (NULL: any time), $5 and $6
// the position (at, id) to go on after (NULL: from the newest), $7 limit →
// audit rows, newest first. It reads crdbwork_audit_by_time backwards from
// the position down to now() - within, keeping the rows that match.
const auditFilterSQL = `SELECT id, at, actor, source, action, queue, detail FROM crdbwork_audit
WHERE ($1 = '' OR actor = $1) AND ($2 = '' OR action = $2) AND ($3 = '' OR queue = $3)
  AND ($4::BIGINT IS NULL OR at >= now() - $4::BIGINT * INTERVAL '1 microsecond')
  AND ($5::TIMESTAMPTZ IS NULL OR (at <= $5::TIMESTAMPTZ AND (at, id) < ($5::TIMESTAMPTZ, $6::UUID)))
ORDER BY at DESC, id DESC LIMIT $7`

// AuditFilter selects audit rows: each field set must match.
type AuditFilter struct {
	Actor, Action, Queue string
	// Within, if above 0, keeps the rows of the last Within (by the
	// database's clock, which stamped them).
	Within time.Duration
}

// AuditPageFilter reads up to limit audit rows that match f, newest first,
// older than the row after (nil: from the newest)
// (fleetStatements.auditFilter).
func (s *Store) AuditPageFilter(ctx context.Context, db DB, f AuditFilter, after *AuditRow, limit int) ([]AuditRow, error) {
	var at *time.Time
	var id *uuid.UUID
	if after != nil {
		at, id = &after.At, &after.ID
	}
	var within *int64
	if f.Within > 0 {
		us := f.Within.Microseconds()
		within = &us
	}
	rows, err := db.Query(ctx, s.lazyFleet().auditFilter, f.Actor, f.Action, f.Queue, within, at, id, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditRow, error) {
		var a AuditRow
		err := row.Scan(&a.ID, &a.At, &a.Actor, &a.Source, &a.Action, &a.Queue, &a.Detail)
		return a, err
	})
}

// privilegesLackingSQL: $1 table (qualified as the statements name it) →
// the current user and the table privileges crdbwork's roles use that the
// user lacks on it (has_table_privilege, on both engines). For the one
// line a command prints when the server refuses it for lack of a
// privilege (PostgreSQL's message names the table, not the privilege).
const privilegesLackingSQL = `SELECT current_user::TEXT,
       ARRAY(SELECT u.p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS u (p) WHERE NOT has_table_privilege($1, u.p))`

// schemaPrivilegesLackingSQL: $1 schema → the current user and which of
// USAGE and CREATE it lacks on the schema.
const schemaPrivilegesLackingSQL = `SELECT current_user::TEXT,
       ARRAY(SELECT u.p FROM unnest(ARRAY['USAGE', 'CREATE']) AS u (p) WHERE NOT has_schema_privilege($1, u.p))`

// PrivilegesLacking returns the current user and the privileges it lacks
// on the table (of SELECT, INSERT, UPDATE, DELETE), or, with schema set,
// on the schema (of USAGE, CREATE). The name is resolved by the server:
// an unqualified one by the search path.
func PrivilegesLacking(ctx context.Context, db DB, name string, schema bool) (user string, lacking []string, err error) {
	q := privilegesLackingSQL
	if schema {
		q = schemaPrivilegesLackingSQL
	}
	err = db.QueryRow(ctx, q, name).Scan(&user, &lacking)
	return user, lacking, err
}
