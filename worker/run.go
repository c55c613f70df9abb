package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// sessionRun is what the loops of one session share: the session and its
// rebalancer, its claimed items, its share of the queue's limits, its
// settle goroutines, its handler slots, and the contexts that bound its
// claims, handlers and settles. runSession builds it; its claim loop
// (claimLoop), its handlers (handle) and its maintenance loop (maintain)
// are its methods.
type sessionRun struct {
	w    *Worker
	sess *session.Session
	log  *zap.Logger // the worker's, with the session's id
	// reb gives the session its parts; nil without parts.
	reb *partition.Rebalancer
	// pace keeps the session's claims in a fair queue within a few claims
	// of the queue's head; nil without parts.
	pace *fairPace
	// attemptOpts are the attempt options its items share.
	attemptOpts itemOptions
	// fl holds the session's claimed items, for lease extensions and
	// releases after a claim whose answer was lost.
	fl *flights
	// lim enforces the session's share of the queue's limits.
	lim *limiter
	// a acks, nacks and releases the items on the settle goroutines.
	a *acker
	// slots holds one token per running handler (capacity Concurrency);
	// freed is signalled (without blocking) when a handler gives its slot
	// back.
	slots, freed chan struct{}
	// handlers counts the handler goroutines the claim loop started.
	handlers sync.WaitGroup
	// claimCtx ends when the worker stops claiming: a shutdown, or the
	// session's end.
	claimCtx context.Context
	// handlerCtx, the parent of every handler's context, ends with the
	// session, or when a shutdown stops waiting for the handlers.
	handlerCtx context.Context
	// settleCtx bounds the retries of acks, nacks and releases: it ends
	// with the session (its end releases the items), or when a shutdown
	// stops waiting for them.
	settleCtx context.Context
	// sup abandons the handlers that outlive their contexts by HangGrace
	// (job.go); bucket is the claim loop's current deadline bucket.
	sup    *supervisor
	bucket *deadlineBucket
	// jobs and running are the claim loop's buffers for one claim's jobs.
	jobs, running []*job
	// reapSessions: the maintenance loop deletes expired sessions (one
	// queue's of a group).
	reapSessions bool
	// statsDue is signalled (without blocking) when the maintenance loop
	// took the queue's reap turn: the check of the tables' statistics is
	// due (checkStatistics).
	statsDue chan struct{}
	// refused: a reap of the maintenance loop was refused for lack of a
	// privilege (logFailure); its next try backs off.
	refused bool
}

// runSession runs the worker's queue on one session until it is lost or ctx
// is cancelled; on return the worker is done with the session (end.done:
// the group's last queue closes it). reapSessions: its maintenance loop
// deletes expired sessions.
func (w *Worker) runSession(ctx context.Context, sess *session.Session, end *sessionEnd, reapSessions bool) {
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
	r := &sessionRun{w: w, sess: sess, log: log, handlerCtx: handlerCtx, settleCtx: settleCtx, reapSessions: reapSessions}
	rebDone := make(chan struct{})
	r.fl = newFlights(w.lease) // before the rebalancer, whose OnDrainTimeout reads it
	if w.opts.Parts > 0 {
		reb, err := partition.New(w.db, sess, partition.Options{Tuning: w.opts.Partition, Queue: w.name, Tables: w.tables, Logger: w.opts.Logger,
			OnDrainTimeout: func(h partition.Hold) { r.fl.givenUp(h) }, Testing: w.opts.Testing.Partition})
		if err != nil {
			log.Error("starting the rebalancer failed", zap.Error(err))
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
			sess.Close(closeCtx) // the group's other queues too start again
			end.done()
			cancel()
			return
		}
		r.reb = reb
		r.pace = newFairPace(w)
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
	r.sup = newSupervisor(w.opts.HangGrace, r.abandonJob)
	r.fl.parent, r.fl.sup = handlerCtx, r.sup
	go r.sup.run(handlerCtx)
	r.lim = newLimiter(w.opts.Limits)
	w.lim.Store(r.lim)
	defer func() {
		w.lim.Store(nil) // a snapshot between these lines may miss this session's refusals, never count them twice
		w.refusedTotal.Add(r.lim.stats(time.Now()).Refused)
	}()
	w.refreshLimits(sess.Context(), sess, r.lim, log)
	if h := w.opts.Testing.AfterLimitRefresh; h != nil {
		h()
	}
	r.statsDue = make(chan struct{}, 1)
	go func() {
		defer close(maintDone)
		r.maintain()
	}()
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		r.checkStatistics(r.statsDue)
	}()

	var observe func(reqs []claim.AckRequest, errs []error)
	if obs, after := w.opts.Observer, w.opts.Testing.AfterAck; obs != nil || after != nil {
		observe = func(reqs []claim.AckRequest, errs []error) {
			if obs != nil {
				obs.AckBatch(w.name, len(reqs))
			}
			if after != nil {
				items := make([]claim.Item, len(reqs))
				for i, r := range reqs {
					items[i] = r.Item
				}
				after(items, errs)
			}
		}
	}
	r.a = startAcker(w.queue, w.opts.Ackers, max(1, w.opts.MaxAckBatch), observe, claim.AckOptions{Batch: w.opts.BatchRecord, Statement: w.opts.BatchStatement},
		context.WithoutCancel(settleCtx), attempt.DefaultTryTimeout)
	defer r.a.stop()
	r.slots = make(chan struct{}, w.opts.Concurrency)
	r.freed = make(chan struct{}, 1)
	claimCtx, stopClaiming := context.WithCancel(sess.Context())
	r.claimCtx = claimCtx
	r.attemptOpts = r.newItemOptions()
	stopOnShutdown := context.AfterFunc(ctx, stopClaiming)
	defer stopOnShutdown()
	r.claimLoop()
	stopClaiming()
	if r.bucket != nil {
		r.bucket.release() // the claim loop's reference
	}
	r.sup.stop()

	// Wait for in-flight handlers: at once if the session is lost (their
	// contexts are already cancelled), within ShutdownTimeout otherwise;
	// then cancel them and wait at most ShutdownTimeout more (hung handlers
	// are abandoned within HangGrace, their items released); then stop
	// retrying settles and go on (the session's end releases the items).
	waited := make(chan struct{})
	go func() { r.handlers.Wait(); close(waited) }()
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
	if err := end.done(); err != nil {
		log.Warn("closing the session failed; peers will reap it", zap.Error(err))
	}
	if !waitBounded(rebDone, w.opts.ShutdownTimeout) {
		log.Warn("the rebalancer did not stop within the shutdown timeout")
	} else if r.reb != nil {
		w.reb.Store(nil) // a snapshot between these lines may miss this session's moves, never count them twice
		st := r.reb.Stats()
		w.partsAcquired.Add(st.Acquired)
		w.partsReleased.Add(st.Released)
		w.partsRebalances.Add(st.Rebalances)
		w.partsRetries.Add(st.Retries)
		w.partsReads.Add(st.Reads)
	}
	if !waitBounded(maintDone, w.opts.ShutdownTimeout) {
		log.Warn("the maintenance loop did not stop within the shutdown timeout")
	}
	if !waitBounded(statsDone, w.opts.ShutdownTimeout) {
		log.Warn("the statistics check did not stop within the shutdown timeout")
	}
	log.Info("session ended")
}

// queueReapHeartbeats is how many heartbeats apart, on average, a session
// tries to take its queue's reap turn (queueReapTurn); each interval is
// drawn at random between half and one and a half of it, so that sessions
// spread their tries. A turn is taken when the queue's last reap is at
// least half of it old, so the fleet reaps the queue at least every one
// and a half of it, as one session alone did before the turns.
const queueReapHeartbeats = 5

// idleQueueReapEvery is how often a fleet runs its queue's whole reap
// although the reap's item steps have nothing to do (no expired lease, no
// exhausted or expired item, no cancel asked for, no dependency), if a
// one-statement test finds that the prunes (ended ids past the dedup
// window, kept cancelled items, attempt errors, dead items beyond the
// retention), the exhausted items or the cross-queue edges have anything
// to do (queueReapTurn). The queue's prune turn (pruned_at in the reaps
// table) counts it for the fleet.
const idleQueueReapEvery = time.Minute

// maintain runs the session's periodic chores on one connection, one at a
// time, until the session ends: every heartbeat (and at once on the queue's
// cancel notification), cancelling the handlers of items whose cancel was
// asked for (checkCancels), and extending the leases of
// long-running handlers' items; when a heartbeat finds that no session
// reaped expired sessions for Session.ReapEvery (default two heartbeats)
// and that the session is not alone in the database, taking that turn and deleting expired sessions (reapExpiredSessions, in the run whose
// reapSessions is set); every
// few heartbeats, taking the queue's reap turn and, when the queue has
// something to reap, releasing the queue's expired leases and moving
// crash-looping items to the dead items (queuemaint.Queue.Reap;
// queueReapTurn). A reap that fails is tried again at the next heartbeat;
// one refused for lack of a privilege (its turn or a step) is logged with
// the table and the privileges the user lacks, and tried again after a
// wait that doubles from a heartbeat up to a minute (refusedRetryWait).
// Any live session may reap; both are idempotent. The check of the
// tables' statistics runs beside it (checkStatistics): its ANALYZE may
// take seconds, which these chores must not wait for.
func (r *sessionRun) maintain() {
	w, log := r.w, r.log
	ctx := r.sess.Context()
	hb := r.sess.Options().Heartbeat
	reapEvery := w.opts.Session.ReapEvery
	if reapEvery <= 0 {
		reapEvery = 2 * hb
	}
	// Only one session run of a session reaps expired sessions (see
	// sessionRun.reapSessions): the others never take the turn.
	var reapTurns <-chan struct{}
	if r.reapSessions {
		reapTurns = r.sess.ReapTurns(reapEvery)
	}
	jitter := func(d time.Duration) time.Duration { return d/2 + rand.N(d+1) }
	now := time.Now()
	nextLimits := now.Add(w.opts.Limits.Refresh)
	if r.lim.quiet() {
		nextLimits = now.Add(max(w.opts.Limits.Refresh, limitQuietRefresh))
	}
	// The limits are read every Limits.Refresh while they limit something
	// (or the last read failed); while they limit nothing, when the
	// queue's change marker moved (a write of the limits raises it, as do
	// the changes of members and parts the shares derive from) and every
	// limitQuietRefresh.
	changed := r.sess.Changes()
	refresh := func() {
		ok := w.refreshLimits(ctx, r.sess, r.lim, log)
		every := w.opts.Limits.Refresh
		if ok && r.lim.quiet() {
			every = max(every, limitQuietRefresh)
		}
		nextLimits = time.Now().Add(every)
		if h := w.opts.Testing.AfterLimitRefresh; h != nil && ctx.Err() == nil {
			h()
		}
	}
	nextQueueReap := now.Add(jitter(queueReapHeartbeats * hb))
	var qst queueReapState
	retrySessions := false
	// A reap refused for lack of a privilege is tried again after
	// refusedRetryWait of the refusals in a row, not at the next
	// heartbeat: sessionsRefused and queueRefused count them, and
	// retrySessionsAt is when the sessions' reap is tried again.
	sessionsRefused, queueRefused := 0, 0
	var retrySessionsAt time.Time
	reapSessions := func(turn bool) {
		r.refused = false
		retrySessions = !r.reapExpiredSessions(ctx, reapEvery, turn)
		switch {
		case r.refused:
			// The turn or the reap was refused: neither is tried again
			// (at a heartbeat's turn or a retry) before the wait.
			sessionsRefused++
			retrySessionsAt = time.Now().Add(refusedRetryWait(hb, sessionsRefused))
		case !retrySessions:
			sessionsRefused = 0
		}
	}
	t := time.NewTicker(min(hb, w.opts.Limits.Refresh))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.cancelWake:
			// A cancel was asked for in the queue: look at once (nil
			// without a listener: never ready).
			w.checkCancels(ctx, r.sess.ID(), r.fl, log)
			continue
		case <-changed:
			refresh()
			continue
		case <-reapTurns:
			// A heartbeat found that no session reaped expired sessions
			// for reapEvery: take the turn at once, before the peers'
			// next heartbeats see it is due (unless the last try was
			// refused for lack of a privilege, within its wait).
			if time.Now().Before(retrySessionsAt) {
				continue
			}
			reapSessions(true)
			if ctx.Err() != nil {
				return
			}
			continue
		case <-t.C:
		}
		w.checkCancels(ctx, r.sess.ID(), r.fl, log)
		if now := time.Now(); !now.Before(nextLimits) {
			refresh()
		} else if at, ok := r.sess.LastBeat(); ok {
			r.lim.confirm(at)
		}
		w.extendLeases(ctx, r.sess.ID(), r.fl, log)
		if retrySessions && !time.Now().Before(retrySessionsAt) {
			// The turn is this session's: it tries again at each heartbeat
			// until it succeeds (backing off while it is refused for lack
			// of a privilege).
			reapSessions(false)
			if ctx.Err() != nil {
				return
			}
		}
		if now := time.Now(); !now.Before(nextQueueReap) {
			nextQueueReap = now.Add(jitter(queueReapHeartbeats * hb))
			r.refused = false
			switch ok := r.queueReapTurn(ctx, &qst, queueReapHeartbeats*hb/2); {
			case r.refused:
				// The turn or a step of the reap was refused for lack of
				// a privilege: a retry at each heartbeat, or a turn each
				// interval, would be refused the same way until the grant
				// is back (the log line says which).
				queueRefused++
				nextQueueReap = time.Now().Add(max(refusedRetryWait(hb, queueRefused), queueReapHeartbeats*hb/2))
			case !ok:
				// Leases may have expired during the failure: try again at
				// the next heartbeat rather than a full interval later.
				queueRefused = 0
				nextQueueReap = time.Now().Add(hb)
			default:
				queueRefused = 0
			}
			if ctx.Err() != nil {
				return
			}
		}
	}
}
