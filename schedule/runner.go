package schedule

import (
	"bytes"
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

// DefaultReload is Options.Reload's default.
const DefaultReload = 10 * time.Second

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
	// NoStored makes the runner run only the schedules given to New, not
	// the queue's schedules stored in the database (Put). Default: it runs
	// both.
	NoStored bool
	// Reload is how often Run re-reads the queue's stored schedules, to
	// find those added (or resumed) since: one read per runner per Reload.
	// A stored schedule's change, pause or removal is seen sooner, by its
	// own next turn, which reads its row. Default DefaultReload (10 s).
	Reload time.Duration
	// OnReload, if set, is called after each read of the stored schedules
	// (by Run, Tick or Reload) with the number of stored schedules the
	// runner now runs and the read's error, from the reading goroutine.
	OnReload func(n int, err error)
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
	// stored are the queue's stored schedules, by name (not those whose
	// names scheds has); under mu.
	stored map[string]*storedSched
	// reloaded is when Run last read them.
	reloaded time.Time
}

// storedSched is one stored schedule a runner runs: its compiled form and
// the spec text it came from.
type storedSched struct {
	c      *compiled
	text   []byte
	paused bool
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
	if opts.Reload == 0 {
		opts.Reload = DefaultReload
	}
	if opts.Reload < 0 {
		return nil, fmt.Errorf("schedule: Reload %v is negative", opts.Reload)
	}
	if len(schedules) == 0 && opts.NoStored {
		return nil, errors.New("schedule: no schedules (and NoStored: none from the database)")
	}
	r := &Runner{db: q.DB(), q: q, opts: opts, store: store.New(q.Options().Tables), done: map[string]time.Time{},
		log: opts.Logger.With(zap.String("queue", q.Name())), stored: map[string]*storedSched{}}
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
//
// Unless Options.NoStored, Tick first reads the queue's stored schedules
// (as Reload does) and runs their turns too.
func (r *Runner) Tick(ctx context.Context) ([]Fired, error) {
	var all []Fired
	var errs []error
	if !r.opts.NoStored {
		if err := r.Reload(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range r.scheds {
		fired, err := r.fire(ctx, c, false)
		all = append(all, fired...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range r.storedList(false) {
		fired, err := r.fire(ctx, c, true)
		all = append(all, fired...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return all, errors.Join(errs...)
}

// Reload reads the queue's stored schedules now (Run does every
// Options.Reload): the runner runs those added since, and forgets those
// removed. A stored schedule whose spec does not parse, or cannot run, is
// logged and left out (its error is returned, joined with the others');
// the others are taken.
func (r *Runner) Reload(ctx context.Context) error {
	if r.opts.NoStored {
		return nil
	}
	var rows []store.ScheduleRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = r.store.SchedulesStored(ctx, r.db, r.q.Name())
		return store.Classify(err)
	})
	if err != nil {
		err = fmt.Errorf("schedule: reading the stored schedules of queue %q: %w", r.q.Name(), err)
		if r.opts.OnReload != nil {
			r.opts.OnReload(r.storedCount(), err)
		}
		return err
	}
	var errs []error
	r.mu.Lock()
	old := r.stored
	r.stored = make(map[string]*storedSched, len(rows))
	for _, row := range rows {
		if r.inCode(row.Name) {
			continue // the code's definition wins in this runner
		}
		if s := old[row.Name]; s != nil && bytes.Equal(s.text, row.Spec) {
			s.paused = row.Paused
			r.stored[row.Name] = s
			continue
		}
		c, err := compileStored(row.Name, row.Spec)
		if err != nil {
			errs = append(errs, err)
			r.log.Warn("a stored schedule cannot run; left out", zap.String("schedule", row.Name), zap.Error(err))
			continue
		}
		r.stored[row.Name] = &storedSched{c: c, text: row.Spec, paused: row.Paused}
		if s := old[row.Name]; s == nil {
			r.log.Info("stored schedule added", zap.String("schedule", row.Name))
		} else {
			r.log.Info("stored schedule changed", zap.String("schedule", row.Name))
			delete(r.done, row.Name) // its periods may have moved: look at once
		}
	}
	for name := range old {
		if r.stored[name] == nil {
			delete(r.done, name)
			r.log.Info("stored schedule removed", zap.String("schedule", name))
		}
	}
	n := len(r.stored)
	r.mu.Unlock()
	err = errors.Join(errs...)
	if r.opts.OnReload != nil {
		r.opts.OnReload(n, err)
	}
	return err
}

// compileStored returns the runnable form of the stored schedule name with
// spec text.
func compileStored(name string, text []byte) (*compiled, error) {
	s, err := decode(name, text)
	if err != nil {
		return nil, err
	}
	return compile(s)
}

// inCode reports whether the runner was given a schedule named name.
func (r *Runner) inCode(name string) bool {
	for _, c := range r.scheds {
		if c.Name == name {
			return true
		}
	}
	return false
}

// storedCount returns how many stored schedules the runner runs.
func (r *Runner) storedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.stored)
}

// storedList returns the stored schedules the runner runs (not the paused
// ones, with active).
func (r *Runner) storedList(active bool) []*compiled {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*compiled, 0, len(r.stored))
	for _, s := range r.stored {
		if !active || !s.paused {
			out = append(out, s.c)
		}
	}
	return out
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
		if !r.opts.NoStored && (first || time.Since(r.reloaded) >= r.opts.Reload) {
			r.reloaded = time.Now()
			if err := r.Reload(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("reading the stored schedules failed; the others go on", zap.Error(err))
			}
		}
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
	code := len(r.scheds)
	for i, c := range append(r.scheds[:code:code], r.storedList(true)...) {
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
		if _, err := r.fire(ctx, c, i >= code); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// storedText returns the spec text the runner holds for stored schedule
// name (nil if none).
func (r *Runner) storedText(name string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.stored[name]; s != nil {
		return s.text
	}
	return nil
}

// untilNext returns how long to sleep until the next period of any
// schedule starts, by the estimated database clock.
func (r *Runner) untilNext() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().Add(r.offset)
	wait := maxSleep
	if !r.opts.NoStored {
		wait = min(wait, r.opts.Reload-time.Since(r.reloaded))
	}
	scheds := r.scheds
	for _, s := range r.stored {
		if !s.paused {
			scheds = append(scheds[:len(scheds):len(scheds)], s.c)
		}
	}
	for _, c := range scheds {
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
// failures) and reports what it enqueued, once committed. stored: c is a
// stored schedule, which the transaction reads from its row (changed,
// paused or removed since the runner read it).
func (r *Runner) fire(ctx context.Context, c *compiled, stored bool) ([]Fired, error) {
	var fired []Fired
	var cur, dbNow time.Time
	var sent time.Time
	var removed, paused bool
	var changed *storedSched
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
		removed, paused, changed = false, false, nil
		row, exists, err := r.store.SchedulesRow(ctx, tx, queue, c.Name)
		if err != nil {
			return err
		}
		if stored {
			switch {
			case !exists || row.Spec == nil:
				removed = true
				return nil // deleted (or taken back by code) since the runner read it
			case !bytes.Equal(row.Spec, r.storedText(c.Name)):
				nc, err := compileStored(c.Name, row.Spec)
				if err != nil {
					return err
				}
				changed = &storedSched{c: nc, text: row.Spec, paused: row.Paused}
				c = nc
			}
		}
		cur = c.latest(dbNow)
		if cur.IsZero() {
			return nil // a cron expression whose first activation is still to come
		}
		if exists && row.Paused {
			paused = true
			return nil
		}
		last, recorded := row.LastPeriod, exists && !row.LastPeriod.Equal(store.NeverFired)
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
	switch {
	case removed:
		delete(r.stored, c.Name)
		delete(r.done, c.Name)
		r.mu.Unlock()
		r.log.Info("stored schedule removed", zap.String("schedule", c.Name))
		return nil, nil
	case changed != nil:
		if r.stored[c.Name] != nil {
			r.stored[c.Name] = changed
		}
	}
	if paused {
		if s := r.stored[c.Name]; stored && s != nil {
			s.paused = true // Run looks again after its next reload
		}
	}
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
