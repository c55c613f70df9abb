package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// The Store methods of package session: the sessions table (create,
// heartbeat, delete, reap, list) and queue membership.
//
// Like every Store method, each runs one statement, once: retrying
// transient errors, classifying them (Classify) and saying what failed is
// the caller's job, so the errors returned are the driver's, unwrapped. The statements are those of
// coreStatements, reapStatements and memberStatements, whose comments say what
// each reads and which engines accept it.

// SessionCounters are the counters a session reports with its heartbeats
// (HeartbeatReport) and that LiveSessions returns: items claimed, acked and
// failed since the session started, and handlers running now.
type SessionCounters struct {
	Claimed, Acked, Failed, InFlight int64
}

// SessionRow is one live session, as LiveSessions reads it.
type SessionRow struct {
	ID          uuid.UUID
	Name, Host  string
	PID         int64
	CreatedAt   time.Time
	HeartbeatAt time.Time
	// Expiry is the session's expiry; Age and SinceHeartbeat are the time
	// since its creation and since its last heartbeat, by the database
	// clock. All three are read in microseconds.
	Expiry, Age, SinceHeartbeat time.Duration
	// Reported are the counters of the session's last heartbeat.
	Reported SessionCounters
}

// MembershipRow is one session's membership of one queue (Memberships).
type MembershipRow struct {
	Queue    string
	Session  uuid.UUID
	JoinedAt time.Time
}

// PartOwnerRow is one owned part of one queue (AllPartOwners).
type PartOwnerRow struct {
	Queue   string
	Part    int
	Session uuid.UUID
}

// createSessionSQL is the text of coreStatements.CreateSession
// (rendered by newCoreStatements).
const createSessionSQL = `INSERT INTO crdbwork_sessions (expiry, host, pid, name)
VALUES ($1::BIGINT * INTERVAL '1 microsecond', $2, $3, $4) RETURNING id`

// SessionsCreate inserts a session row with the given expiry (stored in
// microseconds), host, process id and name, and returns its id.
func (s *Store) SessionsCreate(ctx context.Context, db DB, expiry time.Duration, host string, pid int, name string) (uuid.UUID, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, s.st.CreateSession, expiry.Microseconds(), host, pid, name).Scan(&id)
	return id, err
}

// heartbeatSQL is the text of coreStatements.Heartbeat
// (rendered by newCoreStatements).
const heartbeatSQL = `UPDATE crdbwork_sessions SET heartbeat_at = now() WHERE id = $1
RETURNING ` + changeMarkSQL + `, ` + sessionsReapAgeSQL + `, ` + aloneSQL

// sessionsReapAgeSQL is what a heartbeat returns second: how long ago
// (microseconds, by the database clock) a session last took the turn to
// reap expired sessions (crdbwork_reaps, name ”); NULL if none ever did.
// One seek by primary key.
const sessionsReapAgeSQL = `(SELECT (EXTRACT(EPOCH FROM now() - r.reaped_at) * 1000000)::BIGINT
 FROM crdbwork_reaps AS r WHERE r.name = '')`

// aloneSQL is what a heartbeat returns last: whether the session's row is
// the only one in the sessions table (no other session, live or expired),
// so that no session can be expired now (its own row was just stamped):
// the session then need not take the turn to reap expired sessions. The
// first row of another session ends the read (LIMIT 1), so in a fleet it
// costs one row; the session's own row is left out by its id, whichever
// version of it the read sees.
const aloneSQL = `((SELECT 1 FROM crdbwork_sessions AS o WHERE o.id <> $1 LIMIT 1) IS NULL)`

// Beat is what a heartbeat reads besides the session's own row.
type Beat struct {
	// Mark is the change marker of the queues the session joined (see
	// changeMarkSQL).
	Mark int64
	// SessionsReapAge is how long ago a session last took the turn to reap
	// expired sessions, by the database clock; SessionsReaped is false
	// when none ever did.
	SessionsReapAge time.Duration
	SessionsReaped  bool
	// Alone reports that no other session had a row when the heartbeat
	// ran (see aloneSQL): there was no expired session to reap.
	Alone bool
}

// changeMarkSQL is what a heartbeat returns beside the stamp: the change
// marker of the session's queues (see QueueChangesBump), the sum of the
// `changes` counters of the queues it joined, each plus one (so that a
// queue joined counts): it moves whenever one of them records a change.
const changeMarkSQL = `(SELECT COALESCE(sum(q.changes + 1), 0)
 FROM crdbwork_session_queues AS m JOIN crdbwork_queues AS q ON q.name = m.queue
 WHERE m.session_id = $1)`

// SessionsHeartbeat stamps session id's heartbeat with the database clock and
// reports whether the row is still there (false: it was reaped or
// deleted; the session is lost), and what the heartbeat read (Beat): the
// change marker of the queues the session joined (see changeMarkSQL), the
// age of the last reap of expired sessions and whether the session was
// alone (aloneSQL).
func (s *Store) SessionsHeartbeat(ctx context.Context, db DB, id uuid.UUID) (alive bool, beat Beat, err error) {
	return scanBeat(db.QueryRow(ctx, s.st.Heartbeat, id))
}

// scanBeat reads a heartbeat's answer: no row, the session is gone.
func scanBeat(row pgx.Row) (alive bool, beat Beat, err error) {
	var age *int64
	switch err = row.Scan(&beat.Mark, &age, &beat.Alone); {
	case errors.Is(err, pgx.ErrNoRows):
		return false, Beat{}, nil
	case err != nil:
		return false, Beat{}, err
	}
	if age != nil {
		beat.SessionsReapAge, beat.SessionsReaped = time.Duration(*age)*time.Microsecond, true
	}
	return true, beat, nil
}

// heartbeatReportSQL is the text of coreStatements.HeartbeatReport
// (rendered by newCoreStatements).
const heartbeatReportSQL = `UPDATE crdbwork_sessions
SET heartbeat_at = now(), claimed = $2, acked = $3, failed = $4, in_flight = $5
WHERE id = $1
RETURNING ` + changeMarkSQL + `, ` + sessionsReapAgeSQL + `, ` + aloneSQL

// SessionsHeartbeatReport is Heartbeat that also stores the session's counters in
// its row, in the same statement.
func (s *Store) SessionsHeartbeatReport(ctx context.Context, db DB, id uuid.UUID, c SessionCounters) (alive bool, beat Beat, err error) {
	return scanBeat(db.QueryRow(ctx, s.st.HeartbeatReport, id, c.Claimed, c.Acked, c.Failed, c.InFlight))
}

// deleteSessionSQL is the text of coreStatements.DeleteSession
// (rendered by newCoreStatements).
const deleteSessionSQL = `WITH bump AS (
    UPDATE crdbwork_queues SET changes = changes + 1
    WHERE name IN (SELECT queue FROM crdbwork_session_queues WHERE session_id = $1
                   UNION SELECT queue FROM crdbwork_session_parts WHERE session_id = $1)
    RETURNING 1)
DELETE FROM crdbwork_sessions WHERE id = $1`

// The deletion of a session (DeleteSession, ReapSessions, ReapSession)
// records a change (see QueueChangesBump) in every queue that the session
// joined or owns parts of, in the same statement: its deletion changes
// those queues' members and owners, and the foreign keys' cascades that
// delete its memberships and parts leave no trace that a peer can read
// cheaply. The CTE reads the memberships and parts in the statement's
// snapshot, before the cascades; on PostgreSQL the CTE and the DELETE run
// in one snapshot (a data-modifying CTE runs whether or not the outer
// statement reads it), on CockroachDB cascades run after the statement's
// own reads and writes. A session that heartbeats while a reap runs may
// cost its queues a needless bump, never a missed one. The queues are read
// only when a session is deleted (a one-time filter: the EXISTS of the
// reaps), so the reaps' common case, nothing expired, reads no queue.

// SessionsDelete deletes session id's row, which releases its claims, parts
// and memberships through the foreign keys. Deleting a row that is gone
// does nothing.
func (s *Store) SessionsDelete(ctx context.Context, db DB, id uuid.UUID) error {
	_, err := db.Exec(ctx, s.st.DeleteSession, id)
	return err
}

// reapSessionsSQL is the text of coreStatements.ReapSessions
// (rendered by newCoreStatements).
const reapSessionsSQL = `WITH gone AS MATERIALIZED (SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()),
bump AS (
    UPDATE crdbwork_queues SET changes = changes + 1
    WHERE name IN (SELECT queue FROM crdbwork_session_queues WHERE session_id IN (SELECT id FROM gone)
                   UNION SELECT queue FROM crdbwork_session_parts WHERE session_id IN (SELECT id FROM gone))
      AND EXISTS (SELECT 1 FROM gone)
    RETURNING 1)
DELETE FROM crdbwork_sessions WHERE id IN (SELECT id FROM gone) AND heartbeat_at + expiry < now()`

// SessionsReap deletes every session whose heartbeat is older than its
// expiry, by the database clock, and returns how many it deleted.
func (s *Store) SessionsReap(ctx context.Context, db DB) (int64, error) {
	tag, err := db.Exec(ctx, s.st.ReapSessions)
	return tag.RowsAffected(), err
}

// expiredSessionsSQL is the text of reapStatements.ExpiredSessions
// (rendered by newReapStatements).
const expiredSessionsSQL = `SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()`

// SessionsExpiredIDs returns the ids of the sessions whose heartbeat is
// older than their expiry (those ReapSessions deletes), in no set order.
func (s *Store) SessionsExpiredIDs(ctx context.Context, db DB) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.reap.ExpiredSessions)
}

// reapSessionSQL is the text of reapStatements.ReapSession
// (rendered by newReapStatements).
const reapSessionSQL = `WITH bump AS (
    UPDATE crdbwork_queues SET changes = changes + 1
    WHERE name IN (SELECT queue FROM crdbwork_session_queues WHERE session_id = $1
                   UNION SELECT queue FROM crdbwork_session_parts WHERE session_id = $1)
      AND EXISTS (SELECT 1 FROM crdbwork_sessions WHERE id = $1 AND heartbeat_at + expiry < now())
    RETURNING 1)
DELETE FROM crdbwork_sessions WHERE id = $1 AND heartbeat_at + expiry < now()`

// SessionsReapOne deletes session id if it is still expired and reports
// whether it did (false: it heartbeat meanwhile, or is gone).
func (s *Store) SessionsReapOne(ctx context.Context, db DB, id uuid.UUID) (bool, error) {
	tag, err := db.Exec(ctx, s.reap.ReapSession, id)
	return tag.RowsAffected() > 0, err
}

// coreLiveSessionsSQL is the text of coreStatements.LiveSessions
// (rendered by newCoreStatements).
const coreLiveSessionsSQL = `SELECT id, name, host, pid, created_at, heartbeat_at,
       (EXTRACT(EPOCH FROM expiry) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - created_at) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - heartbeat_at) * 1000000)::BIGINT,
       claimed, acked, failed, in_flight
FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id`

// SessionsLive returns the live sessions (heartbeat within their expiry,
// by the database clock), ordered by id.
func (s *Store) SessionsLive(ctx context.Context, db DB) ([]SessionRow, error) {
	rows, err := db.Query(ctx, s.st.LiveSessions)
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

// liveSessionIDsSQL is the text of coreStatements.LiveSessionIDs
// (rendered by newCoreStatements).
const liveSessionIDsSQL = `SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id`

// SessionsLiveIDs returns the ids of the live sessions, ordered: every
// queue's.
func (s *Store) SessionsLiveIDs(ctx context.Context, db DB) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.st.LiveSessionIDs)
}

// joinQueueSQL is the text of memberStatements.JoinQueue
// (rendered by newMemberStatements).
const joinQueueSQL = `WITH joined AS (
    INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ($1, $2)
    ON CONFLICT (queue, session_id) DO NOTHING
    RETURNING queue),
bump AS (UPDATE crdbwork_queues SET changes = changes + 1 WHERE name IN (SELECT queue FROM joined) RETURNING 1)
SELECT count(*) FROM joined`

// SessionsJoinQueue makes session a member of queue and reports whether it was
// not one before; a new membership records a change in the queue (see
// QueueChangesBump). When the session's row is gone it fails with the
// driver's foreign-key violation (SQLSTATE 23503).
func (s *Store) SessionsJoinQueue(ctx context.Context, db DB, queue string, session uuid.UUID) (bool, error) {
	var n int64
	err := db.QueryRow(ctx, s.member.JoinQueue, queue, session).Scan(&n)
	return n > 0, err
}

// leaveQueueSQL is the text of memberStatements.LeaveQueue
// (rendered by newMemberStatements).
const leaveQueueSQL = `WITH left_queue AS (
    DELETE FROM crdbwork_session_queues WHERE queue = $1 AND session_id = $2
    RETURNING queue)
UPDATE crdbwork_queues SET changes = changes + 1 WHERE name IN (SELECT queue FROM left_queue)`

// SessionsLeaveQueue ends session's membership of queue, if any, and then
// records a change in the queue (see QueueChangesBump).
func (s *Store) SessionsLeaveQueue(ctx context.Context, db DB, queue string, session uuid.UUID) error {
	_, err := db.Exec(ctx, s.member.LeaveQueue, queue, session)
	return err
}

// queueMembersSQL is the text of memberStatements.QueueMembers
// (rendered by newMemberStatements).
const queueMembersSQL = `SELECT s.id
FROM (SELECT session_id FROM crdbwork_session_queues WHERE queue = $1
      UNION
      SELECT session_id FROM crdbwork_session_parts WHERE queue = $1) AS m
JOIN crdbwork_sessions AS s ON s.id = m.session_id
WHERE s.heartbeat_at + s.expiry >= now()
ORDER BY s.id`

// SessionsQueueMembers returns the ids of queue's live members, ordered: the live
// sessions that joined it or own one of its parts (see
// memberStatements.QueueMembers).
func (s *Store) SessionsQueueMembers(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.member.QueueMembers, queue)
}

// joinedMembersSQL is the text of memberStatements.JoinedMembers
// (rendered by newMemberStatements).
const joinedMembersSQL = `SELECT s.id
FROM crdbwork_session_queues AS m
JOIN crdbwork_sessions AS s ON s.id = m.session_id
WHERE m.queue = $1 AND s.heartbeat_at + s.expiry >= now()
ORDER BY s.id`

// SessionsJoined returns the ids of the live sessions that joined queue,
// ordered (see memberStatements.JoinedMembers).
func (s *Store) SessionsJoined(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.member.JoinedMembers, queue)
}

// limitSharersSQL is the text of memberStatements.LimitSharers
// (rendered by newMemberStatements).
const limitSharersSQL = `SELECT s.id
FROM crdbwork_sessions AS s
WHERE s.heartbeat_at + s.expiry >= now()
  AND (EXISTS (SELECT 1 FROM crdbwork_session_queues AS m WHERE m.queue = $1 AND m.session_id = s.id)
       OR EXISTS (SELECT 1 FROM crdbwork_session_parts AS p WHERE p.queue = $1 AND p.session_id = s.id)
       OR NOT EXISTS (SELECT 1 FROM crdbwork_session_queues AS a WHERE a.session_id = s.id))
ORDER BY s.id`

// SessionsLimitSharers returns the ids of the live sessions that take a share of
// queue's fleet-wide limits when it is worked without parts, ordered (see
// memberStatements.LimitSharers).
func (s *Store) SessionsLimitSharers(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.member.LimitSharers, queue)
}

// membershipsSQL is the text of memberStatements.Memberships
// (rendered by newMemberStatements).
const membershipsSQL = `SELECT queue, session_id, joined_at FROM crdbwork_session_queues ORDER BY queue, session_id`

// SessionsMemberships returns every queue membership, ordered by queue and session.
// It reads the whole membership table.
func (s *Store) SessionsMemberships(ctx context.Context, db DB) ([]MembershipRow, error) {
	rows, err := db.Query(ctx, s.member.Memberships)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (MembershipRow, error) {
		var m MembershipRow
		err := row.Scan(&m.Queue, &m.Session, &m.JoinedAt)
		return m, err
	})
}

// allPartOwnersSQL is the text of memberStatements.AllPartOwners
// (rendered by newMemberStatements).
const allPartOwnersSQL = `SELECT queue, part, session_id FROM crdbwork_session_parts ORDER BY queue, part`

// PartsOwnersAll returns every owned part of every queue, ordered by queue
// and part. It reads the whole part ownership table.
func (s *Store) PartsOwnersAll(ctx context.Context, db DB) ([]PartOwnerRow, error) {
	rows, err := db.Query(ctx, s.member.AllPartOwners)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PartOwnerRow, error) {
		var o PartOwnerRow
		var part int64
		err := row.Scan(&o.Queue, &part, &o.Session)
		o.Part = int(part)
		return o, err
	})
}

// readSessionIDs runs stmt, which returns one UUID column, and collects the ids.
func (s *Store) readSessionIDs(ctx context.Context, db DB, stmt string, args ...any) ([]uuid.UUID, error) {
	rows, err := db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// memberStatements are the statements of queue membership (schema version
// 4, crdbwork_session_queues): which sessions work which queue. A queue's
// parts (package partition) and its fleet-wide limit shares (package
// worker) are divided among the queue's live members only, so that many
// queues share one database without one queue's sessions counting in
// another's division. They are rendered for one set of table names; the
// text is identical on CockroachDB and PostgreSQL.
//
// Checked against CockroachDB's documentation: INSERT … ON CONFLICT
// (columns) DO NOTHING (https://www.cockroachlabs.com/docs/v23.1/insert,
// "on_conflict"; it needs the SELECT privilege besides INSERT, as on
// PostgreSQL); UNION of two SELECTs in a FROM subquery ("Selection
// queries", set operations); a join on the sessions table's primary key,
// which its optimizer may plan as a lookup join (not checked on a server:
// none runs here). Both engines accept every statement as written.
type memberStatements struct {
	// JoinQueue makes session $2 a member of queue $1 → rows affected (0:
	// it already was). It fails with a foreign-key violation (SQLSTATE
	// 23503) when the session row is gone. Idempotent: it runs again
	// harmlessly after an unknown outcome.
	JoinQueue string
	// LeaveQueue ends session $2's membership of queue $1 → rows affected.
	LeaveQueue string
	// QueueMembers returns the ids of queue $1's live members, ordered:
	// the live sessions (heartbeat_at + expiry >= now(), as LiveSessionIDs)
	// that joined the queue, or that own one of its parts. The second
	// branch keeps counting the sessions of code that predates membership
	// (schema version 3 sessions do not join; they do own parts), so that
	// a rolling upgrade divides the parts among old and new sessions alike
	// once the old ones hold parts.
	//
	// It reads two index prefixes (crdbwork_session_queues by its primary
	// key (queue, session_id), and crdbwork_session_parts by its unique
	// index (queue, part), which on CockroachDB also holds session_id, as
	// every secondary index holds the primary key) and then looks the
	// sessions up by primary key: its cost follows the queue's members,
	// not the number of sessions or queues in the database
	// (internal/store/sessions_members_explain_test.go checks the plans on PostgreSQL, with
	// 50,000 sessions; with a few hundred, PostgreSQL rightly prefers to
	// hash-join a read of the small sessions table).
	QueueMembers string
	// JoinedMembers returns the ids of the live sessions that joined queue
	// $1, ordered: QueueMembers less the members that only own parts (the
	// sessions of code that predates membership, which the rebalancer
	// leaves exactly the parts they hold). It reads the membership table's
	// key prefix and looks the sessions up by primary key.
	JoinedMembers string
	// LimitSharers returns the ids of the live sessions that take a share
	// of queue $1's fleet-wide limits when it is worked without parts,
	// ordered: its members (as QueueMembers), and also every live session
	// that joined no queue at all. Those are sessions of code that predates
	// membership (or sessions in the moment between their start and their
	// join): such code divides a limit among every live session, so
	// counting them here too keeps the shares' sum within the limit while
	// old and new workers share a queue (it can only lower the new
	// sessions' shares). It reads the sessions table whole: its size is the
	// fleet's, and workers read it once per limit refresh.
	LimitSharers string
	// Memberships returns every membership: queue, session_id, joined_at,
	// ordered by queue and session (for operators: crdbwork status). It reads
	// the whole (small) table.
	Memberships string
	// AllPartOwners returns every owned part: queue, part, session_id,
	// ordered by queue and part (for operators: crdbwork status). It reads the
	// whole (small) table.
	AllPartOwners string
}

// newMemberStatements renders the membership statements for t.
func newMemberStatements(t Tables) *memberStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &memberStatements{
		JoinQueue:     r(joinQueueSQL),
		LeaveQueue:    r(leaveQueueSQL),
		JoinedMembers: r(joinedMembersSQL),
		LimitSharers:  r(limitSharersSQL),
		QueueMembers:  r(queueMembersSQL),
		Memberships:   r(membershipsSQL),
		AllPartOwners: r(allPartOwnersSQL),
	}
}

// IdleInTransactionTimeout reads the connection's
// idle_in_transaction_session_timeout: how long the server lets a
// transaction wait for its client before it ends the transaction and the
// connection ("0": never). PostgreSQL answers in its own units ("1500ms",
// "5s", "0"); package worker reads it once per Run to warn when a frozen
// process's open transaction could hold its locks for ever (see
// session.ConfigurePool). It reads no table. CockroachDB has the session
// variable since v20.2 (cockroach#52938) and the current_setting builtin
// (its "Functions and Operators", system info functions); it shows
// durations in its own format, which session.ParseSetting also reads
// (milliseconds, units, or an interval "HH:MM:SS").
const IdleInTransactionTimeout = `SELECT current_setting('idle_in_transaction_session_timeout')`

// reapStatements delete expired sessions one at a time: the fallback of a
// reap of every expired session (coreStatements.ReapSessions) that could not
// finish because one expired session's rows are locked (by a transaction
// its frozen process left open), so that the other expired sessions are
// still deleted. Both are plain on CockroachDB and PostgreSQL.
type reapStatements struct {
	// ExpiredSessions returns the ids of the expired sessions (heartbeat_at
	// + expiry < now(), as ReapSessions). It reads the sessions table,
	// whose size is the fleet's, as ReapSessions does.
	ExpiredSessions string
	// ReapSession deletes session $1 if it is still expired → rows
	// affected (0: it heartbeat meanwhile, or is gone). It finds the row by
	// primary key; the expiry is checked again so that a session that came
	// back since the list was read is never deleted.
	ReapSession string
}

// newReapStatements renders the reapStatements for t.
func newReapStatements(t Tables) *reapStatements {
	r := func(text string) string { return rewrite(t, text) }
	return &reapStatements{
		ExpiredSessions: r(expiredSessionsSQL),
		ReapSession:     r(reapSessionSQL),
	}
}
