package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults for Options.
const (
	DefaultPoll         = time.Second
	DefaultDrainTimeout = 10 * time.Second
	DefaultReadEvery    = 30 * time.Second
)

// Strategy computes the target assignment from the current owners of the
// parts (prev, live members only), the sorted ids of the queue's live
// members (session.Members) and the number of parts.
type Strategy func(prev map[uuid.UUID][]int, live []uuid.UUID, numParts int) map[uuid.UUID][]int

// Contiguous is the strategy of the recipe: contiguous runs of parts in the
// lexical order of session ids (Assign), ignoring the current owners.
func Contiguous(_ map[uuid.UUID][]int, live []uuid.UUID, numParts int) map[uuid.UUID][]int {
	return Assign(live, numParts)
}

// Sticky keeps parts with their current owners as far as balance allows
// (AssignSticky), so fewer parts move when sessions join or leave.
func Sticky(prev map[uuid.UUID][]int, live []uuid.UUID, numParts int) map[uuid.UUID][]int {
	return AssignSticky(prev, live, numParts)
}

// Tuning holds a rebalancer's timing and strategy. It is the part of a
// rebalancer's options a worker takes (worker.Options.Partition); Options
// embeds it. The zero value is valid: polls every second, drains for at
// most 10 s, Sticky.
type Tuning struct {
	// Poll is the interval between rebalances. Default 1 s.
	Poll time.Duration
	// DrainTimeout bounds how long a part being given up waits for its
	// in-flight items before its row is deleted anyway (which releases
	// their claims: their acks then fail and the items run again
	// elsewhere; a worker first cancels their handlers and waits up to a
	// quarter of DrainTimeout more: Options.OnDrainTimeout). Default 10 s.
	DrainTimeout time.Duration
	// Strategy computes the assignment. Default Sticky.
	Strategy Strategy
	// ReadEvery bounds how long a settled rebalancer goes without reading
	// the queue's members and owners. A rebalancer whose session reports
	// changes (session.Session.Changes: the change marker its heartbeat
	// reads) reads them at the poll after a change, and while it is not
	// settled (it still has parts to take or to give up); otherwise its
	// polls read nothing. Code of schema versions 3 to 5 records no
	// changes: what it does (a session of its joins, its reaper deletes a
	// dead session, its SetParts) is seen within ReadEvery. Default 30 s;
	// negative: every poll reads (as before version 6). A session without
	// Changes (a fake) reads at every poll.
	ReadEvery time.Duration
}

// Options configure a Rebalancer. The zero value is valid.
type Options struct {
	// Tuning is the rebalancer's timing and strategy (Poll, DrainTimeout,
	// Strategy), promoted: o.Poll is o.Tuning.Poll.
	Tuning
	// Queue is the queue whose parts are divided. Default "default".
	Queue string
	// Tables names the crdbwork tables.
	Tables crsql.Tables
	// Logger receives the rebalancer's logs. Default: none.
	Logger *zap.Logger
	// OnDrainTimeout, if not nil, is called when a part being given up
	// still has items in flight at DrainTimeout, with the ownership given
	// up: the items whose Hold equals it. A worker cancels their
	// handlers; the rebalancer then waits up to a quarter of DrainTimeout
	// more for them to be Done before it deletes the part's row, which
	// releases the claims still in it. Without it the row is deleted at
	// DrainTimeout and those handlers run on beside the items' next runs.
	OnDrainTimeout func(ownership Hold)
	// Testing holds hooks for tests; not for production.
	Testing TestingOptions
}

// TestingOptions are hooks into a rebalancer's loop, for tests that wait
// for its rounds instead of sleeping (package internal/await's Rounds); not
// for production: they may change in any release. The zero value sets
// none, and a hook left nil costs nothing. Hooks run on the loop's
// goroutine, which waits for them: keep them quick.
type TestingOptions struct {
	// AfterRebalance, if not nil, is called by Run after each poll
	// (Rebalance), with the parts the session owns then (Owned: draining
	// ones included; a part being given up is released by a goroutine of
	// its own, later) and the poll's error. Not called once Run's context
	// or the session ended.
	AfterRebalance func(owned []int, err error)
}

// Stats counts a rebalancer's part movements.
type Stats struct {
	// Acquired and Released count the parts the rebalancer took and gave up.
	Acquired, Released int64
	// Rebalances counts completed polls; Reads those of them that read
	// the queue's members and owners (the others found no change: see
	// Tuning.ReadEvery).
	Rebalances, Reads int64
	// Retries counts serialization-failure retries of its statements.
	Retries int64
}

// part is this session's view of one ownership of one part: from the
// acquisition of its row to its release (or its disappearance). A part given
// up and acquired again is a new ownership with a new epoch.
type part struct {
	epoch    uint64
	draining bool
	busy     int           // leases and items of this ownership not yet done
	idle     chan struct{} // closed when busy drops to 0 while draining
	closed   bool          // idle is closed
}

// Hold is one claimed item's hold on the ownership of its part, as counted by
// the claimed function of Lease. Pass it to Done once the item is acked,
// nacked or released. A hold counts only against the ownership it was taken
// in: if the part was given up (on DrainTimeout) or removed (SetParts)
// meanwhile, and perhaps acquired again, Done of the old hold changes
// nothing.
type Hold struct {
	Part  int
	epoch uint64
}

// Rebalancer keeps one session's share of a queue's parts, among the
// queue's live members. Use Lease and Done from the claiming loop, and Run
// on its own goroutine. A session may run one Rebalancer per queue it
// works.
type Rebalancer struct {
	db    DB
	sess  Session
	store *store.Store
	opts  Options
	log   *zap.Logger

	mu    sync.Mutex
	owned map[int]*part
	epoch uint64 // of the last ownership created
	drain sync.WaitGroup
	// dbMu makes the rebalancer use one connection at a time: its polls
	// and the releases of drained parts take turns.
	dbMu sync.Mutex

	acquired, released, rebalances, retries, reads atomic.Int64
	// pending: the last rebalance left parts to take or to give up (or
	// could not tell): the next poll reads again.
	pending  atomic.Bool
	numParts atomic.Int64 // as the last rebalance read it
	// changed is signalled (without blocking; one value is kept while
	// pending) by a rebalance that gained parts or read a new number of
	// parts (see Changed).
	changed chan struct{}
}

// New returns a rebalancer for sess, which reads and writes the queue's
// parts through db. sess is usually a *session.Session; see Session for
// what a fake must provide. New does no I/O until Run.
func New(db DB, sess Session, opts Options) (*Rebalancer, error) {
	if opts.Queue == "" {
		opts.Queue = "default"
	}
	if opts.Poll == 0 {
		opts.Poll = DefaultPoll
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.ReadEvery == 0 {
		opts.ReadEvery = DefaultReadEvery
	}
	if opts.Strategy == nil {
		opts.Strategy = Sticky
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if err := store.CheckQueueName(opts.Queue); err != nil {
		return nil, fmt.Errorf("partition: %w (claim.MaxQueueNameLength)", err)
	}
	switch {
	case db == nil || sess == nil || isNilSession(sess):
		return nil, errors.New("partition: nil database or session")
	case opts.Poll < 0 || opts.DrainTimeout < 0:
		return nil, fmt.Errorf("partition: negative poll %v or drain timeout %v", opts.Poll, opts.DrainTimeout)
	}
	if err := opts.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	return &Rebalancer{
		db: db, sess: sess, store: store.New(opts.Tables), opts: opts,
		log:   opts.Logger.With(zap.Stringer("session", sess.ID()), zap.String("queue", opts.Queue)),
		owned: map[int]*part{}, changed: make(chan struct{}, 1),
	}, nil
}

// isNilSession reports whether sess is a nil *session.Session, which a nil
// check of the interface does not catch.
func isNilSession(sess Session) bool {
	s, ok := sess.(*session.Session)
	return ok && s == nil
}

// Stats returns the rebalancer's counters.
func (r *Rebalancer) Stats() Stats {
	return Stats{Acquired: r.acquired.Load(), Released: r.released.Load(), Rebalances: r.rebalances.Load(), Retries: r.retries.Load(),
		Reads: r.reads.Load()}
}

// NumParts returns the queue's number of parts as the last rebalance read
// it, or 0 before the first.
func (r *Rebalancer) NumParts() int { return int(r.numParts.Load()) }

// Changed returns a channel that receives a value after a rebalance in
// which the session gained parts (it acquired them, or found rows of its
// own it did not know) or read a number of parts other than the one it
// had (its first read included). Values do not queue up: one is kept
// while pending. A claiming loop should then claim in every part it owns
// at once, whatever it waits for: the items of a part it just gained may
// have been announced (a wake-up, whose hint named the part) while
// another session or none owned it, and nothing announces them again; with
// a new number of parts, the hints of later wake-ups map to other parts,
// and items moved by SetParts are in parts their hints never named.
func (r *Rebalancer) Changed() <-chan struct{} { return r.changed }

// signalChanged signals Changed without blocking.
func (r *Rebalancer) signalChanged() {
	select {
	case r.changed <- struct{}{}:
	default: // one is pending already
	}
}

// Owned returns the parts this session owns now, draining ones included, sorted.
func (r *Rebalancer) Owned() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, 0, len(r.owned))
	for p := range r.owned {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Lease returns the parts to claim in now (owned and not draining) and
// marks them busy so that none of them is given up while the claim runs.
// Call claimed exactly once, with the part of every item the claim
// returned, even if the claim failed (with no parts). It returns one Hold
// per item, in order: each item keeps its part's ownership busy until Done
// with its Hold.
func (r *Rebalancer) Lease() (parts []int, claimed func(itemParts []int) []Hold) {
	leased := map[int]uint64{}
	r.mu.Lock()
	for p, st := range r.owned {
		if !st.draining {
			parts = append(parts, p)
			leased[p] = st.epoch
			st.busy++
		}
	}
	r.mu.Unlock()
	slices.Sort(parts)
	var once sync.Once
	return parts, func(itemParts []int) []Hold {
		holds := make([]Hold, len(itemParts))
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			for i, p := range itemParts {
				// The item was claimed in the ownership leased; if that
				// ended meanwhile, its hold counts against nothing.
				holds[i] = Hold{Part: p, epoch: leased[p]}
				if st := r.owned[p]; st != nil && st.epoch == leased[p] {
					st.busy++
				}
			}
			for p, e := range leased {
				r.doneLocked(Hold{Part: p, epoch: e})
			}
		})
		return holds
	}
}

// Done reports that the item of h has been acked, nacked or released. Done
// of a hold whose ownership has ended, or of the zero Hold, does nothing.
func (r *Rebalancer) Done(h Hold) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.doneLocked(h)
}

func (r *Rebalancer) doneLocked(h Hold) {
	st := r.owned[h.Part]
	if st == nil || st.epoch != h.epoch || h.epoch == 0 || st.busy == 0 {
		return
	}
	st.busy--
	if st.busy == 0 && st.draining && !st.closed {
		st.closed = true
		close(st.idle)
	}
}

// newPartLocked records a new ownership of a part.
func (r *Rebalancer) newPartLocked() *part {
	r.epoch++
	return &part{epoch: r.epoch}
}

// Run joins the session to the queue (Session.Join: from then on
// it counts among the queue's members, which share its parts), then
// rebalances every Poll until ctx is cancelled or the session ends. It
// returns nil on a cancelled context and the session's error when the
// session was lost. Parts are not given back on return, nor is the
// membership: closing the session releases them all at once.
func (r *Rebalancer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.sess.Context(), cancel)
	defer stop()
	if err := r.withDB(func() error { return r.sess.Join(ctx, r.opts.Queue) }); err != nil && ctx.Err() == nil {
		r.log.Warn("joining the queue failed; the first rebalance joins it", zap.Error(err))
	}
	defer r.drain.Wait()
	t := time.NewTicker(r.opts.Poll)
	defer t.Stop()
	// changes receives a value after a heartbeat that saw the queue's
	// change marker move (nil for a session without: every poll reads).
	var changes <-chan struct{}
	if c, ok := r.sess.(interface{ Changes() <-chan struct{} }); ok && r.opts.ReadEvery > 0 {
		changes = c.Changes()
	}
	changed := true // read at the first poll
	var lastRead time.Time
	for {
		var err error
		if changes == nil || changed || r.pending.Load() || time.Since(lastRead) >= r.opts.ReadEvery {
			changed = false // a change during the read is read at the next poll
			lastRead = time.Now()
			if err = r.Rebalance(ctx); err != nil {
				changed = true
			}
		} else {
			r.rebalances.Add(1) // a poll that found nothing changed
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("rebalance failed", zap.Error(err))
		}
		if h := r.opts.Testing.AfterRebalance; h != nil && ctx.Err() == nil {
			h(r.Owned(), err)
		}
		select {
		case <-ctx.Done():
			r.mu.Lock()
			clear(r.owned)
			r.mu.Unlock()
			if err := r.sess.Err(); err != nil && !errors.Is(err, session.ErrClosed) {
				return err
			}
			return nil
		case <-t.C:
		case <-changes:
			// Read at once: a dead session's parts wait for it.
			changed = true
		}
	}
}

// Rebalance runs one poll: it reads the queue's live members
// (session.Members), the owners and the number of parts, starts draining
// the parts this session must give up and takes the free parts it should
// own. Run calls it; tests may too.
//
// Only the queue's members share its parts: sessions that work other
// queues of the same database take no part of this one. A session that
// is not a member (it never joined, or its membership row was deleted)
// joins first (Session.Join) and reads the members again.
func (r *Rebalancer) Rebalance(ctx context.Context) error {
	me := r.sess.ID()
	var live, joined []uuid.UUID
	var n int
	var owners map[int]uuid.UUID
	err := r.withDB(func() error {
		var err error
		read := func() (err error) {
			if live, err = session.Members(ctx, r.db, r.opts.Tables, r.opts.Queue); err != nil {
				return err
			}
			joined, err = session.JoinedMembers(ctx, r.db, r.opts.Tables, r.opts.Queue)
			return err
		}
		if err := read(); err != nil {
			return err
		}
		if !slices.Contains(joined, me) {
			if err := r.sess.Join(ctx, r.opts.Queue); err != nil {
				return fmt.Errorf("partition: %w", err)
			}
			if err := read(); err != nil {
				return err
			}
		}
		if n, err = Parts(ctx, r.db, r.opts.Tables, r.opts.Queue); err != nil {
			return err
		}
		if r.numParts.Swap(int64(n)) != int64(n) {
			r.signalChanged()
		}
		owners, err = r.owners(ctx)
		return err
	})
	r.reads.Add(1)
	r.pending.Store(true) // until this poll finds nothing left to do
	if err != nil {
		return err
	}
	if !slices.Contains(live, me) {
		// A member, but our row is gone or expired: the session reports
		// its loss; claim nothing.
		return nil
	}
	prev := map[uuid.UUID][]int{}
	mine := map[int]bool{}
	for p, s := range owners {
		if slices.Contains(live, s) {
			prev[s] = append(prev[s], p)
		}
		if s == me {
			mine[p] = true
		}
	}
	for _, ps := range prev {
		slices.Sort(ps)
	}
	target := map[int]bool{}
	for _, p := range divide(r.opts.Strategy, prev, live, joined, n)[me] {
		target[p] = true
	}

	r.mu.Lock()
	// Rows that vanished behind our back (SetParts shrank the queue):
	// forget them; their claims are already released.
	for p, st := range r.owned {
		if !mine[p] && !st.draining {
			delete(r.owned, p)
		}
	}
	gained := false
	for p := range mine {
		if r.owned[p] == nil {
			r.owned[p] = r.newPartLocked()
			gained = true
		}
		if st := r.owned[p]; !target[p] && !st.draining {
			st.draining, st.closed = true, false
			st.idle = make(chan struct{})
			if st.busy == 0 {
				st.closed = true
				close(st.idle)
			}
			r.drain.Add(1)
			go r.giveUp(ctx, p, st)
		}
	}
	r.mu.Unlock()
	if gained {
		r.signalChanged()
	}

	pending := false
	for p := range mine {
		pending = pending || !target[p] // being given up
	}
	for p := range target {
		if mine[p] {
			continue
		}
		if _, taken := owners[p]; taken {
			pending = true
			continue // not free yet: its owner drains it, or expires
		}
		var acquired bool
		err := r.withDB(func() error {
			return retry.Do(ctx, func() { r.retries.Add(1) }, func(ctx context.Context) error {
				var err error
				acquired, err = r.store.PartsAcquire(ctx, r.db, me, r.opts.Queue, p)
				return err
			})
		})
		if err != nil {
			return fmt.Errorf("partition: acquiring part %d of %q: %w", p, r.opts.Queue, store.Classify(err))
		}
		if acquired {
			r.mu.Lock()
			r.owned[p] = r.newPartLocked()
			r.mu.Unlock()
			r.acquired.Add(1)
			r.log.Debug("part acquired", zap.Int("part", p))
			r.signalChanged()
		} else {
			pending = true
		}
	}
	r.pending.Store(pending)
	r.rebalances.Add(1)
	return nil
}

// divide computes the target assignment of a queue's n parts among its live
// members. Members that did not join the queue (sessions of code older than
// queue membership, counted because they own parts) divide parts by rules
// of their own, which this session cannot predict: they keep exactly the
// parts they hold, and strategy divides the other parts among the joined
// members. Leaving such a session a part it would not take could leave the
// part without an owner for ever; this way every part is held by an old
// session or targeted by a joined one. Without such sessions it is
// strategy(prev, joined, n).
func divide(strategy Strategy, prev map[uuid.UUID][]int, live, joined []uuid.UUID, n int) map[uuid.UUID][]int {
	pinned := map[uuid.UUID]bool{}
	for _, s := range live {
		if !slices.Contains(joined, s) {
			pinned[s] = true
		}
	}
	if len(pinned) == 0 {
		return strategy(prev, joined, n)
	}
	out := map[uuid.UUID][]int{}
	held := map[int]bool{}
	for s := range pinned {
		for _, p := range prev[s] {
			if p < n {
				held[p] = true
				out[s] = append(out[s], p)
			}
		}
	}
	// The other parts, renumbered 0..len(rest)-1 for the strategy.
	var rest []int
	pos := map[int]int{}
	for p := range n {
		if !held[p] {
			pos[p] = len(rest)
			rest = append(rest, p)
		}
	}
	mapped := map[uuid.UUID][]int{}
	for s, ps := range prev {
		if pinned[s] {
			continue
		}
		for _, p := range ps {
			if i, ok := pos[p]; ok {
				mapped[s] = append(mapped[s], i)
			}
		}
	}
	for s, idx := range strategy(mapped, joined, len(rest)) {
		for _, i := range idx {
			out[s] = append(out[s], rest[i])
		}
	}
	for _, ps := range out {
		slices.Sort(ps)
	}
	return out
}

// withDB runs fn while no other statement of the rebalancer runs, so that a
// rebalancer holds at most one connection of the pool at a time.
func (r *Rebalancer) withDB(fn func() error) error {
	r.dbMu.Lock()
	defer r.dbMu.Unlock()
	return fn()
}

// owners reads the current owner of every owned part of the queue.
func (r *Rebalancer) owners(ctx context.Context) (map[int]uuid.UUID, error) {
	var out map[int]uuid.UUID
	err := retry.Do(ctx, func() { r.retries.Add(1) }, func(ctx context.Context) error {
		var err error
		out, err = r.store.PartsOwners(ctx, r.db, r.opts.Queue)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("partition: reading the owners of %q: %w", r.opts.Queue, store.Classify(err))
	}
	return out, nil
}

// giveUp waits for the part's in-flight items (at most DrainTimeout), then
// deletes its row, which releases any claims still in it.
func (r *Rebalancer) giveUp(ctx context.Context, p int, st *part) {
	defer r.drain.Done()
	idle := st.idle
	start := time.Now()
	timer := time.NewTimer(r.opts.DrainTimeout)
	defer timer.Stop()
	select {
	case <-idle:
	case <-timer.C:
		r.log.Warn("drain timeout: releasing part with items in flight", zap.Int("part", p), zap.Duration("waited", r.opts.DrainTimeout))
		if r.opts.OnDrainTimeout != nil {
			r.mu.Lock()
			ownership := Hold{Part: p, epoch: st.epoch}
			r.mu.Unlock()
			r.opts.OnDrainTimeout(ownership)
			grace := time.NewTimer(r.opts.DrainTimeout / 4)
			defer grace.Stop()
			select {
			case <-idle:
			case <-grace.C:
			case <-ctx.Done():
				return
			}
		}
	case <-ctx.Done():
		return // the session is ending; closing it releases the part
	}
	err := r.withDB(func() error {
		return retry.Do(ctx, func() { r.retries.Add(1) }, func(ctx context.Context) error {
			return r.store.PartsRelease(ctx, r.db, r.sess.ID(), r.opts.Queue, p)
		})
	})
	if err != nil {
		r.log.Warn("releasing part failed; the next poll retries", zap.Int("part", p), zap.Error(err))
		r.mu.Lock()
		if r.owned[p] == st {
			st.draining = false // let the next poll decide again
		}
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	if r.owned[p] == st {
		delete(r.owned, p)
	}
	r.mu.Unlock()
	r.released.Add(1)
	r.log.Debug("part released", zap.Int("part", p), zap.Duration("drained_in", time.Since(start)))
}
