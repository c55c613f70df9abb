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
package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

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
	DefaultMaxAckBatch     = 64
)

// Options configure a Worker. The zero value is valid: 8 handlers, no
// parts, queue "default", silent.
type Options struct {
	// Queue is the queue to work on. Default "default".
	Queue string
	// Tables names the crdbwork tables; it overrides the Tables of the
	// nested options.
	Tables crsql.Tables
	// Concurrency is the number of handlers running at once. Default 8.
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
	// ShutdownTimeout bounds how long a graceful stop waits for in-flight
	// handlers before cancelling them. Default 10 s.
	ShutdownTimeout time.Duration
	// RestartDelay is the pause before a new session after one was lost.
	// Default 1 s.
	RestartDelay time.Duration
	// MaxAckBatch bounds the items acked in one transaction. Handlers that
	// finish while an ack transaction commits are acked together in the
	// next (group commit; see claim.Queue.AckEach), which costs no waiting
	// and far fewer transactions. 1 acks every item in its own transaction.
	// Default 64.
	MaxAckBatch int
	// Session, Claim and Partition configure the parts the worker wires.
	Session   session.Options
	Claim     claim.Options
	Partition partition.Options
	// Logger receives structured logs. Default: none.
	Logger *zap.Logger
	// Observer, if not nil, is told of every handler run and every ack
	// transaction, for metrics (package metrics implements it). Default: none.
	Observer Observer
}

// Observer watches a worker's handlers and acks. Its methods are called from
// the worker's goroutines, concurrently: they must be safe for concurrent use
// and quick.
type Observer interface {
	// HandlerDone reports one handler run on queue: how long the handler
	// took (not counting the ack, nack or release after it), and how the
	// attempt ended: OutcomeAcked, OutcomeRetried, OutcomeDead,
	// OutcomeReleased or OutcomeUnsettled.
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
	// database failure, or an ack whose outcome is unknown).
	OutcomeUnsettled = "unsettled"
)

// outcomeNames names attempt's outcomes for Observer.
var outcomeNames = map[attempt.Outcome]string{
	attempt.Acked: OutcomeAcked, attempt.Retried: OutcomeRetried, attempt.Dead: OutcomeDead,
	attempt.Released: OutcomeReleased, attempt.Unsettled: OutcomeUnsettled,
}

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
	// Panics and Timeouts count handler runs that panicked or timed out.
	Panics, Timeouts int64
	// InFlight is the number of handlers running now.
	InFlight int64
	// Parts is the rebalancers' part movements, summed over sessions (the current one included).
	Parts partition.Stats
	// Session is the id of the current session ("" between sessions).
	Session string
}

// Worker runs a worker process. Create it with New and call Run once.
type Worker struct {
	db      DB
	handler Handler
	opts    Options
	queue   *claim.Queue
	log     *zap.Logger

	sessions, lost, panics, timeouts, inflight atomic.Int64
	partsAcquired, partsReleased               atomic.Int64
	partsRebalances, partsRetries              atomic.Int64
	current                                    atomic.Value                         // string
	reb                                        atomic.Pointer[partition.Rebalancer] // the current session's, for Stats
}

// New returns a worker that handles the items of opts.Queue with h.
func New(db DB, h Handler, opts Options) (*Worker, error) {
	if db == nil || h == nil {
		return nil, errors.New("worker: nil database or handler")
	}
	if opts.Queue == "" {
		opts.Queue = claim.DefaultQueue
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Poll == 0 {
		opts.Poll = DefaultPoll
	}
	if opts.ItemTimeout == 0 {
		opts.ItemTimeout = DefaultItemTimeout
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if opts.RestartDelay == 0 {
		opts.RestartDelay = DefaultRestartDelay
	}
	if opts.MaxAckBatch == 0 {
		opts.MaxAckBatch = DefaultMaxAckBatch
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	switch {
	case opts.Concurrency < 0:
		return nil, fmt.Errorf("worker: concurrency %d is negative", opts.Concurrency)
	case opts.Poll < 0 || opts.ItemTimeout < 0 || opts.ShutdownTimeout < 0 || opts.RestartDelay < 0:
		return nil, errors.New("worker: durations must not be negative")
	case opts.MaxAckBatch < 0:
		return nil, fmt.Errorf("worker: MaxAckBatch %d is negative", opts.MaxAckBatch)
	case opts.Parts < 0 || opts.Parts > partition.MaxParts:
		return nil, fmt.Errorf("worker: Parts %d is out of range (0: no parts, or 1 to %d)", opts.Parts, partition.MaxParts)
	}
	opts.Claim.Queue, opts.Partition.Queue = opts.Queue, opts.Queue
	opts.Session.Tables, opts.Claim.Tables, opts.Partition.Tables = opts.Tables, opts.Tables, opts.Tables
	if opts.Session.Logger == nil {
		opts.Session.Logger = opts.Logger
	}
	if opts.Partition.Logger == nil {
		opts.Partition.Logger = opts.Logger
	}
	q, err := claim.New(db, opts.Claim)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{db: db, handler: h, opts: opts, queue: q, log: opts.Logger.With(zap.String("queue", opts.Queue))}
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
	return Stats{
		Stats:    w.queue.Stats(),
		Sessions: w.sessions.Load(), SessionsLost: w.lost.Load(),
		Panics: w.panics.Load(), Timeouts: w.timeouts.Load(), InFlight: w.inflight.Load(),
		Parts:   parts,
		Session: w.current.Load().(string),
	}
}

// Run works until ctx is cancelled, then shuts down gracefully: it stops
// claiming, lets in-flight handlers finish within ShutdownTimeout (then
// cancels them and releases their items), and closes the session, which
// releases its parts at once. When a session is lost, in-flight handlers see
// their context cancelled and Run starts a new session after RestartDelay.
// Run returns nil after a graceful stop, or an error when it cannot start a
// session (a missing schema, bad options) the first time.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.ensureParts(ctx); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	first := true
	for ctx.Err() == nil {
		sess, err := session.Start(context.WithoutCancel(ctx), w.db, w.opts.Session)
		if err != nil {
			if first || errors.Is(err, crsql.ErrSchemaMissing) {
				return fmt.Errorf("worker: %w", err)
			}
			w.log.Warn("starting a session failed; retrying", zap.Error(err))
		} else {
			first = false
			w.sessions.Add(1)
			w.current.Store(sess.ID().String())
			w.runSession(ctx, sess)
			w.current.Store("")
			if ctx.Err() != nil {
				return nil
			}
			w.lost.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(w.opts.RestartDelay):
		}
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

// runSession runs one session until it is lost or ctx is cancelled; on
// return the session is closed.
func (w *Worker) runSession(ctx context.Context, sess *session.Session) {
	log := w.log.With(zap.Stringer("session", sess.ID()))
	log.Info("session started")
	// handlerCtx ends with the session, or when a shutdown stops waiting.
	handlerCtx, cancelHandlers := context.WithCancel(sess.Context())
	defer cancelHandlers()
	var reb *partition.Rebalancer
	var rebDone chan struct{}
	if w.opts.Parts > 0 {
		var err error
		reb, err = partition.New(w.db, sess, w.opts.Partition)
		if err != nil {
			log.Error("starting the rebalancer failed", zap.Error(err))
			sess.Close(context.WithoutCancel(ctx))
			return
		}
		w.reb.Store(reb)
		rebDone = make(chan struct{})
		go func() {
			defer close(rebDone)
			if err := reb.Run(sess.Context()); err != nil {
				log.Warn("rebalancer stopped", zap.Error(err))
			}
		}()
	}

	var ack attempt.AckFunc // nil: each item acks on its own
	if w.opts.MaxAckBatch > 1 {
		var observe func(int)
		if obs := w.opts.Observer; obs != nil {
			observe = func(n int) { obs.AckBatch(w.opts.Queue, n) }
		}
		a := startAcker(w.queue, w.opts.MaxAckBatch, w.settleTimeout(), observe)
		defer a.stop() // after the handlers, which wait for their acks
		ack = a.ack
	}
	slots := make(chan struct{}, w.opts.Concurrency)
	var handlers sync.WaitGroup
	claimCtx, stopClaiming := context.WithCancel(sess.Context())
	stopOnShutdown := context.AfterFunc(ctx, stopClaiming)
	defer stopOnShutdown()
	w.claimLoop(claimCtx, sess, reb, slots, &handlers, handlerCtx, ack, log)
	stopClaiming()

	// Wait for in-flight handlers: at once if the session is lost (their
	// contexts are already cancelled), within ShutdownTimeout otherwise.
	waited := make(chan struct{})
	go func() { handlers.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(w.opts.ShutdownTimeout):
		log.Warn("shutdown timeout: cancelling in-flight handlers", zap.Int64("in_flight", w.inflight.Load()))
		cancelHandlers()
		<-waited
	}
	if err := sess.Err(); err != nil && !errors.Is(err, session.ErrClosed) {
		log.Warn("session lost", zap.Error(err))
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
	defer cancel()
	if err := sess.Close(closeCtx); err != nil {
		log.Warn("closing the session failed; peers will reap it", zap.Error(err))
	}
	if reb != nil {
		<-rebDone
		w.reb.Store(nil) // a snapshot between these lines may miss this session's moves, never count them twice
		st := reb.Stats()
		w.partsAcquired.Add(st.Acquired)
		w.partsReleased.Add(st.Released)
		w.partsRebalances.Add(st.Rebalances)
		w.partsRetries.Add(st.Retries)
	}
	log.Info("session ended")
}

// gatherWait bounds how long a busy worker waits, after a handler slot
// frees, for more slots to free before it claims (see claimLoop).
const gatherWait = 5 * time.Millisecond

// claimLoop claims while there are free handler slots, until ctx ends.
//
// While the queue has a backlog (the last claim came back full), the loop
// claims when half of the slots are free, or gatherWait after the
// first one freed, rather than for each slot as it frees: a claim then
// takes several items, and the database runs a fraction of the claim
// statements, at the cost of a few milliseconds of idle slots.
func (w *Worker) claimLoop(ctx context.Context, sess *session.Session, reb *partition.Rebalancer,
	slots chan struct{}, handlers *sync.WaitGroup, handlerCtx context.Context, ack attempt.AckFunc, log *zap.Logger) {
	freed := make(chan struct{}, 1) // a handler gave its slot back
	gather := max(1, cap(slots)/2)
	backlog := false
	for ctx.Err() == nil {
		// Wait for at least one free slot.
		select {
		case slots <- struct{}{}:
			<-slots
		case <-ctx.Done():
			return
		}
		if backlog && cap(slots)-len(slots) < gather {
			w.waitFree(ctx, slots, freed, gather)
		}
		free := cap(slots) - len(slots)
		var items []claim.Item
		var err error
		if reb != nil {
			parts, claimed := reb.Lease()
			items, err = w.queue.ClaimParts(ctx, sess.ID(), parts, free)
			ps := make([]int, len(items))
			for i, it := range items {
				ps[i] = it.Part
			}
			claimed(ps)
		} else {
			items, err = w.queue.Claim(ctx, sess.ID(), free)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("claim failed", zap.Error(err))
		}
		for _, it := range items {
			slots <- struct{}{}
			handlers.Add(1)
			w.inflight.Add(1)
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
						reb.Done(it.Part)
					}
				}()
				w.handle(handlerCtx, ctx, it, ack, log)
			}()
		}
		backlog = err == nil && len(items) == free && free > 0
		if backlog {
			continue // a full batch: there is probably more
		}
		d := w.opts.Poll/2 + rand.N(w.opts.Poll+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// settleTimeout bounds an ack, nack or release, which runs even after the
// handler's context ended.
func (w *Worker) settleTimeout() time.Duration { return w.opts.ShutdownTimeout + 10*time.Second }

// waitFree waits until n slots are free, gatherWait has passed or ctx ends.
func (w *Worker) waitFree(ctx context.Context, slots, freed chan struct{}, n int) {
	t := time.NewTimer(gatherWait)
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

// handle runs the handler for one item and acks (with ack; nil: on its own),
// nacks or releases it. claimCtx ends when the worker stops claiming
// (shutdown or session loss).
func (w *Worker) handle(handlerCtx, claimCtx context.Context, it claim.Item, ack attempt.AckFunc, log *zap.Logger) {
	h := w.attemptHandler
	var took time.Duration
	if w.opts.Observer != nil {
		h = func(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
			start := time.Now()
			defer func() { took = time.Since(start) }() // also when it panics
			return w.handler(ctx, it)
		}
	}
	res := attempt.Run(handlerCtx, w.queue, it, h, attempt.Options{
		Timeout:       w.opts.ItemTimeout,
		SettleTimeout: w.settleTimeout(),
		Ack:           ack,
		GiveBack:      func() bool { return handlerCtx.Err() != nil && claimCtx.Err() != nil },
		Log:           log.With(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.Int("attempt", it.Attempt)),
	})
	if res.Panicked {
		w.panics.Add(1)
	}
	if res.TimedOut {
		w.timeouts.Add(1)
	}
	if obs := w.opts.Observer; obs != nil {
		obs.HandlerDone(w.opts.Queue, took, outcomeNames[res.Outcome])
		if ack == nil && res.Outcome == attempt.Acked {
			obs.AckBatch(w.opts.Queue, 1)
		}
	}
}

// attemptHandler is the handler as package attempt takes it.
func (w *Worker) attemptHandler(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
	return w.handler(ctx, it)
}
