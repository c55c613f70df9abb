package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// One goroutine per item (docs/performance.md, "Client cost per item").
//
// Each claimed item runs on one goroutine, its handler's, which then
// settles it. What an attempt would otherwise spend per item — a second
// goroutine to wait for the handler, a context with a timer for its
// timeout, a context with a timer per settle try — is kept per session
// instead:
//
//   - the handler's deadline: items claimed within a short window share one
//     context with a deadline (a deadlineBucket, one timer), the parent of
//     their item contexts, so that a handler's context ends with
//     context.DeadlineExceeded at its deadline as before; the shared
//     deadline is the latest of theirs, at most bucketWindow later than
//     ItemTimeout after the handler's start; an item with a timeout of its
//     own (claim.Item.Timeout) gets a bucket of its own (ownBucket), and
//     the supervisor keeps its list in the order of the deadlines;
//   - abandonment: the session's supervisor, one goroutine with one timer,
//     abandons a handler that has not returned HangGrace after its context
//     ended (at its deadline, when its claim was lost or it was cancelled,
//     or when the session's handlers were cancelled), settles its item on a
//     goroutine of its own and frees its slot, as attempt.Run does;
//   - settle tries: the settle goroutines (acker) bound each try themselves
//     (attempt.TryBounder), with one context per transaction.

// bucketWindow returns how much later than its own deadline a handler's
// context may end: its items share one context with a deadline while they
// start within this window. A thousandth of the item timeout, at most 5 ms.
func bucketWindow(timeout time.Duration) time.Duration {
	return min(timeout/1000, 5*time.Millisecond)
}

// deadlineBucket is a context with a deadline that the items of a session
// claimed within bucketWindow of each other share as their parent. It is
// cancelled (its timer stopped) once the claim loop has moved on to a newer
// bucket and its last item has ended.
type deadlineBucket struct {
	ctx      context.Context
	cancel   context.CancelFunc
	deadline time.Time
	// refs counts its items not yet ended, plus one while it is the claim
	// loop's current bucket.
	refs atomic.Int64
}

// release drops one reference to b, cancelling it with the last.
func (b *deadlineBucket) release() {
	if b.refs.Add(-1) == 0 {
		b.cancel()
	}
}

// bucketFor returns the bucket for an item whose handler starts at now
// (with a reference taken for it): the current one if its deadline is
// within the window after now + ItemTimeout, a new one otherwise.
func (r *sessionRun) bucketFor(now time.Time) *deadlineBucket {
	want := now.Add(r.w.opts.ItemTimeout)
	if b := r.bucket; b != nil && !b.deadline.Before(want) {
		b.refs.Add(1)
		return b
	}
	if r.bucket != nil {
		r.bucket.release()
	}
	b := &deadlineBucket{deadline: want.Add(bucketWindow(r.w.opts.ItemTimeout))}
	b.ctx, b.cancel = context.WithDeadline(r.handlerCtx, b.deadline)
	b.refs.Store(2)
	r.bucket = b
	return b
}

// ownBucket returns a bucket of its own (with the one reference of its
// item) for an item whose handler starts at now and has its own timeout d
// (claim.Item.Timeout, other than ItemTimeout): one timer per such item.
func (r *sessionRun) ownBucket(now time.Time, d time.Duration) *deadlineBucket {
	b := &deadlineBucket{deadline: now.Add(d)}
	b.ctx, b.cancel = context.WithDeadline(r.handlerCtx, b.deadline)
	b.refs.Store(1)
	return b
}

// job is one claimed item, from its claim to the end of its settling: its
// flight (the session's record of it), its context, its attempt, and its
// place in the supervisor's list. One allocation holds it all.
type job struct {
	r  *sessionRun
	fl flight
	// ctx is the item's context, the parent of its handler's: its bucket's
	// child, cancelled with a cause when its claim is lost or it is
	// cancelled (fl.cancel), and when the item ends.
	ctx    context.Context
	bucket *deadlineBucket
	// hold is the part hold its end gives back (parts mode).
	hold partition.Hold
	// admitted: the limits let it run; otherwise it is given back.
	admitted bool
	// start is when its handler started, since monoBase (with an Observer
	// only; atomic: an abandonment reads it from another goroutine).
	start atomic.Int64
	// took is how long its handler ran (with an Observer only).
	took time.Duration
	a    attempt.Inline

	// state is jobRunning until its handler returns (jobReturned) or the
	// supervisor abandons it (jobAbandoned), whichever comes first.
	state atomic.Int32
	// counted is closed once an abandoned job is counted as abandoned.
	counted chan struct{}
	// Under the supervisor's mu: when the supervisor abandons it, and its
	// neighbours in the supervisor's list (linked while in it).
	abandonAt  time.Time
	prev, next *job
	linked     bool
}

// monoBase is the origin of job.start (a monotonic clock reading).
var monoBase = time.Now()

const (
	jobRunning int32 = iota
	jobReturned
	jobAbandoned
)

// runJob runs j's handler and settles its item, on j's goroutine; it
// frees j's slot unless the supervisor abandoned j first (then the
// supervisor's goroutine does).
func (r *sessionRun) runJob(j *job) {
	w := r.w
	it := &j.fl.item
	if !j.admitted {
		w.giveBack(j.ctx, r.settleCtx, *it, r.a, r.log)
		r.finish(j)
		return
	}
	o := r.attemptOpts // what every item of the session shares (see itemOptions)
	if w.opts.Observer != nil {
		j.start.Store(int64(time.Since(monoBase)))
	}
	if j.state.Load() == jobRunning { // not abandoned before it started
		j.a.Call(o.handler, *it)
	}
	if !r.sup.returned(j) {
		// Abandoned meanwhile: its item was settled without it.
		<-j.counted
		w.abandonedRunning.Add(-1)
		w.running.Add(-1)
		return
	}
	if w.opts.Observer != nil {
		j.took = time.Since(monoBase) - time.Duration(j.start.Load())
	}
	if o.logs {
		// Lazily: the fields are encoded only if the attempt logs.
		o.Log = r.log.WithLazy(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.Int("attempt", it.Attempt))
	}
	// An ack is only asked here: the settle goroutine that commits it
	// ends the job (AckAnswered), and this goroutine ends now.
	if res := j.a.Start(w.queue, it, &o.Options, r.fl.parentCause(&j.fl), j); res != nil {
		r.end(j, res)
	}
}

// AckAnswered ends j once the first try of its ack is answered, on the
// settle goroutine that answered it (attempt.AckWaiter); the rare failed
// try goes on (retries, a nack) on a goroutine of its own.
func (j *job) AckAnswered(err error) {
	if j.a.Answered(err) {
		j.r.end(j, j.a.Result())
		return
	}
	go func() { j.r.end(j, j.a.Continue()) }()
}

// end ends j, whose attempt is over with res.
func (r *sessionRun) end(j *job, res *attempt.Result) {
	r.report(j, res, j.took)
	r.w.running.Add(-1)
	r.finish(j)
}

// abandonJob settles the item of j, whose handler the supervisor abandoned,
// on a goroutine of its own, and frees its slot.
func (r *sessionRun) abandonJob(j *job) {
	w := r.w
	it := &j.fl.item
	o := r.attemptOpts
	if o.logs {
		o.Log = r.log.WithLazy(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.Int("attempt", it.Attempt))
	}
	res := j.a.Abandon(w.queue, it, &o.Options, r.fl.parentCause(&j.fl))
	var took time.Duration
	if w.opts.Observer != nil {
		took = time.Since(monoBase) - time.Duration(j.start.Load()) // it has not returned
	}
	r.report(j, res, took)
	w.abandoned.Add(1)
	w.abandonedRunning.Add(1)
	close(j.counted)
	r.finish(j)
}

// report counts what j's attempt did and tells the Observer.
func (r *sessionRun) report(j *job, res *attempt.Result, took time.Duration) {
	w := r.w
	if res.Panicked {
		w.panics.Add(1)
	}
	if res.TimedOut {
		w.timeouts.Add(1)
	}
	if ko := w.kindObs; ko != nil {
		ko.KindHandlerDone(HandlerRun{Queue: w.name, Kind: j.fl.item.Kind, Registered: j.a.KindKnown(), Took: took, Outcome: res.Outcome})
	} else if obs := w.opts.Observer; obs != nil {
		obs.HandlerDone(w.name, took, res.Outcome)
	}
	if res.Unknown && res.Outcome == claim.Unsettled {
		w.unknown.Add(1)
	}
	if res.Outcome == claim.Dropped {
		w.dropped.Add(1)
	}
}

// finish ends j: its tenant's count, its flight, its context and its
// bucket reference, then its slot.
func (r *sessionRun) finish(j *job) {
	w := r.w
	if j.admitted {
		r.lim.done(j.fl.item.Tenant)
	}
	r.fl.done(j.fl.item.ID)
	j.fl.cancel(nil)
	j.bucket.release()
	<-r.slots
	select {
	case r.freed <- struct{}{}:
	default:
	}
	w.inflight.Add(-1)
	r.handlers.Done()
	if r.reb != nil {
		r.reb.Done(j.hold)
	}
}

// supervisor abandons a session's handlers that have not returned HangGrace
// after their contexts ended, with one goroutine and one timer: its list
// holds the running handlers in the order of their deadlines (they share
// ItemTimeout, so the order of their starts), early those whose contexts
// ended before their deadlines (a lost claim, a cancel), and the end of the
// session's handler context abandons all of them HangGrace later.
type supervisor struct {
	mu         sync.Mutex
	head, tail *job
	early      []*job
	// endAt is HangGrace after the session's handler context ended; zero
	// while it is live.
	endAt time.Time
	// stopping: the claim loop has ended (nothing is added any more); the
	// goroutine ends once the list is empty and the handler context ended.
	stopping bool
	kick     chan struct{}
	grace    time.Duration
	// abandon settles an abandoned job's item (on its own goroutine).
	abandon func(*job)
}

func newSupervisor(grace time.Duration, abandon func(*job)) *supervisor {
	return &supervisor{grace: grace, abandon: abandon, kick: make(chan struct{}, 1)}
}

func (s *supervisor) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// add supervises the handlers of js, started now, whose deadlines are
// their buckets'. The list stays in the order of the deadlines: a handler
// with the worker's ItemTimeout goes to the tail (behind the others of the
// same timeout) unless items with longer timeouts of their own
// (claim.Item.Timeout) are there, which it passes.
func (s *supervisor) add(js []*job) {
	if len(js) == 0 {
		return
	}
	s.mu.Lock()
	oldHead := s.head
	for _, j := range js {
		j.abandonAt = j.bucket.deadline.Add(s.grace)
		after := s.tail // the job j goes after (nil: at the head)
		for after != nil && after.abandonAt.After(j.abandonAt) {
			after = after.prev
		}
		j.linked, j.prev = true, after
		if after != nil {
			j.next, after.next = after.next, j
		} else {
			j.next, s.head = s.head, j
		}
		if j.next != nil {
			j.next.prev = j
		} else {
			s.tail = j
		}
	}
	newHead := s.head != oldHead
	s.mu.Unlock()
	if newHead {
		s.wake() // an earlier deadline than the one the supervisor waits for
	}
}

// unlink removes j from the list; s.mu is held.
func (s *supervisor) unlink(j *job) {
	if !j.linked {
		return
	}
	if j.prev != nil {
		j.prev.next = j.next
	} else {
		s.head = j.next
	}
	if j.next != nil {
		j.next.prev = j.prev
	} else {
		s.tail = j.prev
	}
	j.prev, j.next, j.linked = nil, nil, false
}

// returned records that j's handler returned, and reports whether it did
// so before the supervisor abandoned it.
func (s *supervisor) returned(j *job) bool {
	if !j.state.CompareAndSwap(jobRunning, jobReturned) {
		return false
	}
	s.mu.Lock()
	s.unlink(j)
	s.mu.Unlock()
	return true
}

// ended records that j's context ended at now before its deadline: it is
// abandoned HangGrace later if its handler has not returned.
func (s *supervisor) ended(j *job, now time.Time) {
	s.mu.Lock()
	if j.linked && now.Add(s.grace).Before(j.abandonAt) {
		j.abandonAt = now.Add(s.grace)
		s.early = append(s.early, j)
	}
	s.mu.Unlock()
	s.wake()
}

// run supervises until it is stopping, the handler context (handlers) has
// ended and no handler is left.
func (s *supervisor) run(handlers context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	sessionDone := handlers.Done()
	for {
		select {
		case <-s.kick:
		case <-t.C:
		case <-sessionDone:
			sessionDone = nil
			s.mu.Lock()
			s.endAt = time.Now().Add(s.grace)
			s.mu.Unlock()
		}
		next, done := s.sweep(time.Now())
		if done {
			return
		}
		t.Stop()
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
	}
}

// sweep abandons the handlers due at now and returns when the next is due
// (zero: none), and whether the supervisor is done.
func (s *supervisor) sweep(now time.Time) (next time.Time, done bool) {
	var due []*job
	s.mu.Lock()
	take := func(j *job) {
		j.counted = make(chan struct{})
		if j.state.CompareAndSwap(jobRunning, jobAbandoned) {
			due = append(due, j)
		}
		s.unlink(j)
	}
	all := !s.endAt.IsZero() && !now.Before(s.endAt)
	for s.head != nil && (all || !now.Before(s.head.abandonAt)) {
		take(s.head)
	}
	early := s.early[:0]
	for _, j := range s.early {
		switch {
		case !j.linked:
		case !now.Before(j.abandonAt):
			take(j)
		default:
			early = append(early, j)
			if next.IsZero() || j.abandonAt.Before(next) {
				next = j.abandonAt
			}
		}
	}
	clear(s.early[len(early):])
	s.early = early
	if s.head != nil && (next.IsZero() || s.head.abandonAt.Before(next)) {
		next = s.head.abandonAt
	}
	if !s.endAt.IsZero() && now.Before(s.endAt) && s.head != nil && (next.IsZero() || s.endAt.Before(next)) {
		next = s.endAt
	}
	done = s.stopping && !s.endAt.IsZero() && s.head == nil
	s.mu.Unlock()
	for _, j := range due {
		go s.abandon(j)
	}
	return next, done
}

// stop tells the supervisor that nothing more is added: it ends once the
// session's handler context has ended and no handler is left.
func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wake()
}
