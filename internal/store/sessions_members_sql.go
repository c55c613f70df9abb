package store

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
