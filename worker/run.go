package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
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
	r := &sessionRun{w: w, sess: sess, log: log, handlerCtx: handlerCtx, settleCtx: settleCtx}
	rebDone := make(chan struct{})
	if w.opts.Parts > 0 {
		reb, err := partition.New(w.db, sess, partition.Options{Tuning: w.opts.Partition, Queue: w.name, Tables: w.tables, Logger: w.opts.Logger,
			Testing: w.opts.Testing.Partition})
		if err != nil {
			log.Error("starting the rebalancer failed", zap.Error(err))
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
			sess.Close(closeCtx)
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
	r.fl = newFlights(w.lease)
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
	go func() {
		defer close(maintDone)
		r.maintain()
	}()
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		r.checkStatistics()
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
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.ShutdownTimeout)
	defer cancel()
	if err := sess.Close(closeCtx); err != nil {
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
// runs the queue's lease reaper (claim.Queue.Reap); each interval is drawn
// at random between half and one and a half of it, so that sessions spread
// their reaps.
const queueReapHeartbeats = 5

// maintain runs the session's periodic chores on one connection, one at a
// time, until the session ends: every heartbeat (and at once on the queue's
// cancel notification), cancelling the handlers of items whose cancel was
// asked for (checkCancels), and extending the leases of
// long-running handlers' items; every Session.ReapEvery (default two
// heartbeats), deleting expired sessions; every few heartbeats, releasing
// the queue's expired leases and moving crash-looping items to the dead
// items (claim.Queue.Reap). A reap that fails is tried again at the next
// heartbeat. Any live session may reap; both are idempotent. The check of
// the tables' statistics runs beside it (checkStatistics): its ANALYZE may
// take seconds, which these chores must not wait for.
func (r *sessionRun) maintain() {
	w, log := r.w, r.log
	ctx := r.sess.Context()
	hb := r.sess.Options().Heartbeat
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
		case <-w.cancelWake:
			// A cancel was asked for in the queue: look at once (nil
			// without a listener: never ready).
			w.checkCancels(ctx, r.sess.ID(), r.fl, log)
			continue
		case <-t.C:
		}
		w.checkCancels(ctx, r.sess.ID(), r.fl, log)
		if now := time.Now(); !now.Before(nextLimits) {
			nextLimits = now.Add(w.opts.Limits.Refresh)
			w.refreshLimits(ctx, r.sess, r.lim, log)
			if h := w.opts.Testing.AfterLimitRefresh; h != nil && ctx.Err() == nil {
				h()
			}
		}
		w.extendLeases(ctx, r.sess.ID(), r.fl, log)
		if now := time.Now(); !now.Before(nextReap) {
			nextReap = now.Add(jitter(reapEvery))
			n, err := session.ReapWithin(ctx, w.db, w.tables, r.sess.Options().ReapTimeout)
			if h := w.opts.Testing.AfterSessionReap; h != nil && ctx.Err() == nil {
				h(n, err)
			}
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
			if h := w.opts.Testing.AfterQueueReap; h != nil {
				h(st, err)
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
			if st.DeadPruned > 0 {
				log.Info("deleted dead items beyond the queue's retention", zap.Int("pruned", st.DeadPruned))
			}
			if r.logReapErrors(err) {
				// Leases may have expired during the failure: try again at
				// the next heartbeat rather than a full interval later.
				nextQueueReap = time.Now().Add(hb)
			}
		}
	}
}

// statisticsPause is how long a session leaves the tables' statistics
// alone after it analyzed a table or the check failed: the ANALYZE settles
// them (or the role may not analyze: the server warns and nothing changes).
// statisticsTimeout bounds the check and its ANALYZE (it samples 30,000
// rows: a fraction of a second here on a million, seconds on a slow disk).
const (
	statisticsPause   = time.Minute
	statisticsTimeout = 30 * time.Second
)

// checkStatistics runs the check of the queue's tables' statistics
// (refreshStatistics) on a goroutine of its own, one check at a time: when
// the session starts, then about every queueReapHeartbeats heartbeats
// (drawn between half and one and a half of it, as the queue's reaps),
// until the session ends. It is not on the maintenance loop: a check and
// its ANALYZE may take up to statisticsTimeout, during which the lease
// extensions, limit reads, cancels and reaps must go on (an item whose
// lease is not extended loses its claim while its handler runs). It uses
// one connection of the pool while it runs (PoolConns counts it).
func (r *sessionRun) checkStatistics() {
	ctx := r.sess.Context()
	every := queueReapHeartbeats * r.sess.Options().Heartbeat
	var next time.Time // the check is due (zero: at once)
	for {
		r.refreshStatistics(ctx, &next)
		t := time.NewTimer(every/2 + rand.N(every+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refreshStatistics has PostgreSQL analyze the queue's tables when its
// statistics say they are empty while they hold a backlog
// (claim.Queue.RefreshStatistics), unless the session did so, or failed
// to, less than statisticsPause ago (next).
func (r *sessionRun) refreshStatistics(ctx context.Context, next *time.Time) {
	if time.Now().Before(*next) {
		return
	}
	if hook := r.w.opts.Testing.OnStatistics; hook != nil {
		hook(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, statisticsTimeout)
	defer cancel()
	done, err := r.w.queue.RefreshStatistics(sctx)
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		r.log.Debug("refreshing the tables' statistics failed", zap.Error(err))
	case len(done) > 0:
		r.log.Info("analyzed tables whose statistics said they were empty", zap.Strings("tables", done))
	default:
		return
	}
	*next = time.Now().Add(statisticsPause)
}

// logReapErrors logs the failures of a Reap, one line per failed step and
// per item that could not be released or moved (with its id), and reports
// whether a step failed: then the reaper runs again sooner. Such an item
// does not make it run sooner: it was ended, dead with reason
// claim.ReasonRefused, or stays as it is until the database lets it go, and
// every other item was reaped without it.
func (r *sessionRun) logReapErrors(err error) (stepFailed bool) {
	log := r.log
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
		if e.Ended {
			log.Error("the database refused to move an item; it was moved to the dead items (reason \""+claim.ReasonRefused+"\"), and every other item was reaped without it",
				zap.String("step", e.Step), zap.Stringer("item", e.ID), zap.Error(e.Err))
			continue
		}
		log.Error("the reaper cannot release or move an item; it stays as it is, and every other item was reaped without it",
			zap.String("step", e.Step), zap.Stringer("item", e.ID), zap.Error(e.Err))
	}
	return stepFailed
}
