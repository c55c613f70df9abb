package sql

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
// Store is low-level: its methods follow what crdbwork's own packages need
// and change between versions without notice. Applications use the claim,
// session, partition and worker packages instead.
//
// A Store is rendered once per set of tables (NewStore returns the same
// value for equal Tables) and is safe for concurrent use. Methods whose
// statement differs between the engines take the Dialect of the connection
// (see DetectDialect).
type Store struct {
	t Tables

	st     *Statements
	lim    *LimitStatements
	death  *DeathStatements
	dedup  *DedupStatements
	enq    *EnqueueStatements
	fair   *FairStatements
	insp   *InspectStatements
	member *MemberStatements
	parts  *PartClaimStatements
	move   *MoveStatements
	sched  *ScheduleStatements
	reap   *ReapStatements
	urgent *UrgentStatements
	test   *TestStatements

	order string // OrderCountsBefore's statement (store_order.go)
}

// stores caches the rendered Stores by table set: rendering is done once per
// table set for the life of the process, and the table sets a process uses
// are few (one, usually).
var stores sync.Map // Tables → *Store

// NewStore returns the Store of t, rendering its statements on first use.
// It does no I/O. Tables that do not validate (see Tables.Validate) render
// nonetheless; the packages that take Tables from users validate them first.
func NewStore(t Tables) *Store {
	if s, ok := stores.Load(t); ok {
		return s.(*Store)
	}
	s := &Store{
		t:      t,
		st:     NewStatements(t),
		lim:    NewLimitStatements(t),
		death:  NewDeathStatements(t),
		dedup:  NewDedupStatements(t),
		enq:    NewEnqueueStatements(t),
		fair:   NewFairStatements(t),
		insp:   NewInspectStatements(t),
		member: NewMemberStatements(t),
		parts:  NewPartClaimStatements(t),
		move:   NewMoveStatements(t),
		sched:  NewScheduleStatements(t),
		reap:   NewReapStatements(t),
		urgent: NewUrgentStatements(t),
		test:   NewTestStatements(t),
		order:  t.rewrite(orderCountBefore),
	}
	actual, _ := stores.LoadOrStore(t, s)
	return actual.(*Store)
}

// Tables returns the table set the Store's statements name.
func (s *Store) Tables() Tables { return s.t }
