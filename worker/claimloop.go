package worker

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/wake"
	"github.com/crdbwork/crdbwork/partition"
)

// claimLoop claims while there are free handler slots, until claimCtx
// ends, and starts a handler for each claimed item.
//
// While the queue has a backlog (the last claim came back full), the loop
// claims when half of the slots are free, or GatherWait after the first
// one freed, rather than for each slot as it frees: a claim then takes
// several items, and the database runs a fraction of the claim statements,
// at the cost of a few milliseconds of idle slots.
func (r *sessionRun) claimLoop() {
	w, ctx, log := r.w, r.claimCtx, r.log
	sess, reb, fl, lim, slots := r.sess, r.reb, r.fl, r.lim, r.slots
	gather := max(1, cap(slots)/2)
	backlog := false
	limitLogged := false
	forgotten := false // a claim's outcome was unknown: release what it may have taken first
	// hints are the parts the wake-ups since the last claim named (see
	// partHints); the next claim in parts mode reads only those it owns.
	var hints partHints
	// failed counts the claims (or releases of forgotten items) in a row
	// that failed: the next is tried within claimRetryWait(failed), not a
	// whole poll interval later, for the items a wake-up announced may be
	// waiting for that claim (with a long Poll, for minutes).
	failed := 0
	// changed is signalled when the rebalancer gained parts or read a new
	// number of parts (nil without parts: never).
	var changed <-chan struct{}
	if reb != nil {
		changed = reb.Changed()
	}
	// sessChanged is signalled when the session's heartbeat saw its
	// queue's change marker move (without parts: a peer's deletion
	// released its claims; in parts mode its parts move, which changed
	// says).
	var sessChanged <-chan struct{}
	if reb == nil {
		sessChanged = sess.Changes()
	}
	// look is when the first unclaimed item of the session's parts vests,
	// as far as the loop knows (see Options.ListenPoll); stale once
	// something happened since.
	look := idleLook{stale: true}
	pause := func() bool {
		l := &look
		if w.maint.ClaimsSequenced() {
			l = nil // a key's next item waits for acks no notification announces
		}
		wait, idled := w.idleWait(l)
		defer idled()
		if failed > 0 {
			wait = min(wait, claimRetryWait(failed))
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		// In a sequenced queue an item that ends may unblock its key's
		// next item: claim again then (docs/sequences.md). Nil otherwise:
		// never.
		var ended chan struct{}
		if w.maint.ClaimsSequenced() || w.listenLong {
			// Also while the listener may let the loop wait ListenPoll: an
			// item that ended may have been nacked or snoozed, to vest
			// later without a notification; the look after the claim
			// finds when.
			ended = r.freed
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			hints.add(nil)
			return true
		case <-ended:
			hints.add(nil)
			look.stale = true
			return true
		case <-sessChanged:
			hints.add(nil)
			look.stale = true
			return true
		case <-changed:
			// Parts gained, or a new number of parts: the wake-ups of
			// their items may have come before (and been spent on a
			// claim that could not read them), so claim in every part.
			hints.add(nil)
			look.stale = true
			return true
		case <-w.wake: // nil with NoWake: never
			// Items were enqueued (a wake-up that came during the last
			// claim is kept until here: its items may have committed
			// after that claim looked).
			w.wakeups.Add(1)
			look.stale = true
			// The part of an item is its key hash modulo the queue's
			// number of parts; if SetParts changed that number since the
			// last rebalance, a hint may name the wrong part: the next
			// rebalance reads the new number and signals changed.
			hashes, ok := w.wakeSub.Hints()
			var parts map[int]bool
			if ok && reb != nil {
				if n := reb.NumParts(); n > 0 {
					parts = make(map[int]bool, len(hashes))
					for _, h := range hashes {
						parts[int(h%int64(n))] = true
					}
				}
			}
			hints.add(parts)
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
					failed++
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
			r.waitFree(gather)
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
		if r.pace != nil && free > 0 {
			r.pace.wait(ctx, free, r.reb.Owned) // fairness across the fleet: see fairPace
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
			hinted := hints.take()
			pl = lim.plan(claimedAt, free, parts)
			var urgent []claim.Item
			if w.opts.UrgentLane && pl.n > 0 {
				// Items of limited tenants only from the session's own
				// parts: their owner alone enforces a tenant's limit.
				all, limited := lim.laneTenants()
				urgent, err = w.queue.Claimer(sess.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: pl.n, MaxPriority: w.opts.UrgentPriority,
					SkipTenants: pl.skip, OwnedParts: parts, AllTenantsLimited: all, LimitedTenants: limited, Lease: w.lease})
			}
			claimParts := parts
			// A fair queue's claims read every owned part: a claim of the
			// hinted parts alone would take their turns far ahead of the
			// session's other parts (a tenant's items are spread over
			// the parts by turn), which is what the pacing bounds.
			if hinted != nil && (r.pace == nil || !r.pace.isFair(ctx)) {
				claimParts = slices.DeleteFunc(slices.Clone(parts), func(p int) bool { return !hinted[p] })
			}
			if err == nil && len(urgent) < pl.n && len(claimParts) > 0 {
				rest := pl
				rest.n -= len(urgent)
				items, err = w.claim(ctx, sess, claimParts, rest)
			}
			items = append(urgent, items...)
			if r.pace != nil {
				r.pace.claimed(items)
			}
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
		switch {
		case err == nil:
			failed = 0
		case ctx.Err() == nil:
			failed++
			logged := err
			if failed == 1 {
				// Refused for lack of a privilege: say what the user lacks
				// (the first of the failures in a row).
				logged = w.explainRefusal(ctx, err)
			}
			log.Warn("claim failed; claiming again soon", zap.Error(logged), zap.Int("failures_in_a_row", failed))
		}
		if errors.Is(err, claim.ErrOutcomeUnknown) {
			forgotten = true
		}
		if len(items) > 0 && w.opts.Testing.OnClaim != nil {
			w.opts.Testing.OnClaim(ctx, items)
		}
		if h := w.opts.Testing.AfterIdleClaim; h != nil && len(items) == 0 && free > 0 && ctx.Err() == nil {
			h(err)
		}
		bound := claimedAt.Add(w.opts.ItemTimeout + w.opts.HangGrace + settleGrace)
		if len(items) > 0 {
			// One allocation per item (its job) besides its context and
			// goroutine; the handlers' deadlines from now (see job.go).
			now := time.Now()
			jobs, running := r.jobs[:0], r.running[:0]
			for i := range items {
				j := &job{r: r, fl: flight{item: items[i], started: claimedAt, bound: bound}}
				j.fl.job = j
				j.admitted = lim.admit(claimedAt, items[i].Tenant)
				if d := items[i].Timeout; d > 0 && d != w.opts.ItemTimeout {
					// Its own timeout (claim.NewItem.Timeout): its own
					// deadline, and a lease extended up to its own bound.
					j.fl.bound = claimedAt.Add(d + w.opts.HangGrace + settleGrace)
					j.bucket = r.ownBucket(now, d)
				} else {
					j.bucket = r.bucketFor(now)
				}
				j.ctx, j.fl.cancel = context.WithCancelCause(j.bucket.ctx)
				j.a.Context(j.ctx, w.queue, &j.fl.item) // before the supervisor may abandon it
				if w.opts.Observer != nil {
					j.start.Store(int64(now.Sub(monoBase))) // its goroutine's start, if abandoned before it runs
				}
				if reb != nil {
					j.hold = holds[i]
				}
				jobs = append(jobs, j)
				if j.admitted {
					running = append(running, j)
				}
			}
			fl.addJobs(jobs)
			r.sup.add(running)
			for _, j := range jobs {
				slots <- struct{}{}
				r.handlers.Add(1)
				w.inflight.Add(1)
				w.running.Add(1)
				go r.runJob(j)
			}
			clear(jobs)
			clear(running)
			r.jobs, r.running = jobs[:0], running[:0]
		}
		hints.take() // one claim per wake-up's hint
		backlog = err == nil && len(items) == free && free > 0
		if backlog {
			continue // a full batch: there is probably more
		}
		if free > 0 && err == nil && (pl.full || pl.wait > 0) && len(items) == pl.n {
			// Held back by the limits, not by an empty queue: claim again
			// when an item ends or a token comes.
			if !w.limitWait(ctx, r.freed, pl) {
				return
			}
			continue
		}
		if len(items) > 0 {
			look.stale = true // their nacks may push them out
		} else if err == nil && free > 0 && w.listenLong && look.needed(w.opts.ListenPoll) && wake.Listening(w.channel) &&
			!w.maint.ClaimsSequenced() {
			var parts []int
			if reb != nil {
				parts = reb.Owned()
			}
			w.readIdleLook(ctx, &look, parts)
		}
		if !pause() {
			return
		}
	}
}

// partHints are the parts that the pauses of a claim loop since its last
// claim named: after a wake-up that named the key hashes of the items it
// announced, their parts, so that the claim reads only those it owns
// (fewer branches, and none at all when another session owns them). A
// pause that ended otherwise (its poll, a freed key, parts gained, a
// wake-up for any part) stands for every part. Several pauses may come
// before one claim (a failed release of forgotten items repeats them):
// their parts add up, and one that stands for every part makes it every
// part.
type partHints struct {
	parts map[int]bool // nil: every part
	set   bool         // a pause since the last take
}

// add records a pause that named parts (nil: every part).
func (h *partHints) add(parts map[int]bool) {
	switch {
	case !h.set:
		h.parts = parts
	case h.parts == nil || parts == nil:
		h.parts = nil
	default:
		maps.Copy(h.parts, parts)
	}
	h.set = true
}

// take returns the parts to claim in (nil: every part) and forgets them.
func (h *partHints) take() map[int]bool {
	parts := h.parts
	*h = partHints{}
	return parts
}

// Bounds of the wait before claiming again after a failed claim: it
// doubles with each failure in a row, from claimRetryMin to claimRetryMax
// (each drawn between half and one and a half of it), or is the poll
// interval's wait if that is shorter.
const (
	claimRetryMin = 100 * time.Millisecond
	claimRetryMax = 2 * time.Second
)

// claimRetryWait returns the wait before the claim that follows failed
// failures in a row.
func claimRetryWait(failed int) time.Duration {
	d := claimRetryMax
	if failed < 6 {
		d = min(claimRetryMax, claimRetryMin<<(failed-1))
	}
	return d/2 + rand.N(d+1)
}

// waitFree waits until n slots are free, GatherWait has passed or claimCtx
// ends.
func (r *sessionRun) waitFree(n int) {
	t := time.NewTimer(r.w.opts.GatherWait)
	defer t.Stop()
	for cap(r.slots)-len(r.slots) < n {
		select {
		case <-r.freed:
		case <-t.C:
			return
		case <-r.claimCtx.Done():
			return
		}
	}
}
