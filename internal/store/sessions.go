package store

import (
	"context"
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

// CreateSession inserts a session row with the given expiry (stored in
// microseconds), host, process id and name, and returns its id.
func (s *Store) CreateSession(ctx context.Context, db DB, expiry time.Duration, host string, pid int, name string) (uuid.UUID, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, s.st.CreateSession, expiry.Microseconds(), host, pid, name).Scan(&id)
	return id, err
}

// heartbeatSQL is the text of coreStatements.Heartbeat
// (rendered by newCoreStatements).
const heartbeatSQL = `UPDATE crdbwork_sessions SET heartbeat_at = now() WHERE id = $1`

// Heartbeat stamps session id's heartbeat with the database clock and
// reports whether the row is still there (false: it was reaped or
// deleted; the session is lost).
func (s *Store) Heartbeat(ctx context.Context, db DB, id uuid.UUID) (bool, error) {
	tag, err := db.Exec(ctx, s.st.Heartbeat, id)
	return tag.RowsAffected() > 0, err
}

// heartbeatReportSQL is the text of coreStatements.HeartbeatReport
// (rendered by newCoreStatements).
const heartbeatReportSQL = `UPDATE crdbwork_sessions
SET heartbeat_at = now(), claimed = $2, acked = $3, failed = $4, in_flight = $5
WHERE id = $1`

// HeartbeatReport is Heartbeat that also stores the session's counters in
// its row, in the same statement.
func (s *Store) HeartbeatReport(ctx context.Context, db DB, id uuid.UUID, c SessionCounters) (bool, error) {
	tag, err := db.Exec(ctx, s.st.HeartbeatReport, id, c.Claimed, c.Acked, c.Failed, c.InFlight)
	return tag.RowsAffected() > 0, err
}

// deleteSessionSQL is the text of coreStatements.DeleteSession
// (rendered by newCoreStatements).
const deleteSessionSQL = `DELETE FROM crdbwork_sessions WHERE id = $1`

// DeleteSession deletes session id's row, which releases its claims, parts
// and memberships through the foreign keys. Deleting a row that is gone
// does nothing.
func (s *Store) DeleteSession(ctx context.Context, db DB, id uuid.UUID) error {
	_, err := db.Exec(ctx, s.st.DeleteSession, id)
	return err
}

// reapSessionsSQL is the text of coreStatements.ReapSessions
// (rendered by newCoreStatements).
const reapSessionsSQL = `DELETE FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()`

// ReapSessions deletes every session whose heartbeat is older than its
// expiry, by the database clock, and returns how many it deleted.
func (s *Store) ReapSessions(ctx context.Context, db DB) (int64, error) {
	tag, err := db.Exec(ctx, s.st.ReapSessions)
	return tag.RowsAffected(), err
}

// expiredSessionsSQL is the text of reapStatements.ExpiredSessions
// (rendered by newReapStatements).
const expiredSessionsSQL = `SELECT id FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()`

// ExpiredSessionIDs returns the ids of the sessions whose heartbeat is
// older than their expiry (those ReapSessions deletes), in no set order.
func (s *Store) ExpiredSessionIDs(ctx context.Context, db DB) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.reap.ExpiredSessions)
}

// reapSessionSQL is the text of reapStatements.ReapSession
// (rendered by newReapStatements).
const reapSessionSQL = `DELETE FROM crdbwork_sessions WHERE id = $1 AND heartbeat_at + expiry < now()`

// ReapSession deletes session id if it is still expired and reports
// whether it did (false: it heartbeat meanwhile, or is gone).
func (s *Store) ReapSession(ctx context.Context, db DB, id uuid.UUID) (bool, error) {
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

// LiveSessions returns the live sessions (heartbeat within their expiry,
// by the database clock), ordered by id.
func (s *Store) LiveSessions(ctx context.Context, db DB) ([]SessionRow, error) {
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

// LiveSessionIDs returns the ids of the live sessions, ordered: every
// queue's.
func (s *Store) LiveSessionIDs(ctx context.Context, db DB) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.st.LiveSessionIDs)
}

// joinQueueSQL is the text of memberStatements.JoinQueue
// (rendered by newMemberStatements).
const joinQueueSQL = `INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ($1, $2)
ON CONFLICT (queue, session_id) DO NOTHING`

// JoinQueue makes session a member of queue and reports whether it was
// not one before. When the session's row is gone it fails with the
// driver's foreign-key violation (SQLSTATE 23503).
func (s *Store) JoinQueue(ctx context.Context, db DB, queue string, session uuid.UUID) (bool, error) {
	tag, err := db.Exec(ctx, s.member.JoinQueue, queue, session)
	return tag.RowsAffected() > 0, err
}

// leaveQueueSQL is the text of memberStatements.LeaveQueue
// (rendered by newMemberStatements).
const leaveQueueSQL = `DELETE FROM crdbwork_session_queues WHERE queue = $1 AND session_id = $2`

// LeaveQueue ends session's membership of queue, if any.
func (s *Store) LeaveQueue(ctx context.Context, db DB, queue string, session uuid.UUID) error {
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

// QueueMembers returns the ids of queue's live members, ordered: the live
// sessions that joined it or own one of its parts (see
// memberStatements.QueueMembers).
func (s *Store) QueueMembers(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.member.QueueMembers, queue)
}

// joinedMembersSQL is the text of memberStatements.JoinedMembers
// (rendered by newMemberStatements).
const joinedMembersSQL = `SELECT s.id
FROM crdbwork_session_queues AS m
JOIN crdbwork_sessions AS s ON s.id = m.session_id
WHERE m.queue = $1 AND s.heartbeat_at + s.expiry >= now()
ORDER BY s.id`

// JoinedMembers returns the ids of the live sessions that joined queue,
// ordered (see memberStatements.JoinedMembers).
func (s *Store) JoinedMembers(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
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

// LimitSharers returns the ids of the live sessions that take a share of
// queue's fleet-wide limits when it is worked without parts, ordered (see
// memberStatements.LimitSharers).
func (s *Store) LimitSharers(ctx context.Context, db DB, queue string) ([]uuid.UUID, error) {
	return s.readSessionIDs(ctx, db, s.member.LimitSharers, queue)
}

// membershipsSQL is the text of memberStatements.Memberships
// (rendered by newMemberStatements).
const membershipsSQL = `SELECT queue, session_id, joined_at FROM crdbwork_session_queues ORDER BY queue, session_id`

// Memberships returns every queue membership, ordered by queue and session.
// It reads the whole membership table.
func (s *Store) Memberships(ctx context.Context, db DB) ([]MembershipRow, error) {
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

// AllPartOwners returns every owned part of every queue, ordered by queue
// and part. It reads the whole part ownership table.
func (s *Store) AllPartOwners(ctx context.Context, db DB) ([]PartOwnerRow, error) {
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
