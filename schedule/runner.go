package schedule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// DefaultRetryDelay is Options.RetryDelay's default.
const DefaultRetryDelay = time.Second

// maxSleep bounds one sleep of Run: it looks again at least this often
// (locally: the database is asked only when a period is due).
const maxSleep = time.Minute

// minSleep bounds one sleep of Run from below, so that a process clock
// running ahead of the database's cannot make it spin.
const minSleep = 5 * time.Millisecond

// Options configure a Runner. The zero value is valid. The queue the items
// go to, its tables and its policy (MaxAttempts, MaxPayload...) are the
// claim.Queue's given to New.
type Options struct {
	// RetryDelay is how long Run waits after a failed attempt (the database
	// unreachable, an unknown outcome) before it tries again. Default 1 s.
	RetryDelay time.Duration
	// Logger receives structured logs. Default: none.
	Logger *zap.Logger
	// OnEnqueue, if set, is called with every item a transaction of this
	// runner committed (after the COMMIT succeeded), from Run's or Tick's
	// goroutine.
	OnEnqueue func(Fired)
}

// Fired is one periodic item that a runner's transaction enqueued.
type Fired struct {
	// Schedule is the schedule's name.
	Schedule string
	// Period is the start of the item's period (UTC).
	Period time.Time
	// ID is the item's id, ItemID(queue, Schedule, Period).
	ID uuid.UUID
	// CatchUp is true for the item of a missed period (see CatchUp).
	CatchUp bool
	// New is false if an item with that id was already in the items table
	// (left there by an earlier attempt whose outcome was unknown).
	New bool
}

// Runner enqueues the items of its schedules. Run it in every process that
// should keep the schedules going: any number of runners together enqueue
// one item per period. A Runner is safe for concurrent use.
type Runner struct {
	db     claim.DB
	q      *claim.Queue
	store  *store.Store
	opts   Options
	scheds []*compiled
	log    *zap.Logger

	// checked is set once the queue checked the schema (outside any
	// transaction: EnqueueTx would check it on a second connection
	// while the transaction holds one).
	checked atomic.Bool

	mu     sync.Mutex
	done   map[string]time.Time // per schedule: a period known recorded
	offset time.Duration        // database clock minus this process's, last measured
}

// New returns a Runner that enqueues the items of schedules in q, on q's
// database and tables. It does no I/O. Every schedule is checked: a bad one
// (see ErrBadSchedule) fails New with an error that names it and says why.
func New(q *claim.Queue, opts Options, schedules ...Schedule) (*Runner, error) {
	if q == nil {
		return nil, errors.New("schedule: nil queue")
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	if opts.RetryDelay < 0 {
		return nil, fmt.Errorf("schedule: RetryDelay %v is negative", opts.RetryDelay)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if len(schedules) == 0 {
		return nil, errors.New("schedule: no schedules")
	}
	r := &Runner{db: q.DB(), q: q, opts: opts, store: store.New(q.Options().Tables), done: map[string]time.Time{},
		log: opts.Logger.With(zap.String("queue", q.Name()))}
	seen := map[string]bool{}
	for _, s := range schedules {
		c, err := compile(s)
		if err != nil {
			return nil, fmt.Errorf("schedule: %w", err)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("schedule: %w: two schedules are named %q", ErrBadSchedule, s.Name)
		}
		seen[s.Name] = true
		r.scheds = append(r.scheds, c)
	}
	return r, nil
}

// Tick runs the transaction of every schedule once: each enqueues the item
// of its current period (and of the latest missed one, with CatchUp) if
// no runner has yet, and returns what this call enqueued. An error of one
// schedule does not stop the others; an error wrapping
// claim.ErrOutcomeUnknown means a transaction may have committed (the next
// Tick finds out, and enqueues nothing twice).
func (r *Runner) Tick(ctx context.Context) ([]Fired, error) {
	var all []Fired
	var errs []error
	for _, c := range r.scheds {
		fired, err := r.fire(ctx, c)
		all = append(all, fired...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return all, errors.Join(errs...)
}

// Run keeps the schedules going until ctx ends, then returns nil: it sleeps
// until the next period of any schedule starts (by the database clock,
// estimated from the last transaction), runs the transactions of the
// schedules that are due, and starts again. Failures are logged and retried
// after Options.RetryDelay.
func (r *Runner) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		wait := r.opts.RetryDelay
		if err := r.due(ctx, first); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Warn("enqueueing periodic items failed; retrying", zap.Error(err), zap.Duration("in", wait))
		} else {
			first = false
			wait = r.untilNext()
		}
		timer.Reset(wait)
	}
}

// due runs the transactions of the schedules whose current period, by the
// estimated database clock, is not known to be recorded (all of them when
// all is set).
func (r *Runner) due(ctx context.Context, all bool) error {
	var errs []error
	for _, c := range r.scheds {
		if !all {
			r.mu.Lock()
			now := time.Now().Add(r.offset)
			done := r.done[c.Name]
			r.mu.Unlock()
			cur := c.latest(now)
			if cur.IsZero() || !cur.After(done) {
				continue
			}
		}
		if _, err := r.fire(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// untilNext returns how long to sleep until the next period of any
// schedule starts, by the estimated database clock.
func (r *Runner) untilNext() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().Add(r.offset)
	wait := maxSleep
	for _, c := range r.scheds {
		from := now
		if done := r.done[c.Name]; done.After(from) {
			from = done
		}
		if next := c.next(from); !next.IsZero() {
			// A millisecond late, so that the database's now() is past it.
			wait = min(wait, next.Sub(now)+time.Millisecond)
		}
	}
	return max(wait, minSleep)
}

// fire runs the transaction of c once (retried whole on serialization
// failures) and reports what it enqueued, once committed.
func (r *Runner) fire(ctx context.Context, c *compiled) ([]Fired, error) {
	var fired []Fired
	var cur, dbNow time.Time
	var sent time.Time
	queue := r.q.Name()
	if !r.checked.Load() {
		if _, err := r.q.Settings(ctx); err != nil {
			return nil, fmt.Errorf("schedule %q of queue %q: %w", c.Name, queue, err)
		}
		r.checked.Store(true)
	}
	err := retry.Tx(ctx, r.db, nil, func(ctx context.Context, tx pgx.Tx) error {
		fired = nil
		sent = time.Now()
		var err error
		if dbNow, err = r.store.SchedulesNow(ctx, tx); err != nil {
			return err
		}
		cur = c.latest(dbNow)
		if cur.IsZero() {
			return nil // a cron expression whose first activation is still to come
		}
		last, recorded, err := r.store.SchedulesLast(ctx, tx, queue, c.Name)
		if err != nil {
			return err
		}
		if recorded && !last.Before(cur) {
			return nil // this period's item (or a later one's) is enqueued
		}
		periods := []time.Time{cur}
		if recorded && c.Missed == CatchUp {
			if prev := c.previous(cur); prev.After(last) {
				periods = []time.Time{prev, cur}
			}
		}
		if advanced, err := r.store.SchedulesAdvance(ctx, tx, queue, c.Name, cur); err != nil {
			return err
		} else if !advanced {
			return nil // moved past cur meanwhile (not under SERIALIZABLE with the row locked, but never go back)
		}
		items := make([]claim.NewItem, len(periods))
		for i, p := range periods {
			items[i] = c.item(queue, p)
		}
		res, err := r.q.EnqueueTx(ctx, tx, items...)
		if err != nil {
			return err
		}
		for i, p := range periods {
			fired = append(fired, Fired{Schedule: c.Name, Period: p, ID: res.IDs[i], CatchUp: i < len(periods)-1, New: res.New[i]})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("schedule %q of queue %q: %w", c.Name, queue, err)
	}
	r.mu.Lock()
	r.offset = dbNow.Sub(sent)
	if cur.After(r.done[c.Name]) {
		r.done[c.Name] = cur
	}
	r.mu.Unlock()
	for _, f := range fired {
		if f.New {
			// Committed: wake this process's idle workers (EnqueueTx's
			// notification wakes those of every process on PostgreSQL).
			r.q.Wake()
			break
		}
	}
	for _, f := range fired {
		r.log.Debug("periodic item enqueued", zap.String("schedule", f.Schedule), zap.Time("period", f.Period),
			zap.Stringer("id", f.ID), zap.Bool("catch_up", f.CatchUp))
		if r.opts.OnEnqueue != nil {
			r.opts.OnEnqueue(f)
		}
	}
	return fired, nil
}
