package store

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
	}
}
