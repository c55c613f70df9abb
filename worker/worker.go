// Package worker runs a worker process: one session at a time, the parts
// rebalancer (in parts mode), an adaptive claim loop and a bounded pool of
// handlers whose results are acknowledged exactly once.
//
// The handler contract makes exactly-once usable: a Handler does its slow
// work outside any transaction, honouring ctx, and returns a Record function
// that writes its result. The worker runs Record inside the ack's
// serializable transaction, after the claim-checked delete of the item, so
// the result commits if and only if the ack does. Record may run more than
// once (the transaction is retried whole on serialization failures); only
// one run's writes commit.
//
// Side effects outside the database cannot be made exactly-once this way:
// a handler may run again after a crash or a lost session. Give external
// systems the item's id as an idempotency key (and Item.Attempt if useful).
//
// # Every item ends
//
// A worker never forgets an item it holds. An ack, nack or release that
// fails for any reason but a lost claim is retried, with capped and
// jittered backoff, until it is settled, the claim is lost, or the session
// ends (the session's end releases the item). A finished handler's result
// is not thrown away by a database blip: the ack runs again (and Record
// with it); an ack whose outcome is unknown is retried as an ack, and if the
// retry finds the item gone its outcome stays unknown (Stats.Unknown), never
// acked, never lost. Handler and Record panics are recovered and nacked.
// A handler that ignores its context is abandoned ItemTimeout + HangGrace
// after it started: its item is nacked as timed out and its slot freed
// (MaxAbandoned bounds the goroutines left running). Every claim has a lease
// (the queue's claim.Options.Lease; if that is zero, min(ItemTimeout, 2 min)
// + HangGrace + 30 s),
// extended while its handler runs but never past that bound; any session's
// reaper releases expired leases, so an item held by a live session that
// does not work on it comes back within its lease — and at once after a
// claim whose answer was lost (ReleaseForgotten).
//
// # Fleet-wide limits
//
// A queue's stored limits (claim.Policy.MaxInFlight and Rate, and the
// tenants' limits) hold across all its workers without a shared counter:
// each session reads them every LimitOptions.Refresh and enforces its share,
// computed from the parts it owns (or its rank among the queue's live
// members: the sessions that work the queue), so that the shares add up to
// the limit. A share that shrinks applies at once; one that grows waits
// LimitOptions.Grace. The limit can be exceeded only by items that were
// claimed under a share that has since moved and that still run Grace
// later; see limits.go and docs/limits.md for the exact bound. Limits that
// cannot be re-read are enforced with their last values for at most
// LimitOptions.StaleAfter; then the worker claims nothing they govern until
// a read succeeds.
//
// # Connections
//
// A worker process uses Connections(opts) connections whatever its
// Concurrency (7 by default, 8 in parts mode): PoolConns from its pool (one
// for claims, one per settle goroutine, one for the maintenance loop, one
// for the statistics check, one for the rebalancer), one of the session's
// own for heartbeats, which a busy pool therefore never delays, and on
// PostgreSQL the wake-up listener's, which all the process's workers on one
// database share (see Options.NoWake). Handlers never hold a connection.
//
// # Many queues
//
// A Group works several queues with one session (one heartbeat, one
// listener): each queue has its own handler and Options (concurrency,
// parts, limits, wake-ups, maintenance), and the session's loss or end is
// every queue's. NewGroup takes queues of your pool, and its Run fails on a
// pool smaller than their PoolConns summed (ErrPoolTooSmall); OpenGroup
// opens a pool sized for them. Worker.Run is a group of one; workers and
// groups that share a pool too small for all of them are warned of.
//
// Configure the pool with ConfigurePool before making it: its connections
// then start with idle_in_transaction_session_timeout set to the session
// expiry, so that the server ends a transaction whose process froze while
// it was open (SIGSTOP, a paused VM, a network cut without a reset). Such
// a transaction otherwise keeps its row locks until the server drops the
// connection (hours, with TCP keepalive), and no peer can reap the frozen
// session meanwhile, since deleting it touches the rows it locked: its
// items and parts would not move. With it, the frozen session's items end
// within the expiry, the expiry again (the idle timeout) and a reap
// interval. Each reap of expired sessions is bounded
// (session.Options.ReapTimeout): a blocked one gives up, warns, deletes
// the other expired sessions one by one and is tried again; Run warns once
// when the pool's setting is missing.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/wake"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Record writes a handler's result inside the ack transaction. Exec makes
// the Record of one SQL statement, which costs no round trip of its own;
// write a function for reads or logic (its statements run at once, and see
// the writes of the Records before it).
type Record func(ctx context.Context, tx pgx.Tx) error

// Exec returns the Record that runs one SQL statement, sql with args, in the
// ack's transaction: the usual way to write a handler's result, for example
//
//	return worker.Exec(`INSERT INTO results (item_id, value) VALUES ($1, $2)`, it.ID, v), nil
//
// The worker queues the statement instead of running it, and sends the
// statements of all the items of an ack transaction whose claims held with
// its COMMIT, in one pipeline: a transaction of many acks costs two round
// trips, not one more per item, and on PostgreSQL one when all its Records
// are Exec's and there is no BatchRecord (claim.Exec). A statement that fails fails
// only its own item, as a failing Record function does: the items of the
// transaction are acked again one by one, and that one is nacked.
func Exec(sql string, args ...any) Record {
	return Record(claim.Exec(sql, args...))
}

// Handler processes one claimed item. It runs outside any transaction with a
// context that ends when the item times out, the session is lost, or a
// shutdown gives up waiting. It returns the function that records its result
// (nil: nothing to record), or an error, which nacks the item: it runs again
// after a backoff, or goes to the dead-items table when its attempts are used
// up or the error is claim.Permanent. A panic is recovered and treated as an
// error.
type Handler func(ctx context.Context, it claim.Item) (Record, error)

// Observer watches a worker's handlers and acks. Its methods are called from
// the worker's goroutines, concurrently: they must be safe for concurrent use
// and quick.
//
// An Observer that also implements KindObserver is told the kind of each
// handler run's item: the worker calls its KindHandlerDone instead of
// HandlerDone. Package metrics' Collector does (its handler histogram has a
// kind label).
type Observer interface {
	// HandlerDone reports one handler run on queue: how long the handler
	// took (not counting the ack, nack or release after it; for an
	// abandoned handler, until it was abandoned), and how the attempt
	// ended: claim.Acked, Retried, Dead, Released, Unsettled or Dropped
	// (outcome.String() names it).
	HandlerDone(queue string, d time.Duration, outcome claim.Outcome)
	// AckBatch reports one ack transaction of n items (with MaxAckBatch 1,
	// one per acked item, n = 1).
	AckBatch(queue string, n int)
}

// KindObserver is an Observer that is also told the kind of each handler
// run's item (claim.Item.Kind), for metrics by kind: when a worker's
// Options.Observer implements it, the worker calls KindHandlerDone, and not
// HandlerDone, after each handler run. An Observer without it is told of
// every run with HandlerDone, as before kinds.
type KindObserver interface {
	Observer
	// KindHandlerDone reports one handler run, as HandlerDone does, with
	// its item's kind and whether the worker's Kinds registered a handler
	// for that kind (see HandlerRun).
	KindHandlerDone(run HandlerRun)
}

// HandlerRun is one handler run as a KindObserver is told of it. A struct,
// so that later releases can say more of a run without another interface.
type HandlerRun struct {
	// Queue is the worker's queue.
	Queue string
	// Kind is the item's kind (claim.Item.Kind); "" for an item without
	// one.
	Kind string
	// Registered reports that a handler registered for Kind in the
	// worker's Kinds took the item (AddKind or Kinds.Handle; for "",
	// Kinds.Default): Kind is then one of the names the program
	// registered, a bounded set, while any other is whatever a producer
	// wrote — an unknown kind, or every kind with a Handler that is not a
	// Kinds' (or a Middleware that did not call it). Label metrics by Kind
	// only when Registered (or Kind is ""), so that producers' input
	// cannot make series without bound: MetricKind.
	Registered bool
	// Took is how long the handler ran, as HandlerDone's d: not counting
	// the ack, nack or release after it; for an abandoned handler, until
	// it was abandoned.
	Took time.Duration
	// Outcome is how the attempt ended, as HandlerDone's outcome.
	Outcome claim.Outcome
}

// OtherKind is the kind HandlerRun.MetricKind gives the runs of kinds the
// worker did not register. It is not "" (no kind), and no kind a program
// would register.
const OtherKind = "(other)"

// MetricKind returns the kind to label run's metrics with: its Kind if the
// worker registered it (Registered) or it is "" (none), OtherKind
// otherwise. Its values are bounded by the program's registrations,
// whatever kinds producers write.
func (run HandlerRun) MetricKind() string {
	if run.Kind == "" || run.Registered {
		return run.Kind
	}
	return OtherKind
}

// DB is the database worker works on: a *pgxpool.Pool (or a *pgx.Conn)
// satisfies it. It is sql.Pool, the one database type of crdbwork's
// packages: a value of claim.DB, partition.DB or worker.DB is any of them.
type DB = crsql.Pool

// Stats counts what a Worker did.
type Stats struct {
	claim.Stats
	// Sessions counts sessions started; SessionsLost those lost.
	Sessions, SessionsLost int64
	// Panics and Timeouts count handler runs that panicked (in the handler
	// or in its Record) or timed out.
	Panics, Timeouts int64
	// Abandoned counts handlers abandoned after ItemTimeout (or a
	// cancellation) plus HangGrace; AbandonedRunning those whose
	// goroutines have still not returned.
	Abandoned, AbandonedRunning int64
	// Unknown counts acks whose outcome stayed unknown (see
	// attempt.Result.Unknown): neither acked nor lost.
	Unknown int64
	// Dropped counts at-most-once items whose handler failed or whose
	// record could not be written: they are gone, not retried.
	Dropped int64
	// SettleRetries counts the retries of acks, nacks and releases that
	// failed for a reason other than a lost claim.
	SettleRetries int64
	// Wakeups counts the idle waits that a wake-up ended before the poll
	// interval (see Options.NoWake).
	Wakeups int64
	// LeasesExtended counts lease extensions of items whose handlers ran
	// past half their lease; Forgotten counts items released after claims
	// whose answers were lost; Reaped counts items whose expired leases
	// this worker's reaper released, or whose used-up attempts it moved to
	// the dead items (any session's items).
	LeasesExtended, Forgotten, Reaped int64
	// InFlight is the number of handlers running now.
	InFlight int64
	// CancelRequests counts handlers whose contexts were cancelled because
	// their items were cancelled from outside (claim.Queue.CancelItem);
	// the items they ended as cancelled count in Cancelled and
	// CancelledRunning.
	CancelRequests int64
	// Parts is the rebalancers' part movements, summed over sessions (the current one included).
	Parts partition.Stats
	// Session is the id of the current session ("" between sessions).
	Session string
	// Limits is the current session's view of the queue's fleet-wide
	// limits (zero between sessions), with Refused summed over sessions.
	Limits LimitStats
}

// Worker runs a worker process. Create it with New and call Run once.
type Worker struct {
	db      DB
	handler Handler
	opts    Options
	queue   *claim.Queue
	maint   queuemaint.Queue // the queue's maintenance (maintenance_*.go)
	name    string           // the queue's
	tables  crsql.Tables     // the queue's
	// store reads the stored limits (see storedLimits) and the fair
	// pacing's front (store.Store.ItemsFairFront, whose twin dialect picks:
	// detected at its first read, see engine).
	store *store.Store
	// lackingLast is what the database user lacked of the worker's grants
	// at the last refusal explained (explainRefusal).
	lackingLast atomic.Pointer[lackingRead]
	dialect     atomic.Pointer[store.Dialect]
	log         *zap.Logger

	sessions, lost, panics, timeouts, inflight atomic.Int64
	abandoned, abandonedRunning, unknown       atomic.Int64
	dropped                                    atomic.Int64
	settleRetries, running                     atomic.Int64
	extended, forgotten, reaped                atomic.Int64
	lease                                      time.Duration // of every claim
	partsAcquired, partsReleased               atomic.Int64
	partsRebalances, partsRetries, partsReads  atomic.Int64
	current                                    atomic.Value                         // string
	reb                                        atomic.Pointer[partition.Rebalancer] // the current session's, for Stats
	lim                                        atomic.Pointer[limiter]              // the current session's, for Stats
	limitSource                                limitSource
	refusedTotal                               atomic.Int64 // Refused of past sessions

	// wakeups counts the idle waits a wake-up ended (Stats.Wakeups);
	// wake receives the queue's wake-ups (nil with NoWake): Run subscribes;
	// wakeSub is its subscription, which also holds their part hints.
	wakeups atomic.Int64
	wake    <-chan struct{}
	wakeSub *wake.Sub
	// channel is the queue's wake-up channel; probing reports whether the
	// process's idle probe probes it (Options.Wake; see idleWait).
	channel string
	probing bool
	// listenLong: while the listener listens on channel, idle claims wait
	// ListenPoll (see Options.ListenPoll): wake-ups on, LISTEN in use, the
	// queue's producers notify (its NoNotify is off) and ListenPoll is
	// longer than Poll.
	listenLong bool
	// cancelWake receives the queue's cancel notifications (nil with
	// NoWake); cancelsSeen counts the handlers cancelled for a cancel
	// request (Stats.CancelRequests).
	cancelWake  <-chan struct{}
	cancelsSeen atomic.Int64
	// inGroup: a Group runs the worker (NewGroup made it); its own Run
	// fails.
	inGroup bool
	// kindObs is Options.Observer if it is a KindObserver (else nil).
	kindObs KindObserver
}

// New returns a worker that handles the items of q with h. The worker
// works on q's database, with q's name, tables, retry policy and lease
// (claim.Options.Lease; when q's was left zero, the worker's default:
// min(ItemTimeout, 2 min) + HangGrace + 30 s), and counts its claims and
// acks in q's Stats.
func New(q *claim.Queue, h Handler, opts Options) (*Worker, error) {
	if q == nil || h == nil {
		return nil, errors.New("worker: nil queue or handler")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.Middleware != nil {
		if h = opts.Middleware(h); h == nil {
			return nil, errors.New("worker: Middleware returned a nil handler")
		}
	}
	qo := q.Options()
	w := &Worker{db: q.DB(), handler: h, opts: opts, queue: q, maint: queuemaint.For(q), name: q.Name(), tables: qo.Tables,
		store: store.New(qo.Tables),
		log:   opts.Logger.With(zap.String("queue", q.Name())), lease: cmp.Or(qo.Lease, defaultLease(opts))}
	w.limitSource = w.storedLimits
	w.kindObs, _ = opts.Observer.(KindObserver)
	w.current.Store("")
	return w, nil
}

// Queue returns the claim.Queue the worker works on (the one given to New).
func (w *Worker) Queue() *claim.Queue { return w.queue }

// Stats returns a snapshot of the worker's counters.
func (w *Worker) Stats() Stats {
	parts := partition.Stats{Acquired: w.partsAcquired.Load(), Released: w.partsReleased.Load(),
		Rebalances: w.partsRebalances.Load(), Retries: w.partsRetries.Load(), Reads: w.partsReads.Load()}
	if reb := w.reb.Load(); reb != nil {
		st := reb.Stats()
		parts.Acquired, parts.Released = parts.Acquired+st.Acquired, parts.Released+st.Released
		parts.Rebalances, parts.Retries = parts.Rebalances+st.Rebalances, parts.Retries+st.Retries
		parts.Reads += st.Reads
	}
	var ls LimitStats
	if lim := w.lim.Load(); lim != nil {
		ls = lim.stats(time.Now())
	}
	ls.Refused += w.refusedTotal.Load()
	return Stats{
		Limits:   ls,
		Stats:    w.queue.Stats(),
		Sessions: w.sessions.Load(), SessionsLost: w.lost.Load(),
		Panics: w.panics.Load(), Timeouts: w.timeouts.Load(), InFlight: w.inflight.Load(),
		Abandoned: w.abandoned.Load(), AbandonedRunning: w.abandonedRunning.Load(),
		Unknown: w.unknown.Load(), Dropped: w.dropped.Load(), SettleRetries: w.settleRetries.Load(),
		LeasesExtended: w.extended.Load(), Forgotten: w.forgotten.Load(), Reaped: w.reaped.Load(),
		Wakeups: w.wakeups.Load(), CancelRequests: w.cancelsSeen.Load(),
		Parts:   parts,
		Session: w.current.Load().(string),
	}
}

// Run works until ctx is cancelled, then shuts down gracefully: it stops
// claiming, lets in-flight handlers finish within ShutdownTimeout (then
// cancels them and releases their items, waiting at most ShutdownTimeout
// more), and closes the session within ShutdownTimeout, which releases its
// parts at once. Every step is bounded, whatever the database does: a
// cancelled ctx makes Run return within a few ShutdownTimeouts even while
// the database is unreachable. When a session is lost, in-flight handlers
// see their context cancelled and Run starts a new session after
// RestartDelay. Run returns nil after a graceful stop, or an error when it
// cannot start its first session: at once for a schema that is not this
// code's, a database user that lacks a privilege the worker needs on a
// crdbwork table (ErrPrivileges; see CheckGrants) or bad options, after
// StartTimeout for a database it cannot reach.
// It runs the group of one queue (see Group.Run): a pool smaller than
// PoolConns is logged as a warning.
func (w *Worker) Run(ctx context.Context) error {
	if w.inGroup {
		return fmt.Errorf("worker: the worker of queue %q belongs to a Group: run the group", w.name)
	}
	return w.asGroup().Run(ctx)
}

// startWake subscribes the worker to its queue's wake-ups and cancel
// notifications, and starts the process's listener or idle probe on them
// (see Options.NoWake and Wake); stop undoes it. Nothing with NoWake.
func (w *Worker) startWake() (stop func()) {
	if w.opts.NoWake {
		return func() {}
	}
	var stops []func()
	channel := w.store.NotifyChannel(w.name)
	sub := wake.Subscribe(channel)
	stops = append(stops, sub.Close)
	if w.opts.Wake != WakeProbe {
		stopListening, _ := wake.Listen(w.db, channel, w.opts.Logger)
		stops = append(stops, stopListening)
	}
	if w.opts.Wake != WakeListen {
		// The idle probe (wakemode.go): with WakeAuto, once the
		// listener found CockroachDB.
		stopProbe, ok := wake.Probe(w.db, channel, wake.ProbeSpec{Store: w.store, Queue: w.name,
			Every: w.opts.ProbeEvery, Again: w.opts.Poll, CockroachOnly: w.opts.Wake == WakeAuto}, w.opts.Logger)
		stops = append(stops, stopProbe)
		w.channel, w.probing = channel, ok
	}
	w.wake, w.wakeSub = sub.C(), sub
	w.channel = channel
	w.listenLong = w.opts.Wake != WakeProbe && !w.queue.Options().NoNotify && w.opts.ListenPoll > w.opts.Poll
	// Cancel requests of running items, on their own channel so that
	// they do not wake idle claimers. (Without the listener, the
	// session's heartbeat finds them.)
	cancels := w.maint.CancelChannel()
	csub := wake.Subscribe(cancels)
	stops = append(stops, csub.Close)
	if w.opts.Wake != WakeProbe {
		stopCancels, _ := wake.Listen(w.db, cancels, w.opts.Logger)
		stops = append(stops, stopCancels)
	}
	w.cancelWake = csub.C()
	return func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
}

// ensureParts stores the part count of Options.Parts for a queue that has
// none, and warns when the stored count differs (the stored one wins).
func (w *Worker) ensureParts(ctx context.Context) error {
	if w.opts.Parts == 0 {
		return nil
	}
	stored, err := partition.EnsureParts(ctx, w.db, w.tables, w.name, w.opts.Parts)
	if err != nil {
		return err
	}
	if stored != w.opts.Parts {
		w.log.Warn("the queue has a different stored number of parts, which wins; change it with partition.SetParts",
			zap.Int("parts_option", w.opts.Parts), zap.Int("parts_stored", stored))
	}
	return nil
}

// waitBounded waits for done at most d and reports whether it was closed.
func waitBounded(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
