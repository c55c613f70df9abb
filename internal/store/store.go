package store

import (
	"sync"
)

// Store runs crdbwork's statements on one set of tables. It is the typed
// boundary between the SQL text, which stays unexported in this package, and
// the packages that use it (session, partition, claim, worker, schedule,
// metrics, workertest): each statement is a method taking its parameters as
// Go values and returning its results as Go values, so that no caller orders
// placeholders or scans columns by hand, and every statement an EXPLAIN test
// covers is one a method runs.
//
// A Store is rendered once per set of tables (New returns the same
// value for equal Tables) and is safe for concurrent use. Methods whose
// statement differs between the engines take the Dialect of the connection
// (see DetectDialect).
type Store struct {
	t Tables

	st     *coreStatements
	lim    *limitStatements
	death  *deathStatements
	dedup  *dedupStatements
	enq    *enqueueStatements
	fair   *fairStatements
	insp   *inspectStatements
	member *memberStatements
	parts  *partClaimStatements
	move   *moveStatements
	sched  *scheduleStatements
	reap   *reapStatements
	urgent *urgentStatements
	seq    *sequenceStatements
	test   *testStatements
	ckpt   *checkpointStatements
	ret    *retentionStatements

	order string // OrderCountsBefore's statement (items_order.go)
	// ackAll is the all-or-nothing PostgreSQL ack of the pipelined ack
	// (items_ack.go).
	ackAll string
	pace   string // FairFront's statement (items_fair.go)
	pgPace string // and its PostgreSQL twin

	// The groups only some processes run (the operator's commands, the
	// dashboard, the demo, the idle probe, dependencies, cancels), rendered
	// on first use, once per Store.
	lazyAdmin  func() *adminStatements
	lazyCancel func() *cancelStatements
	// lazyCancelled renders the kept cancelled items' statements.
	lazyCancelled func() *cancelledStatements
	lazyDeps      [2]func() *dependsStatements // by Dialect
	lazyAcross    [2]func() *acrossStatements  // by Dialect (cross-queue prerequisites)
	lazyRefused   func() *refusedStatements
	lazyProbe     func() *probeStatements
	lazyIdle      func() *idleStatements
	lazyDash      func() *dashboardStatements
	lazyDemo      func() *demoStatements
	lazyFleet     func() *fleetStatements
	lazyHistory   func() *historyStatements
}

// stores caches the rendered Stores by table set: rendering is done once per
// table set for the life of the process, and the table sets a process uses
// are few (one, usually).
var stores sync.Map // Tables → *Store

// New returns the Store of t, rendering its statements on first use.
// It does no I/O. Tables that do not validate (see Tables.Validate) render
// nonetheless; the packages that take Tables from users validate them first.
func New(t Tables) *Store {
	if s, ok := stores.Load(t); ok {
		return s.(*Store)
	}
	s := &Store{
		t:      t,
		st:     newCoreStatements(t),
		lim:    newLimitStatements(t),
		death:  newDeathStatements(t),
		dedup:  newDedupStatements(t),
		enq:    newEnqueueStatements(t),
		fair:   newFairStatements(t),
		insp:   newInspectStatements(t),
		member: newMemberStatements(t),
		parts:  newPartClaimStatements(t),
		move:   newMoveStatements(t),
		sched:  newScheduleStatements(t),
		reap:   newReapStatements(t),
		urgent: newUrgentStatements(t),
		seq:    newSequenceStatements(t),
		test:   newTestStatements(t),
		ckpt:   newCheckpointStatements(t),
		ret:    newRetentionStatements(t),
		order:  rewrite(t, orderCountBefore),
		pace:   rewrite(t, fairFront),
		pgPace: rewrite(t, pgHideQueue(fairFront, fairHeadAnchor, "$1")),
	}
	s.ackAll = ackAllOf(t, s.st.PostgresAckMany)
	s.lazyAdmin = sync.OnceValue(func() *adminStatements { return newAdminStatements(t) })
	s.lazyCancel = sync.OnceValue(func() *cancelStatements { return newCancelStatements(t) })
	s.lazyCancelled = sync.OnceValue(func() *cancelledStatements { return newCancelledStatements(t) })
	s.lazyDeps[Postgres] = sync.OnceValue(func() *dependsStatements { return newDependsStatements(t, Postgres) })
	s.lazyDeps[Cockroach] = sync.OnceValue(func() *dependsStatements { return newDependsStatements(t, Cockroach) })
	s.lazyAcross[Postgres] = sync.OnceValue(func() *acrossStatements { return newAcrossStatements(t, Postgres) })
	s.lazyAcross[Cockroach] = sync.OnceValue(func() *acrossStatements { return newAcrossStatements(t, Cockroach) })
	s.lazyRefused = sync.OnceValue(func() *refusedStatements { return newRefusedStatements(t) })
	s.lazyProbe = sync.OnceValue(func() *probeStatements { return newProbeStatements(t) })
	s.lazyIdle = sync.OnceValue(func() *idleStatements { return newIdleStatements(t) })
	s.lazyDash = sync.OnceValue(func() *dashboardStatements { return newDashboardStatements(t) })
	s.lazyDemo = sync.OnceValue(func() *demoStatements { return newDemoStatements(t) })
	s.lazyFleet = sync.OnceValue(func() *fleetStatements { return newFleetStatements(t) })
	s.lazyHistory = sync.OnceValue(func() *historyStatements { return newHistoryStatements(t) })
	actual, _ := stores.LoadOrStore(t, s)
	return actual.(*Store)
}

// Tables returns the table set the Store's statements name.
func (s *Store) Tables() Tables { return s.t }
