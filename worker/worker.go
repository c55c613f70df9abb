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
// (claim.Options.Lease, default min(ItemTimeout, 2 min) + HangGrace + 30 s),
// extended while its handler runs but never past that bound; any session's
// reaper releases expired leases, so an item held by a live session that
// does not work on it comes back within its lease — and at once after a
// claim whose answer was lost (ReleaseForgotten).
//
// # Fleet-wide limits
//
// A queue's stored limits (claim.Settings.MaxInFlight and Rate, and the
// tenants' limits) hold across all its workers without a shared counter:
// each session reads them every LimitOptions.Refresh and enforces its share,
// computed from the parts it owns (or its rank among the queue's live
// members: the sessions that work the queue), so that the shares add up to
// the limit. A share that shrinks applies at once; one that grows waits
// LimitOptions.Grace. The limit can be exceeded only by items that were
// claimed under a share that has since moved and that still run Grace
// later; see limits.go and the README for the exact bound. Limits that
// cannot be re-read are enforced with their last values for at most
// LimitOptions.StaleAfter; then the worker claims nothing they govern until
// a read succeeds.
//
// # Connections
//
// A worker process uses Connections(opts) connections whatever its
// Concurrency (5 by default, 6 in parts mode): PoolConns from its pool (one
// for claims, one per settle goroutine, one for the maintenance loop, one
// for the rebalancer) and one of the session's own for heartbeats, which a
// busy pool therefore never delays. Handlers never hold a connection.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// Record writes a handler's result inside the ack transaction.
type Record func(ctx context.Context, tx pgx.Tx) error

// Handler processes one claimed item. It runs outside any transaction with a
// context that ends when the item times out, the session is lost, or a
// shutdown gives up waiting. It returns the function that records its result
// (nil: nothing to record), or an error, which nacks the item: it runs again
// after a backoff, or goes to the dead-items table when its attempts are used
// up or the error is claim.Permanent. A panic is recovered and treated as an
// error.
type Handler func(ctx context.Context, it claim.Item) (Record, error)

// Defaults for Options.
const (
	DefaultConcurrency     = 8
	DefaultPoll            = 150 * time.Millisecond
	DefaultItemTimeout     = 5 * time.Minute
	DefaultShutdownTimeout = 10 * time.Second
	DefaultRestartDelay    = time.Second
	DefaultStartTimeout    = 30 * time.Second
	DefaultMaxAckBatch     = 64
	DefaultAckers          = 2
	DefaultGatherWait      = 5 * time.Millisecond
	DefaultHangGrace       = 2 * time.Second
	DefaultMaxAbandoned    = 8
)

// MaxDuration bounds every duration of Options: far above any useful value,
// it keeps the worker's arithmetic on durations from overflowing.
const MaxDuration = 365 * 24 * time.Hour

// Options configure a Worker. The zero value is valid: 8 handlers, no
// parts, queue "default", silent.
type Options struct {
	// Queue is the queue to work on. Default "default".
	Queue string
	// Tables names the crdbwork tables; it overrides the Tables of the
	// nested options.
	Tables crsql.Tables
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
	// the worker claims again at once. Default 150 ms.
	Poll time.Duration
	// ItemTimeout bounds one handler run. Default 5 min.
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
	// next (group commit; see claim.Queue.AckEach), which costs no waiting
	// and far fewer transactions. 1 acks every item in its own transaction.
	// Default 64.
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
	// Session, Claim and Partition configure the parts the worker wires.
	// Claim.Lease defaults to min(ItemTimeout, 2 min) + HangGrace + 30 s,
	// extended while a handler runs (see "Every item ends" above).
	// Session.ReapEvery is the interval of the worker's reaper of expired
	// sessions (the session itself does not reap: see Connections).
	Session   session.Options
	Claim     claim.Options
	Partition partition.Options
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
	// Observer, if not nil, is told of every handler run and every ack
	// transaction, for metrics (package metrics implements it). Default: none.
	Observer Observer
	// UrgentLane turns the urgent lane on (parts mode only): each claim
	// first takes, from any part, items with priority at most
	// UrgentPriority (claim.Queue.ClaimUrgent), then fills its free slots
	// from the session's own parts. An urgent item then waits for the first
	// session with a free slot, not for its part's owner, which bounds how
	// far out of order urgent items run (see the README's "How relaxed is
	// the order"). Lane claims name no part: giving up a part does not
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
	// OnClaim, if not nil, is called by the claim loop right after every
	// claim that returned items, with those items, before their handlers
	// start. The next claim waits for it: keep it quick. For measurements
	// (the demo's --measure-order counts each item's place in the queue's
	// order with it). Default: none.
	OnClaim func(ctx context.Context, items []claim.Item)
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
}

// Observer watches a worker's handlers and acks. Its methods are called from
// the worker's goroutines, concurrently: they must be safe for concurrent use
// and quick.
type Observer interface {
	// HandlerDone reports one handler run on queue: how long the handler
	// took (not counting the ack, nack or release after it; for an
	// abandoned handler, until it was abandoned), and how the attempt
	// ended: OutcomeAcked, OutcomeRetried, OutcomeDead, OutcomeReleased or
	// OutcomeUnsettled.
	HandlerDone(queue string, d time.Duration, outcome string)
	// AckBatch reports one ack transaction of n items (with MaxAckBatch 1,
	// one per acked item, n = 1).
	AckBatch(queue string, n int)
}

// Outcomes of a handler run, as Observer.HandlerDone reports them.
const (
	// OutcomeAcked: the ack, with the handler's record, committed.
	OutcomeAcked = "acked"
	// OutcomeRetried: the item was nacked and runs again after a backoff.
	OutcomeRetried = "retried"
	// OutcomeDead: the item was nacked into the dead-items table.
	OutcomeDead = "dead"
	// OutcomeReleased: the item was given back without counting the attempt.
	OutcomeReleased = "released"
	// OutcomeUnsettled: the ack, nack or release did not happen (claim lost,
	// the session ended while it was retried, or an ack whose outcome stayed
	// unknown).
	OutcomeUnsettled = "unsettled"
	// OutcomeDropped: an at-most-once item whose handler failed or whose
	// record could not be written; it is gone (claim.Item.AtMostOnce).
	OutcomeDropped = "dropped"
)

// outcomeNames names attempt's outcomes for Observer.
var outcomeNames = map[attempt.Outcome]string{
	attempt.Acked: OutcomeAcked, attempt.Retried: OutcomeRetried, attempt.Dead: OutcomeDead,
	attempt.Released: OutcomeReleased, attempt.Unsettled: OutcomeUnsettled, attempt.Dropped: OutcomeDropped,
}

// withDefaults returns o with zero fields set to their defaults, or an error
// for values that cannot work.
func (o Options) withDefaults() (Options, error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Poll", o.Poll}, {"ItemTimeout", o.ItemTimeout}, {"HangGrace", o.HangGrace}, {"ShutdownTimeout", o.ShutdownTimeout},
		{"RestartDelay", o.RestartDelay}, {"GatherWait", o.GatherWait}, {"StartTimeout", o.StartTimeout}} {
		if d.v > MaxDuration {
			return o, fmt.Errorf("worker: %s %v is too long (maximum %v)", d.name, d.v, MaxDuration)
		}
		if d.v < 0 && d.name != "GatherWait" {
			return o, fmt.Errorf("worker: %s %v is negative", d.name, d.v)
		}
	}
	if o.Queue == "" {
		o.Queue = claim.DefaultQueue
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Poll == 0 {
		o.Poll = DefaultPoll
	}
	if o.ItemTimeout == 0 {
		o.ItemTimeout = DefaultItemTimeout
	}
	if o.HangGrace == 0 {
		o.HangGrace = DefaultHangGrace
	}
	if o.MaxAbandoned == 0 {
		o.MaxAbandoned = DefaultMaxAbandoned
	} else if o.MaxAbandoned < 0 {
		o.MaxAbandoned = 0
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.RestartDelay == 0 {
		o.RestartDelay = DefaultRestartDelay
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.MaxAckBatch == 0 {
		o.MaxAckBatch = DefaultMaxAckBatch
	}
	if o.Ackers == 0 {
		o.Ackers = DefaultAckers
	}
	if o.GatherWait == 0 {
		o.GatherWait = DefaultGatherWait
	} else if o.GatherWait < 0 {
		o.GatherWait = 0
	}
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
	case o.Session.ReapEvery > session.MaxExpiry:
		return o, fmt.Errorf("worker: Session.ReapEvery %v is too long (maximum %v)", o.Session.ReapEvery, session.MaxExpiry)
	}
	var err error
	if o.Limits, err = o.Limits.withDefaults(); err != nil {
		return o, err
	}
	if o.Claim.Lease == 0 {
		o.Claim.Lease = defaultLease(o)
	}
	o.Claim.Queue, o.Partition.Queue = o.Queue, o.Queue
	o.Session.Tables, o.Claim.Tables, o.Partition.Tables = o.Tables, o.Tables, o.Tables
	if o.Session.Logger == nil {
		o.Session.Logger = o.Logger
	}
	if o.Partition.Logger == nil {
		o.Partition.Logger = o.Logger
	}
	return o, nil
}

// maxAckers bounds Options.Ackers.
const maxAckers = 64

// PoolConns returns the number of connections a worker with opts uses from
// its pool at most, whatever its Concurrency: one for claims, one per settle
// goroutine (Ackers, default 2), one for the maintenance loop (reaping
// expired sessions), and in parts mode one for the rebalancer. Handlers
// never hold one (their Records run in a settle goroutine's transaction).
// With the defaults: 4, or 5 in parts mode. Size the pool's MaxConns to it
// (more is harmless; fewer makes the worker's own statements wait for each
// other). Connections a handler opens itself are not counted.
func PoolConns(opts Options) int {
	o, err := opts.withDefaults()
	if err != nil {
		o.Ackers = max(opts.Ackers, DefaultAckers)
	}
	n := 1 + o.Ackers + 1
	if o.Parts > 0 {
		n++
	}
	return n
}

// Connections returns the number of connections to the database a worker
// process with opts opens at most: PoolConns, plus the session's heartbeat
// connection, which is its own (outside the pool) so that a busy pool never
// delays a heartbeat. With the defaults: 5, or 6 in parts mode; 4 workers
// of 1000 handlers each run within 24 connections.
func Connections(opts Options) int { return PoolConns(opts) + 1 }

// DB is a connection pool: *pgxpool.Pool satisfies it.
type DB interface {
	crsql.DB
	retry.Beginner
}

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
	// LeasesExtended counts lease extensions of items whose handlers ran
	// past half their lease; Forgotten counts items released after claims
	// whose answers were lost; Reaped counts items whose expired leases
	// this worker's reaper released, or whose used-up attempts it moved to
	// the dead items (any session's items).
	LeasesExtended, Forgotten, Reaped int64
	// InFlight is the number of handlers running now.
	InFlight int64
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
	// limitSQL reads the stored limits (see storedLimits).
	limitSQL *crsql.LimitStatements
	log      *zap.Logger

	sessions, lost, panics, timeouts, inflight atomic.Int64
	abandoned, abandonedRunning, unknown       atomic.Int64
	dropped                                    atomic.Int64
	settleRetries, running                     atomic.Int64
	extended, forgotten, reaped                atomic.Int64
	lease                                      time.Duration // of every claim
	partsAcquired, partsReleased               atomic.Int64
	partsRebalances, partsRetries              atomic.Int64
	current                                    atomic.Value                         // string
	reb                                        atomic.Pointer[partition.Rebalancer] // the current session's, for Stats
	lim                                        atomic.Pointer[limiter]              // the current session's, for Stats
	limitSource                                limitSource
	refusedTotal                               atomic.Int64 // Refused of past sessions
}

// New returns a worker that handles the items of opts.Queue with h.
func New(db DB, h Handler, opts Options) (*Worker, error) {
	if db == nil || h == nil {
		return nil, errors.New("worker: nil database or handler")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	q, err := claim.New(db, opts.Claim)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{db: db, handler: h, opts: opts, queue: q, limitSQL: crsql.NewLimitStatements(opts.Tables),
		log: opts.Logger.With(zap.String("queue", opts.Queue)), lease: opts.Claim.Lease}
	w.limitSource = w.storedLimits
	w.current.Store("")
	return w, nil
}

// Queue returns the claim.Queue the worker uses, for enqueueing and stats.
func (w *Worker) Queue() *claim.Queue { return w.queue }

// Stats returns a snapshot of the worker's counters.
func (w *Worker) Stats() Stats {
	parts := partition.Stats{Acquired: w.partsAcquired.Load(), Released: w.partsReleased.Load(),
		Rebalances: w.partsRebalances.Load(), Retries: w.partsRetries.Load()}
	if reb := w.reb.Load(); reb != nil {
		st := reb.Stats()
		parts.Acquired, parts.Released = parts.Acquired+st.Acquired, parts.Released+st.Released
		parts.Rebalances, parts.Retries = parts.Rebalances+st.Rebalances, parts.Retries+st.Retries
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
// code's or bad options, after StartTimeout for a database it cannot reach.
func (w *Worker) Run(ctx context.Context) error {
	began := time.Now()
	// retryStart reports whether a failed start may be tried again: not for
	// a schema that is not this code's or bad options, and before the
	// first session only for a transient failure within StartTimeout.
	retryStart := func(err error, first bool) bool {
		switch {
		case errors.Is(err, crsql.ErrSchemaMissing), errors.Is(err, crsql.ErrSchemaOutdated), errors.Is(err, crsql.ErrSchemaNewer):
			return false
		case !first:
			return true
		}
		return attempt.Transient(err) && time.Since(began) < w.opts.StartTimeout
	}
	pause := func() {
		t := time.NewTimer(w.opts.RestartDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	for {
		err := w.ensureParts(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		if !retryStart(err, true) {
			return fmt.Errorf("worker: %w", err)
		}
		w.log.Warn("reaching the database failed; retrying", zap.Error(err))
		pause()
	}
	first := true
	for ctx.Err() == nil {
		sess, done, err := w.startSession(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !retryStart(err, first) {
				return fmt.Errorf("worker: %w", err)
			}
			w.log.Warn("starting a session failed; retrying", zap.Error(err))
		default:
			first = false
			w.sessions.Add(1)
			w.current.Store(sess.ID().String())
			w.runSession(ctx, sess)
			done()
			w.current.Store("")
			if ctx.Err() != nil {
				return nil
			}
			w.lost.Add(1)
		}
		pause()
	}
	return nil
}

// ensureParts stores the part count of Options.Parts for a queue that has
// none, and warns when the stored count differs (the stored one wins).
func (w *Worker) ensureParts(ctx context.Context) error {
	if w.opts.Parts == 0 {
		return nil
	}
	stored, err := partition.EnsureParts(ctx, w.db, w.opts.Tables, w.opts.Queue, w.opts.Parts)
	if err != nil {
		return err
	}
	if stored != w.opts.Parts {
		w.log.Warn("the queue has a different stored number of parts, which wins; change it with partition.SetParts",
			zap.Int("parts_option", w.opts.Parts), zap.Int("parts_stored", stored))
	}
	return nil
}

// startSession starts a session. ctx bounds the start (a cancelled ctx
// stops a start stuck on an unreachable database) but not the session's
// life: a shutdown closes the session gracefully rather than losing it.
// Call done once the session is closed.
func (w *Worker) startSession(ctx context.Context) (sess *session.Session, done func(), err error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	sopts := w.opts.Session
	sopts.ReapEvery = -1 // the maintenance loop reaps, on its own connection
	if sopts.Report == nil {
		// The session's counters ride on its heartbeats (for operators:
		// demo status); counted from the session's start.
		base := w.queue.Stats()
		sopts.Report = func() session.Counters {
			st := w.queue.Stats()
			return session.Counters{
				Claimed: st.Claimed - base.Claimed, Acked: st.Acked - base.Acked,
				Failed:   st.Nacked + st.Dead - base.Nacked - base.Dead,
				InFlight: w.inflight.Load(),
			}
		}
	}
	sess, err = session.Start(sctx, w.db, sopts)
	if err == nil {
		// The session works the queue: it counts among the queue's members
		// (its parts and, without parts, its limit shares are divided
		// among them) before its first claim.
		if jerr := sess.Join(sctx, w.opts.Queue); jerr != nil {
			closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
			sess.Close(closeCtx)
			cancelClose()
			sess, err = nil, fmt.Errorf("worker: %w", jerr)
		}
	}
	if !stop() {
		// ctx ended during the start: the session, if any, is already lost.
		if err == nil {
			closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
			sess.Close(closeCtx)
			cancelClose()
		}
		cancel()
		return nil, nil, fmt.Errorf("worker: starting a session: %w", ctx.Err())
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return sess, cancel, nil
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

// runSession runs one session until it is lost or ctx is cancelled; on
// return the session is closed.
func (w *Worker) runSession(ctx context.Context, sess *session.Session) {
	log := w.log.With(zap.Stringer("session", sess.ID()))
	log.Info("session started")
	// handlerCtx ends with the session, or when a shutdown stops waiting.
	handlerCtx, cancelHandlers := context.WithCancel(sess.Context())
	defer cancelHandlers()
	// settleCtx bounds the retries of acks, nacks and releases: they end
	// with the session (its end releases the items), or when a shutdown
	// stops waiting for them.
	settleCtx, cancelSettles := context.WithCancel(sess.Context())
	defer cancelSettles()
	var reb *partition.Rebalancer
	rebDone := make(chan struct{})
	if w.opts.Parts > 0 {
		var err error
		reb, err = partition.New(w.db, sess, w.opts.Partition)
		if err != nil {
			log.Error("starting the rebalancer failed", zap.Error(err))
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
			sess.Close(closeCtx)
			cancel()
			return
		}
		w.reb.Store(reb)
		go func() {
			defer close(rebDone)
			if err := reb.Run(sess.Context()); err != nil {
				log.Warn("rebalancer stopped", zap.Error(err))
			}
		}()
	} else {
		close(rebDone)
	}
	maintDone := make(chan struct{})
	fl := newFlights(w.lease)
	lim := newLimiter(w.opts.Limits)
	w.lim.Store(lim)
	defer func() {
		w.lim.Store(nil) // a snapshot between these lines may miss this session's refusals, never count them twice
		w.refusedTotal.Add(lim.stats(time.Now()).Refused)
	}()
	w.refreshLimits(sess.Context(), sess, lim, log)
	go func() {
		defer close(maintDone)
		w.maintain(sess, fl, lim, log)
	}()

	var observe func(int)
	if obs := w.opts.Observer; obs != nil {
		observe = func(n int) { obs.AckBatch(w.opts.Queue, n) }
	}
	a := startAcker(w.queue, w.opts.Ackers, max(1, w.opts.MaxAckBatch), observe, w.opts.BatchRecord)
	defer a.stop()
	slots := make(chan struct{}, w.opts.Concurrency)
	var handlers sync.WaitGroup
	claimCtx, stopClaiming := context.WithCancel(sess.Context())
	stopOnShutdown := context.AfterFunc(ctx, stopClaiming)
	defer stopOnShutdown()
	w.claimLoop(claimCtx, sess, reb, fl, lim, slots, &handlers, handlerCtx, settleCtx, a, log)
	stopClaiming()

	// Wait for in-flight handlers: at once if the session is lost (their
	// contexts are already cancelled), within ShutdownTimeout otherwise;
	// then cancel them and wait at most ShutdownTimeout more (hung handlers
	// are abandoned within HangGrace, their items released); then stop
	// retrying settles and go on (the session's end releases the items).
	waited := make(chan struct{})
	go func() { handlers.Wait(); close(waited) }()
	if !waitBounded(waited, w.opts.ShutdownTimeout) {
		log.Warn("shutdown timeout: cancelling in-flight handlers", zap.Int64("in_flight", w.inflight.Load()))
		cancelHandlers()
		if !waitBounded(waited, w.opts.ShutdownTimeout) {
			log.Warn("shutdown timeout: giving up on the settles still running; closing the session releases their items",
				zap.Int64("in_flight", w.inflight.Load()))
			cancelSettles()
		}
	}
	if err := sess.Err(); err != nil && !errors.Is(err, session.ErrClosed) {
		log.Warn("session lost", zap.Error(err))
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
	defer cancel()
	if err := sess.Close(closeCtx); err != nil {
		log.Warn("closing the session failed; peers will reap it", zap.Error(err))
	}
	if !waitBounded(rebDone, w.opts.ShutdownTimeout) {
		log.Warn("the rebalancer did not stop within the shutdown timeout")
	} else if reb != nil {
		w.reb.Store(nil) // a snapshot between these lines may miss this session's moves, never count them twice
		st := reb.Stats()
		w.partsAcquired.Add(st.Acquired)
		w.partsReleased.Add(st.Released)
		w.partsRebalances.Add(st.Rebalances)
		w.partsRetries.Add(st.Retries)
	}
	if !waitBounded(maintDone, w.opts.ShutdownTimeout) {
		log.Warn("the maintenance loop did not stop within the shutdown timeout")
	}
	log.Info("session ended")
}

// queueReapHeartbeats is how many heartbeats apart, on average, a session
// runs the queue's lease reaper (claim.Queue.Reap); each interval is drawn
// at random between half and one and a half of it, so that sessions spread
// their reaps.
const queueReapHeartbeats = 5

// maintain runs the session's periodic chores on one connection, one at a
// time, until the session ends: every heartbeat, extending the leases of
// long-running handlers' items; every Session.ReapEvery (default two
// heartbeats), deleting expired sessions; every few heartbeats, releasing
// the queue's expired leases and moving crash-looping items to the dead
// items (claim.Queue.Reap). A reap that fails is tried again at the next
// heartbeat. Any live session may reap; both are idempotent.
func (w *Worker) maintain(sess *session.Session, fl *flights, lim *limiter, log *zap.Logger) {
	ctx := sess.Context()
	hb := sess.Options().Heartbeat
	reapEvery := w.opts.Session.ReapEvery
	if reapEvery <= 0 {
		reapEvery = 2 * hb
	}
	jitter := func(d time.Duration) time.Duration { return d/2 + rand.N(d+1) }
	now := time.Now()
	nextReap, nextQueueReap := now.Add(jitter(reapEvery)), now.Add(jitter(queueReapHeartbeats*hb))
	nextLimits := now.Add(w.opts.Limits.Refresh)
	t := time.NewTicker(min(hb, w.opts.Limits.Refresh))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := time.Now(); !now.Before(nextLimits) {
			nextLimits = now.Add(w.opts.Limits.Refresh)
			w.refreshLimits(ctx, sess, lim, log)
		}
		w.extendLeases(ctx, fl, log)
		if now := time.Now(); !now.Before(nextReap) {
			nextReap = now.Add(jitter(reapEvery))
			n, err := session.Reap(ctx, w.db, w.opts.Tables)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				log.Warn("reaping expired sessions failed", zap.Error(err))
				nextReap = time.Now().Add(hb) // the database may be back by the next heartbeat
			case n > 0:
				log.Info("reaped expired sessions", zap.Int64("count", n))
			}
		}
		if now := time.Now(); !now.Before(nextQueueReap) {
			nextQueueReap = now.Add(jitter(queueReapHeartbeats * hb))
			st, err := w.queue.Reap(ctx)
			if ctx.Err() != nil {
				return
			}
			// Every step of Reap runs whatever the others did, so what it
			// did counts even when it reports failures.
			if st.Released > 0 || st.Dead > 0 || st.Expired > 0 {
				w.reaped.Add(int64(st.Released + st.Dead))
				log.Info("reaped expired leases", zap.Int("released", st.Released), zap.Int("dead", st.Dead), zap.Int("expired", st.Expired))
			}
			if st.Pruned > 0 {
				log.Debug("forgot ended ids past the dedup window", zap.Int("pruned", st.Pruned))
			}
			if w.logReapErrors(err, log) {
				// Leases may have expired during the failure: try again at
				// the next heartbeat rather than a full interval later.
				nextQueueReap = time.Now().Add(hb)
			}
		}
	}
}

// logReapErrors logs the failures of a Reap, one line per failed step and
// per item that could not be released or moved (with its id), and reports
// whether a step failed: then the reaper runs again sooner. Such an item
// does not make it run sooner: it stays as it is until the database lets it
// go, and every other item was reaped without it.
func (w *Worker) logReapErrors(err error, log *zap.Logger) (stepFailed bool) {
	if err == nil {
		return false
	}
	list := claim.ReapErrors(err)
	if len(list) == 0 {
		log.Warn("reaping expired leases failed", zap.Error(err))
		return true
	}
	for _, e := range list {
		if e.ID == uuid.Nil {
			stepFailed = true
			log.Warn("reaping failed; the step runs again at the next reap", zap.String("step", e.Step), zap.Error(e.Err))
			continue
		}
		log.Error("the reaper cannot release or move an item; it stays as it is (in the items table), and every other item was reaped without it",
			zap.String("step", e.Step), zap.Stringer("item", e.ID), zap.Error(e.Err))
	}
	return stepFailed
}

// claimLoop claims while there are free handler slots, until ctx ends.
//
// While the queue has a backlog (the last claim came back full), the loop
// claims when half of the slots are free, or GatherWait after the first
// one freed, rather than for each slot as it frees: a claim then takes
// several items, and the database runs a fraction of the claim statements,
// at the cost of a few milliseconds of idle slots.
func (w *Worker) claimLoop(ctx context.Context, sess *session.Session, reb *partition.Rebalancer, fl *flights, lim *limiter,
	slots chan struct{}, handlers *sync.WaitGroup, handlerCtx, settleCtx context.Context, a *acker, log *zap.Logger) {
	freed := make(chan struct{}, 1) // a handler gave its slot back
	gather := max(1, cap(slots)/2)
	backlog := false
	limitLogged := false
	forgotten := false // a claim's outcome was unknown: release what it may have taken first
	pause := func() bool {
		t := time.NewTimer(w.opts.Poll/2 + rand.N(w.opts.Poll+1))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		// Wait for at least one free slot.
		select {
		case slots <- struct{}{}:
			<-slots
		case <-ctx.Done():
			return
		}
		if forgotten {
			if err := w.releaseForgotten(ctx, sess.ID(), fl, log); err != nil {
				if ctx.Err() == nil {
					log.Warn("claiming waits until it succeeds (the items' leases release them otherwise)", zap.Error(err))
				}
				if !pause() {
					return
				}
				continue
			}
			forgotten = false
		}
		if backlog && w.opts.GatherWait > 0 && cap(slots)-len(slots) < gather {
			w.waitFree(ctx, slots, freed, gather)
		}
		free := cap(slots) - len(slots)
		// Abandoned handlers still running take from the goroutine budget.
		if budget := w.opts.Concurrency + w.opts.MaxAbandoned - int(w.running.Load()); budget < free {
			free = max(0, budget)
			if !limitLogged {
				log.Error("abandoned handlers that never return use up the goroutine budget: claiming less",
					zap.Int64("abandoned_running", w.abandonedRunning.Load()), zap.Int("max_abandoned", w.opts.MaxAbandoned))
				limitLogged = true
			}
		}
		var items []claim.Item
		var holds []partition.Hold
		var err error
		var pl plan
		claimedAt := time.Now()
		switch {
		case free == 0:
		case reb != nil:
			parts, claimed := reb.Lease()
			pl = lim.plan(claimedAt, free, parts)
			var urgent []claim.Item
			if w.opts.UrgentLane && pl.n > 0 {
				// Items of limited tenants only from the session's own
				// parts: their owner alone enforces a tenant's limit.
				all, limited := lim.laneTenants()
				urgent, err = w.queue.ClaimUrgent(ctx, sess.ID(), claim.UrgentRequest{Max: pl.n, MaxPriority: w.opts.UrgentPriority,
					SkipTenants: pl.skip, OwnedParts: parts, AllTenantsLimited: all, LimitedTenants: limited})
			}
			if err == nil && len(urgent) < pl.n && len(parts) > 0 {
				rest := pl
				rest.n -= len(urgent)
				items, err = w.claim(ctx, sess, parts, rest)
			}
			items = append(urgent, items...)
			ps := make([]int, len(items))
			for i, it := range items {
				ps[i] = it.Part
			}
			// Lane items of the session's own parts hold their part like
			// the part's own items (a part is given up once they end);
			// those of other parts hold nothing (the zero Hold).
			holds = claimed(ps)
		default:
			pl = lim.plan(claimedAt, free, nil)
			if pl.n > 0 {
				items, err = w.claim(ctx, sess, nil, pl)
			}
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("claim failed", zap.Error(err))
		}
		if errors.Is(err, claim.ErrOutcomeUnknown) {
			forgotten = true
		}
		if len(items) > 0 && w.opts.OnClaim != nil {
			w.opts.OnClaim(ctx, items)
		}
		bound := claimedAt.Add(w.opts.ItemTimeout + w.opts.HangGrace + settleGrace)
		for i, it := range items {
			admitted := lim.admit(claimedAt, it.Tenant)
			itemCtx, cancelItem := context.WithCancelCause(handlerCtx)
			fl.add(it, claimedAt, bound, cancelItem)
			slots <- struct{}{}
			handlers.Add(1)
			w.inflight.Add(1)
			w.running.Add(1)
			go func() {
				defer func() {
					<-slots
					select {
					case freed <- struct{}{}:
					default:
					}
					w.inflight.Add(-1)
					handlers.Done()
					if reb != nil {
						reb.Done(holds[i])
					}
				}()
				if admitted {
					w.handle(itemCtx, handlerCtx, ctx, settleCtx, it, a, log)
					lim.done(it.Tenant)
				} else {
					w.giveBack(itemCtx, settleCtx, it, a, log)
				}
				fl.done(it.ID)
				cancelItem(nil)
			}()
		}
		backlog = err == nil && len(items) == free && free > 0
		if backlog {
			continue // a full batch: there is probably more
		}
		if free > 0 && err == nil && (pl.full || pl.wait > 0) && len(items) == pl.n {
			// Held back by the limits, not by an empty queue: claim again
			// when an item ends or a token comes.
			if !w.limitWait(ctx, freed, pl) {
				return
			}
			continue
		}
		if !pause() {
			return
		}
	}
}

// waitFree waits until n slots are free, GatherWait has passed or ctx ends.
func (w *Worker) waitFree(ctx context.Context, slots, freed chan struct{}, n int) {
	t := time.NewTimer(w.opts.GatherWait)
	defer t.Stop()
	for cap(slots)-len(slots) < n {
		select {
		case <-freed:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// handle runs the handler for one item and acks, nacks or releases it
// through the settle goroutines. claimCtx ends when the worker stops
// claiming (shutdown or session loss).
//
// itemCtx is the handler's parent context: handlerCtx, also cancelled when
// the item's claim is found lost.
func (w *Worker) handle(itemCtx, handlerCtx, claimCtx, settleCtx context.Context, it claim.Item, a *acker, log *zap.Logger) {
	h := w.attemptHandler
	var took atomic.Int64 // the handler's duration, in nanoseconds
	start := time.Now()
	if w.opts.Observer != nil {
		h = func(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
			defer func() { took.Store(int64(time.Since(start))) }() // also when it panics
			return w.handler(ctx, it)
		}
	}
	res := attempt.Run(itemCtx, w.queue, it, h, attempt.Options{
		Timeout:   w.opts.ItemTimeout,
		Grace:     w.opts.HangGrace,
		Settle:    a,
		SettleCtx: settleCtx,
		OnRetry:   func() { w.settleRetries.Add(1) },
		GiveBack:  func() bool { return handlerCtx.Err() != nil && claimCtx.Err() != nil },
		Log:       log.With(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.Int("attempt", it.Attempt)),
	})
	if res.Panicked {
		w.panics.Add(1)
	}
	if res.TimedOut {
		w.timeouts.Add(1)
	}
	if obs := w.opts.Observer; obs != nil {
		d := time.Duration(took.Load())
		if res.Abandoned {
			d = time.Since(start) // it has not returned
		}
		obs.HandlerDone(w.opts.Queue, d, outcomeNames[res.Outcome])
	}
	if res.Unknown && res.Outcome == attempt.Unsettled {
		w.unknown.Add(1)
	}
	if res.Outcome == attempt.Dropped {
		w.dropped.Add(1)
	}
	if !res.Abandoned {
		w.running.Add(-1)
		return
	}
	w.abandoned.Add(1)
	w.abandonedRunning.Add(1)
	go func() {
		<-res.HandlerDone
		w.abandonedRunning.Add(-1)
		w.running.Add(-1)
	}()
}

// RecordValue hands v to Options.BatchRecord with the ack of the item whose
// handler calls it (with the context the handler was given): the batch
// record finds it in claim.AckRequest.Value and writes it with the other
// results of the transaction in one statement. It returns an error when ctx
// is not a handler's context. The last call before the handler returns
// wins; a handler that fails is nacked as usual, its value dropped.
func RecordValue(ctx context.Context, v any) error {
	if !attempt.SetValue(ctx, v) {
		return errors.New("worker: RecordValue outside a handler's context")
	}
	return nil
}

// attemptHandler is the handler as package attempt takes it.
func (w *Worker) attemptHandler(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
	return w.handler(ctx, it)
}
