package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// Leases. Every claim takes a lease (claim.Options.Lease, by the database
// clock): an item neither acked, nacked, released nor extended within it is
// released by any session's reaper (queuemaint.Queue.Reap), so a live session
// can hold an item it forgot — a claim whose answer was lost, a bug — for at
// most its lease. Unless the queue sets one (claim.Options.Lease), the
// worker chooses the lease so that the common case costs no statement beyond
// the claim and the ack, and passes it with each claim
// (claim.ClaimRequest.Lease):
//
//	lease = min(ItemTimeout, leaseCap) + HangGrace + settleGrace
//
// A handler that runs past half of its lease has it extended, with the
// other such items of the session in one statement per heartbeat
// (claim.Claimer.Extend), but never past the item's own bound: the handler's
// start + ItemTimeout + HangGrace + settleGrace. So a hung handler's lease
// is not extended forever (and the worker abandons it at ItemTimeout +
// HangGrace anyway).
const (
	// leaseCap bounds the ItemTimeout part of the default lease: handlers
	// of a few minutes are extended rather than an hour-long lease taken
	// for every item.
	leaseCap = 2 * time.Minute
	// settleGrace is the part of the lease left for the ack, nack or
	// release after the handler, retries through a short outage included.
	settleGrace = 30 * time.Second
)

// defaultLease returns the lease of a worker with opts (defaults filled in)
// on a queue whose Options.Lease is zero.
func defaultLease(o Options) time.Duration {
	return min(o.ItemTimeout, leaseCap) + o.HangGrace + settleGrace
}

// flight is one claimed item of the session, from its claim to the end of
// its settling.
type flight struct {
	item     claim.Item
	started  time.Time // just before the claim statement, by this process's clock
	leaseEnd time.Time // a conservative estimate of its lease's end, by this process's clock
	bound    time.Time // the latest its lease may be extended to
	cancel   context.CancelCauseFunc
	// cancelAsked is set once the handler was cancelled for a cancel
	// request.
	cancelAsked bool
	// job is the item's job (nil for flights added with add); cause is the
	// first cause its context was cancelled with while the session's
	// handler context was live (a cancel request, a lost claim).
	job   *job
	cause error
}

// flights are a session's claimed items.
type flights struct {
	mu    sync.Mutex
	lease time.Duration
	m     map[uuid.UUID]*flight
	// parent is the session's handler context, the parent of the items'
	// contexts; sup, if not nil, abandons the handlers of the items whose
	// contexts end early. Set before the first item is added.
	parent context.Context
	sup    *supervisor
}

func newFlights(lease time.Duration) *flights {
	return &flights{lease: lease, m: map[uuid.UUID]*flight{}}
}

// add records a claimed item; its handler's context is cancelled with
// errLeaseLost if an extension finds its claim gone.
func (f *flights) add(it claim.Item, claimedAt time.Time, bound time.Time, cancel context.CancelCauseFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[it.ID] = &flight{item: it, started: claimedAt, leaseEnd: claimedAt.Add(f.lease), bound: bound, cancel: cancel}
}

// addJobs records the claimed items of js (their flights filled in but
// for the lease's end), in one lock.
func (f *flights) addJobs(js []*job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, j := range js {
		j.fl.leaseEnd = j.fl.started.Add(f.lease)
		f.m[j.fl.item.ID] = &j.fl
	}
}

// end cancels fl's handler with cause; f.mu is held. The first cause that
// comes while the session's handler context is live is kept for the
// attempt (parentCause), and the supervisor abandons the handler HangGrace
// later if it has not returned.
func (f *flights) end(fl *flight, cause error) {
	if fl.cause == nil && (f.parent == nil || f.parent.Err() == nil) {
		fl.cause = cause
	}
	fl.cancel(cause)
	if fl.job != nil && f.sup != nil {
		f.sup.ended(fl.job, time.Now())
	}
}

// parentCause returns the cause of the end of j's context other than its
// deadline: the cause it was cancelled with (end), else the cause of the
// session's handler context; nil if neither ended.
func (f *flights) parentCause(fl *flight) error {
	if fl.job != nil && fl.job.ctx.Err() == nil {
		return nil // end sets the cause before it cancels
	}
	f.mu.Lock()
	c := fl.cause
	f.mu.Unlock()
	if c == nil && f.parent != nil {
		c = context.Cause(f.parent)
	}
	return c
}

// done forgets an item once it is settled (or given up).
func (f *flights) done(id uuid.UUID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, id)
}

// ids returns the ids of the items held.
func (f *flights) ids() []uuid.UUID {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]uuid.UUID, 0, len(f.m))
	for id := range f.m {
		out = append(out, id)
	}
	return out
}

// errLeaseLost is the cause of a handler's context cancelled because its
// item's claim was found gone when its lease was to be extended.
var errLeaseLost = errors.New("the item's claim was lost (its lease was reaped, or it was released or cancelled)")

// extension is one statement's worth of lease extensions.
type extension struct {
	items []claim.Item
	d     time.Duration
}

// due returns the extensions to make now: the items whose leases are past
// half, extended by a full lease — in one statement — except those whose
// bound comes sooner, which are extended (in a second statement, rare: a
// handler near its ItemTimeout) only up to the nearest of their bounds, and
// only those that this lengthens. An item at its bound is not extended.
func (f *flights) due(now time.Time) []extension {
	f.mu.Lock()
	defer f.mu.Unlock()
	full := extension{d: f.lease}
	var near []*flight
	nearD := f.lease
	for _, fl := range f.m {
		// An at-most-once item has no claim left to extend: its claim
		// deleted it.
		if fl.item.AtMostOnce || now.Before(fl.leaseEnd.Add(-f.lease/2)) || !fl.leaseEnd.Before(fl.bound) {
			continue
		}
		if left := fl.bound.Sub(now); left >= f.lease {
			full.items = append(full.items, fl.item)
		} else if left >= time.Millisecond {
			near = append(near, fl)
			nearD = min(nearD, left)
		}
	}
	var out []extension
	if len(full.items) > 0 {
		out = append(out, full)
	}
	short := extension{d: nearD}
	for _, fl := range near {
		if fl.leaseEnd.Before(now.Add(nearD)) {
			short.items = append(short.items, fl.item)
		}
	}
	if len(short.items) > 0 {
		out = append(out, short)
	}
	return out
}

// extended records the outcome of an extension of items sent at sent by d:
// the items in kept are held until sent+d; the others lost their claims,
// and are returned: their handlers are to be cancelled (lose).
func (f *flights) extended(items, kept []claim.Item, sent time.Time, d time.Duration) (lost []claim.Item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, it := range items {
		fl := f.m[it.ID]
		if fl == nil || fl.item.Token != it.Token {
			continue // settled meanwhile
		}
		if slices.ContainsFunc(kept, func(k claim.Item) bool { return k.ID == it.ID }) {
			fl.leaseEnd = sent.Add(d)
			continue
		}
		lost = append(lost, it)
	}
	return lost
}

// lose cancels the handlers of items whose claims were found lost, with
// errLeaseLost (a handler already cancelled keeps its first cause: a
// cancel request found just before).
func (f *flights) lose(items []claim.Item) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, it := range items {
		if fl := f.m[it.ID]; fl != nil && fl.item.Token == it.Token {
			f.end(fl, errLeaseLost)
		}
	}
}

// givenUp cancels, with attempt.ErrGivenUp, the handlers of the items
// claimed in a part ownership the session gives up because its drain
// timed out (partition.Options.OnDrainTimeout).
func (f *flights) givenUp(ownership partition.Hold) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fl := range f.m {
		if fl.job != nil && fl.job.hold == ownership {
			f.end(fl, attempt.ErrGivenUp)
		}
	}
}

// extendLeases extends the leases that are due of the items fl holds for
// the session sessID, in one statement (two when some item nears its
// bound).
func (w *Worker) extendLeases(ctx context.Context, sessID uuid.UUID, fl *flights, log *zap.Logger) {
	sent := time.Now()
	for _, e := range fl.due(sent) {
		kept, err := w.queue.Claimer(sessID).Extend(ctx, e.items, e.d)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("extending leases failed; the next heartbeat tries again", zap.Int("items", len(e.items)), zap.Error(err))
			}
			return
		}
		w.extended.Add(int64(len(kept)))
		if lost := fl.extended(e.items, kept, sent, e.d); len(lost) > 0 {
			// A cancel request moves the claim's token on, which fails the
			// extension: look for requests first, so that their handlers
			// see the cancel as their cause.
			w.checkCancels(ctx, sessID, fl, log)
			fl.lose(lost)
			log.Warn("items lost their claims while their handlers ran: cancelling them", zap.Int("items", len(lost)))
		}
	}
}

// releaseForgotten releases the items the session holds in the database
// but not in fl (taken by a claim whose answer was lost).
func (w *Worker) releaseForgotten(ctx context.Context, sessID uuid.UUID, fl *flights, log *zap.Logger) error {
	n, err := w.queue.Claimer(sessID).ReleaseForgotten(ctx, fl.ids())
	if err != nil {
		return fmt.Errorf("releasing the items of a claim whose outcome is unknown: %w", err)
	}
	w.forgotten.Add(int64(n))
	if n > 0 {
		log.Info("released the items of a claim whose answer was lost", zap.Int("items", n))
	}
	return nil
}
