package worker

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
)

// Defaults for Options.
const (
	DefaultConcurrency     = 8
	DefaultPoll            = 150 * time.Millisecond
	DefaultItemTimeout     = 5 * time.Minute
	DefaultShutdownTimeout = 10 * time.Second
	DefaultRestartDelay    = time.Second
	DefaultStartTimeout    = 30 * time.Second
	// DefaultMaxAckBatch is the least default of Options.MaxAckBatch:
	// the default is a quarter of Concurrency, at least this and at most
	// MaxDefaultAckBatch.
	DefaultMaxAckBatch  = 64
	MaxDefaultAckBatch  = 256
	DefaultAckers       = 2
	DefaultGatherWait   = 5 * time.Millisecond
	DefaultHangGrace    = 2 * time.Second
	DefaultMaxAbandoned = 8
)

// MaxDuration bounds every duration of Options: far above any useful value,
// it keeps the worker's arithmetic on durations from overflowing.
const MaxDuration = 365 * 24 * time.Hour

// Options configure a Worker. The zero value is valid: 8 handlers, no
// parts, silent. The queue's name, tables, retry policy and lease are the
// claim.Queue's given to New, not options of the worker.
type Options struct {
	// Concurrency is the number of handlers running at once. Default 8.
	// It does not change the number of connections (see Connections).
	Concurrency int
	// Parts is the queue's number of parts; 0 turns parts mode off (any
	// session claims any item). With parts, the session claims only in the
	// parts the rebalancer gives it, so claims never contend. A queue with no
	// stored part count gets Parts; a different stored count wins (with a
	// warning in the log): change it with partition.SetParts. At most
	// partition.MaxParts.
	Parts int
	// Poll is the claim interval when the queue is idle (a random value
	// between Poll/2 and Poll·3/2 each time). While claims come back full,
	// the worker claims again at once. Default 150 ms. Wake-ups (see
	// NoWake) end an idle wait early; Poll stays the fallback.
	Poll time.Duration
	// NoWake turns wake-ups off: the idle worker then claims only at its
	// Poll interval. With wake-ups (the default), an idle worker claims at
	// once when items are enqueued: by an enqueue through a claim.Queue of
	// the same queue and tables in this process (after its commit, on
	// both engines), and on PostgreSQL by the notification that every
	// enqueue of any process sends at commit (claim.Options.NoNotify),
	// which the process's listener receives: one connection of its own
	// per process and database, shared by all its workers (see
	// Connections), opened by the first worker's Run and closed after the
	// last one's. The listener never delays claims: while its connection
	// is down (it reconnects with backoff, from 100 ms to 10 s) or silent
	// (checked every 10 s), workers claim at their Poll interval. The
	// listener needs the pool's connection settings: with a database that
	// is neither a *pgxpool.Pool nor a *pgx.Conn, only in-process
	// wake-ups remain. CockroachDB has no LISTEN: there the process's idle
	// probe (see Wake) finds what other processes enqueued.
	NoWake bool
	// ItemTimeout bounds one handler run. Default 5 min. The handlers of
	// items claimed within a short window share one deadline, the latest
	// of theirs: a handler's context may end up to a thousandth of
	// ItemTimeout (at most 5 ms) after ItemTimeout from its start, never
	// sooner.
	ItemTimeout time.Duration
	// HangGrace is how long the worker still waits for a handler whose
	// context ended (ItemTimeout, a lost session, a shutdown) before it
	// abandons it: it stops waiting, nacks the item as timed out (or
	// releases it when stopping) and frees its slot. The handler's
	// goroutine runs on, counted in Stats.Abandoned. Default 2 s.
	HangGrace time.Duration
	// MaxAbandoned bounds the abandoned handler goroutines still running:
	// while that many run, the worker claims only as many items as
	// Concurrency + MaxAbandoned less the running handler goroutines
	// allow, so handlers that never return cannot pile up goroutines
	// without bound (the worker rather stops claiming, and logs why).
	// Default 8; negative: none.
	MaxAbandoned int
	// ShutdownTimeout bounds each step of a graceful stop: waiting for
	// in-flight handlers (then they are cancelled), waiting for the
	// cancelled ones and their settles, closing the session. Default 10 s.
	ShutdownTimeout time.Duration
	// RestartDelay is the pause before a new session after one was lost,
	// and between tries of a first start. Default 1 s.
	RestartDelay time.Duration
	// StartTimeout bounds how long Run keeps trying to start its first
	// session while that fails for a transient reason (the database
	// unreachable or restarting); then Run returns the error. A schema
	// that is not this code's, bad options or a refused login return at
	// once. Default 30 s.
	StartTimeout time.Duration
	// MaxAckBatch bounds the items acked in one transaction. Handlers that
	// finish while an ack transaction commits are acked together in the
	// next (group commit; see claim.Queue.AckMany), which costs no waiting
	// and far fewer transactions. 1 acks every item in its own transaction.
	// Default: a quarter of Concurrency, at least DefaultMaxAckBatch (64)
	// and at most MaxDefaultAckBatch (256), so that many handlers finishing
	// together are acked in few transactions (the ack is one statement per
	// transaction, whatever its size).
	MaxAckBatch int
	// Ackers is the number of settle goroutines: each acks (in batches),
	// nacks and releases items on one connection at a time. Two keep the
	// handlers busy while one transaction commits: items that finish
	// during a commit are gathered by the other. Default 2.
	Ackers int
	// GatherWait bounds how long a busy worker waits, after a handler slot
	// frees, for more slots to free before it claims, while the queue has
	// a backlog: a claim then takes several items and the database runs a
	// fraction of the claim statements, at the cost of a few milliseconds
	// of idle slots. Default 5 ms; negative: claim as soon as a slot frees.
	GatherWait time.Duration
	// Session tunes the worker's sessions (heartbeat, expiry, clock
	// margin); Session.ReapEvery is the interval of the fleet's reap of
	// expired sessions (a worker's session takes the turn when its
	// heartbeat finds the last reap of any version-6 worker that old and
	// another session's row; the session itself does not reap: see
	// Connections), Session.ReapTimeout
	// bounds each of its reaps.
	// Session.Expiry is also the idle_in_transaction_session_timeout that
	// ConfigurePool gives the pool: a Record or BatchRecord must not leave
	// its ack transaction idle that long between statements. Partition
	// tunes the rebalancer of parts mode. The sessions and the rebalancer
	// take the queue's name and tables, and log to Logger.
	Session   session.Tuning
	Partition partition.Tuning
	// Wake selects how an idle worker learns of items that other
	// processes enqueued (see WakeMode): by default LISTEN on PostgreSQL
	// and the idle probe on CockroachDB. Not used with NoWake (see
	// NoWake, Poll).
	Wake WakeMode
	// ProbeEvery is the idle probe's interval: default 30 ms (see
	// WakeProbe). ProbePoll is an idle worker's claim interval while the
	// probe answers, in place of Poll (drawn between half and one and a
	// half of it): default 2 s, never below Poll.
	ProbeEvery, ProbePoll time.Duration
	// ListenPoll is an idle worker's claim interval while the process's
	// wake-up listener listens on the queue's channel (PostgreSQL, wake-ups
	// on), in place of Poll (drawn between half and one and a half of it):
	// default 10 s (DefaultListenPoll), never below Poll; negative: Poll
	// (the behaviour before 0.6). Every enqueue notifies the listener, so
	// the worker needs no poll to find enqueued items; ListenPoll is a
	// safety net for items that become claimable without a notification:
	// items that vest later (a delayed enqueue, a nack's backoff) are
	// claimed when they vest, since after activity an idle worker looks up
	// when the first unclaimed item of its parts vests (one bounded read,
	// store.IdleLookLimit rows); items released by a lease reap or nacked
	// by another process are claimed within ListenPoll, or at once when a
	// session of the queue ends (its peers' heartbeats see the queue's
	// change marker move). When the listener stops listening (its
	// connection failed, or its check found it silent), idle workers are
	// woken and go back to Poll. Where items can be claimable without a
	// notification for long (producers with claim.Options.NoNotify; a
	// sequenced queue, whose keys' next items wait for other processes'
	// acks; held-back items: a paused queue, limits, items out of
	// attempts), the worker polls at Poll as before: set its own queue's
	// NoNotify when its producers set theirs.
	ListenPoll time.Duration
	// Name is stored in the row of each of the worker's sessions, for
	// operators (for example "demo-worker-3"; session.Options.Name).
	Name string
	// Logger receives structured logs. Default: none.
	Logger *zap.Logger
	// BatchRecord, if not nil, records the results of each ack transaction
	// in one call (one multi-row INSERT or COPY rather than one statement
	// per item), in that transaction, after the items' own Records: it gets
	// the requests of the items whose claims held, each with the Value its
	// handler set with RecordValue (nil if none). Like Record, it may run
	// more than once; only one run's writes commit. If it fails, the items
	// of the transaction are acked again one by one (each with a batch of
	// one), so only an item it cannot record is nacked.
	BatchRecord claim.BatchRecord
	// BatchStatement, if not nil, records the results of each ack
	// transaction with one SQL statement (claim.BatchStatement), after
	// BatchRecord if both are set; it gets the same requests. Used alone
	// (and with handlers that return no Record), it lets each ack
	// transaction go to PostgreSQL in one round trip instead of four
	// (claim.AckOptions.Statement). If its statement fails, the items are
	// acked again one by one, as with BatchRecord.
	BatchStatement claim.BatchStatement
	// Observer, if not nil, is told of every handler run and every ack
	// transaction, for metrics (package metrics implements it); of the
	// kind of each run's item too if it is a KindObserver. Default: none.
	Observer Observer
	// Middleware, if not nil, wraps the handler once, when New is called:
	// the worker runs Middleware(handler) for every item. The wrapper gets
	// the handler's context and item and must call the handler it wraps
	// (or fail the item) and return what it returned: for example start a
	// span from the trace context in claim.Item.Headers (package
	// otelcrdbwork's Middleware), log, or recover in its own way. Compose
	// several by nesting them. Default: none.
	Middleware func(Handler) Handler
	// UrgentLane turns the urgent lane on (parts mode only): each claim
	// first takes, from any part, items with priority at most
	// UrgentPriority (claim.Claimer.ClaimUrgent), then fills its free slots
	// from the session's own parts. An urgent item then waits for the first
	// session with a free slot, not for its part's owner, which bounds how
	// far out of order urgent items run (see docs/parts-and-order.md,
	// "How relaxed the order is"). Lane claims name no part: giving up a part does not
	// release them; a lane item of a part the session owns delays the
	// part's hand-over like the part's own items. The lane stays within
	// tenant limits: it takes items of limited tenants only from the
	// session's own parts (whose owner enforces a tenant's whole limit),
	// and other items from any part. Without parts every claim is already
	// in strict order and the lane is not used. Default off.
	UrgentLane bool
	// UrgentPriority is the lane's threshold: items with priority <= it
	// are urgent. Only read with UrgentLane.
	UrgentPriority int
	// Limits configure how the worker enforces the queue's fleet-wide
	// limits, which are stored in the database (see "Fleet-wide limits"
	// in limits.go). The worker reads them by itself; there is nothing to
	// turn on. The queue's shares are divided among the sessions that
	// work it (its members), whatever other queues the database holds.
	//
	// What is bounded: a share that moves (a session joining or leaving,
	// a part changing hands) can be exceeded only by items claimed under
	// the old share that still run Grace later; a limit that cannot be
	// re-read is enforced with its last values for at most
	// Limits.StaleAfter, after which the worker claims nothing the limit
	// governs until a read succeeds (LimitStats.Stale). What is not
	// bounded: the handlers of a process frozen (SIGSTOP) past its
	// session's expiry resume, when it continues, beside the items its
	// peers claimed meanwhile under its moved share; their contexts are
	// already cancelled and their acks cannot commit, but a handler runs
	// until it returns. (Their items do not wait for them: a claim ends
	// with its session's expiry or its lease, claim.Options.Lease,
	// whichever comes first.) See limits.go for the exact bounds.
	Limits LimitOptions
	// Testing holds hooks for tests and measurements; not for production.
	Testing TestingOptions
}

// TestingOptions are hooks into a worker's internals, for tests and
// measurements; not for production: they may change in any release. The
// zero value sets none.
type TestingOptions struct {
	// OnClaim, if not nil, is called by the claim loop right after every
	// claim that returned items, with those items, before their handlers
	// start. The next claim waits for it: keep it quick. The demo's
	// --measure-order counts each item's place in the queue's order with
	// it. Default: none.
	OnClaim func(ctx context.Context, items []claim.Item)
	// OnStatistics, if not nil, is called before each check of the queue's
	// tables' statistics (queuemaint.Queue.RefreshStatistics, which on
	// PostgreSQL may run an ANALYZE), on the goroutine that runs the
	// check, with the session's context: the check waits for it, so a
	// hook that blocks holds the check up as a slow ANALYZE would. Default:
	// none.
	OnStatistics func(ctx context.Context)

	// The hooks below let a test wait for a round of one of the worker's
	// loops instead of sleeping (package internal/await's Rounds), and show
	// that something does not happen by watching it through rounds that
	// could have done it. A hook left nil costs nothing. Each runs on the
	// loop's goroutine, which waits for it: keep them quick.

	// AfterIdleClaim, if not nil, is called by the claim loop after each
	// round that had a free handler slot and claimed nothing (the queue had
	// nothing this session may claim now, or the limits held everything
	// back), with the claim's error, before the loop waits.
	AfterIdleClaim func(err error)
	// AfterIdleLook, if not nil, is called by the claim loop after each
	// idle look (see Options.ListenPoll), with whether it found when the
	// next unclaimed item vests (or that none is unclaimed), and its error.
	AfterIdleLook func(exact bool, err error)
	// AfterAck, if not nil, is called after each ack transaction of the
	// worker, with its items and each one's error (nil: acked), once the
	// dependents of the acked items were released (or their release failed
	// and was left to the reaper: see queuemaint.Queue.Reap), before the
	// handlers are told.
	AfterAck func(items []claim.Item, errs []error)
	// AfterLimitRefresh, if not nil, is called after each refresh of the
	// session's view of the queue's limits and shares (every
	// Limits.Refresh, and when a session starts), whether its reads
	// succeeded or not (LimitStats says).
	AfterLimitRefresh func()
	// AfterSessionReap, if not nil, is called after each deletion of
	// expired sessions by the maintenance loop (when the session took the
	// fleet's turn, about every Session.ReapEvery in the fleet), with how
	// many it deleted and its error.
	AfterSessionReap func(n int64, err error)
	// AfterQueueReap, if not nil, is called after each reap of the queue
	// by the maintenance loop (queuemaint.Queue.Reap, when the session
	// took the queue's reap turn and the queue had something to reap:
	// expired leases, crash loops, expired items, prunes, and the
	// dependency sweep; see AfterPrunesDue), with what it did and its
	// error.
	AfterQueueReap func(st claim.ReapStats, err error)
	// AfterReapTurn, if not nil, is called after each try of the
	// maintenance loop to take a reap turn: name is the queue's name for
	// its reap, "" for the reap of expired sessions; took says whether
	// the session took it.
	AfterReapTurn func(name string, took bool, err error)
	// AfterPrunesDue, if not nil, is called after each test of the
	// maintenance loop, at a prune turn of the queue it took while the
	// item steps had nothing to do, of whether the reap's prunes (and
	// exhausted items, and cross-queue edges) have anything to do: due
	// false (and a nil error) means that the loop did not reap.
	AfterPrunesDue func(due bool, err error)
	// Session holds the hooks of the worker's sessions (each heartbeat);
	// the sessions' own reaper does not run in a worker (AfterSessionReap
	// is the worker's).
	Session session.TestingOptions
	// Partition holds the hooks of the worker's rebalancers, in parts mode
	// (each rebalance).
	Partition partition.TestingOptions
}

// withDefaults returns o with zero fields set to their defaults, or an error
// for values that cannot work.
func (o Options) withDefaults() (Options, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Poll", o.Poll}, {"ItemTimeout", o.ItemTimeout}, {"HangGrace", o.HangGrace}, {"ShutdownTimeout", o.ShutdownTimeout},
		{"RestartDelay", o.RestartDelay}, {"GatherWait", o.GatherWait}, {"StartTimeout", o.StartTimeout},
		{"ProbeEvery", o.ProbeEvery}, {"ProbePoll", o.ProbePoll}, {"ListenPoll", o.ListenPoll}} {
		if d.v > MaxDuration {
			return o, fmt.Errorf("worker: %s %v is too long (maximum %v)", d.name, d.v, MaxDuration)
		}
		if d.v < 0 && d.name != "GatherWait" && d.name != "ListenPoll" {
			return o, fmt.Errorf("worker: %s %v is negative", d.name, d.v)
		}
	}
	o.Concurrency = cmp.Or(o.Concurrency, DefaultConcurrency)
	o.Poll = cmp.Or(o.Poll, DefaultPoll)
	o.ItemTimeout = cmp.Or(o.ItemTimeout, DefaultItemTimeout)
	o.HangGrace = cmp.Or(o.HangGrace, DefaultHangGrace)
	o.MaxAbandoned = max(0, cmp.Or(o.MaxAbandoned, DefaultMaxAbandoned)) // negative: none
	o.ShutdownTimeout = cmp.Or(o.ShutdownTimeout, DefaultShutdownTimeout)
	o.RestartDelay = cmp.Or(o.RestartDelay, DefaultRestartDelay)
	o.StartTimeout = cmp.Or(o.StartTimeout, DefaultStartTimeout)
	o.MaxAckBatch = cmp.Or(o.MaxAckBatch, min(max(DefaultMaxAckBatch, o.Concurrency/4), MaxDefaultAckBatch))
	o.Ackers = cmp.Or(o.Ackers, DefaultAckers)
	o.GatherWait = max(0, cmp.Or(o.GatherWait, DefaultGatherWait)) // negative: claim as soon as a slot frees
	o.ProbeEvery = cmp.Or(o.ProbeEvery, DefaultProbeEvery)
	o.ProbePoll = max(o.Poll, cmp.Or(o.ProbePoll, DefaultProbePoll))
	if o.ListenPoll < 0 {
		o.ListenPoll = o.Poll // negative: Poll
	}
	o.ListenPoll = max(o.Poll, cmp.Or(o.ListenPoll, DefaultListenPoll))
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	switch {
	case o.Concurrency < 0:
		return o, fmt.Errorf("worker: concurrency %d is negative", o.Concurrency)
	case o.Parts < 0 || o.Parts > partition.MaxParts:
		return o, fmt.Errorf("worker: Parts %d is out of range (0: no parts, or 1 to %d)", o.Parts, partition.MaxParts)
	case o.MaxAckBatch < 0:
		return o, fmt.Errorf("worker: MaxAckBatch %d is negative", o.MaxAckBatch)
	case o.Ackers < 0 || o.Ackers > maxAckers:
		return o, fmt.Errorf("worker: Ackers %d must be between 1 and %d", o.Ackers, maxAckers)
	case o.Wake < WakeAuto || o.Wake > WakeProbe:
		return o, fmt.Errorf("worker: Wake %d is not a WakeMode", o.Wake)
	case o.Session.ReapEvery > session.MaxExpiry:
		return o, fmt.Errorf("worker: Session.ReapEvery %v is too long (maximum %v)", o.Session.ReapEvery, session.MaxExpiry)
	}
	var err error
	if o.Limits, err = o.Limits.withDefaults(); err != nil {
		return o, err
	}
	return o, nil
}

// maxAckers bounds Options.Ackers.
const maxAckers = 64

// PoolConns returns the number of connections a worker with opts uses from
// its pool at most, whatever its Concurrency: one for claims, one per settle
// goroutine (Ackers, default 2), one for the maintenance loop (lease
// extensions, limit reads, cancels, reaps), one for the check of the
// tables' statistics, which runs beside it (on PostgreSQL: a few short
// reads every few heartbeats, and an ANALYZE when they say the statistics
// are behind), and in parts mode one for the rebalancer. Handlers never
// hold one (their Records run in a settle goroutine's transaction). With
// the defaults: 5, or 6 in parts mode. Size the pool's MaxConns to it (more
// is harmless; fewer makes the worker's own statements wait for each
// other: an ANALYZE would then hold up a lease extension). Connections a
// handler opens itself are not counted.
func PoolConns(opts Options) int {
	o, err := opts.withDefaults()
	if err != nil {
		o.Ackers = max(opts.Ackers, DefaultAckers)
	}
	n := 1 + o.Ackers + 1 + 1
	if o.Parts > 0 {
		n++
	}
	return n
}

// Connections returns the number of connections to the database a worker
// process with opts opens at most: PoolConns, plus the session's heartbeat
// connection, which is its own (outside the pool) so that a busy pool never
// delays a heartbeat, plus (unless NoWake) the wake-up listener's
// connection or, on CockroachDB or with WakeProbe, the idle probe's (see
// WakeMode), which all the workers of a process on one database share.
// With the defaults: 7, or 8 in parts mode; 4 workers of 1000 handlers
// each in one process run within 4 × 7 + 1 = 29 connections (Connections
// counts the shared listener once per worker, an upper bound); as one
// Group of 4 queues, within 4 × 5 + 2 = 22 (GroupConnections: one
// heartbeat for all).
func Connections(opts Options) int {
	n := PoolConns(opts) + 1
	if !opts.NoWake {
		n++
	}
	return n
}
