package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/denied"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// sessionsReapTurn is the name of the reap turn of expired sessions in the
// reaps table (no queue has an empty name).
const sessionsReapTurn = ""

// reapExpiredSessions deletes the expired sessions, after taking the reap turn
// of expired sessions when turn is true, in one statement
// (store.SessionsReapTurn): a peer that took it within the last every
// reaped, and this session does nothing. It reports false when the reap
// failed: then the session tries again (without the turn, which it
// holds) at the next heartbeat. When the statement fails or does not
// finish within ReapTimeout (a row locked by a frozen process's open
// transaction, say), the session reaps as before the turns
// (session.ReapWithin, which deletes the expired sessions one by one when
// some cannot go): a reap too many costs a statement, a reap missed delays
// failover.
func (r *sessionRun) reapExpiredSessions(ctx context.Context, every time.Duration, turn bool) (ok bool) {
	w, log := r.w, r.log
	timeout := r.sess.Options().ReapTimeout
	var n int64
	var err error
	if turn {
		var took bool
		tctx, cancel := context.WithTimeout(ctx, timeout)
		err = retry.Do(tctx, nil, func(ctx context.Context) error {
			var err error
			took, n, err = w.store.SessionsReapTurn(ctx, w.db, every)
			return store.Classify(err)
		})
		cancel()
		if h := w.opts.Testing.AfterReapTurn; h != nil && ctx.Err() == nil {
			h(sessionsReapTurn, took, err)
		}
		switch {
		case ctx.Err() != nil:
			return true
		case err != nil:
			r.logFailure(ctx, "taking the turn to reap expired sessions failed; reaping without it", err)
		case !took:
			return true // a peer reaped
		}
	}
	if !turn || err != nil {
		n, err = session.ReapWithin(ctx, w.db, w.tables, timeout)
	}
	if h := w.opts.Testing.AfterSessionReap; h != nil && ctx.Err() == nil {
		h(n, err)
	}
	switch {
	case ctx.Err() != nil:
		return true
	case err != nil:
		r.logFailure(ctx, "reaping expired sessions failed", err)
		return false
	case n > 0:
		log.Info("reaped expired sessions", zap.Int64("count", n))
	}
	return true
}

// queueReapState is what the maintenance loop keeps between its queue reap
// turns.
type queueReapState struct {
	// retry: the last reap failed; the next one runs without a turn.
	retry bool
	// more: the last reap pruned a full batch or more (the rest waits
	// for the next reap); the next one runs without a turn, as it would
	// have before the turns, rather than a minute later.
	more bool
	// claimed is the queue's count of claims at the last check of the
	// tables' statistics.
	claimed int64
}

// queueReapTurn takes the queue's reap turn if the queue's last reap is at
// least every old, and then runs the queue's reap (reapQueue) if the
// reap's item steps have something to do, or if it also took the queue's
// prune turn (the queue's last whole reap is idleQueueReapEvery old: the
// prunes) and the prunes have something to do (queuemaint.Queue.PrunesDue),
// or if its last reap failed. So a fleet reaps a queue about once per
// interval, whatever its size, and an idle queue's reap is one statement
// (two at its prune turn, once a minute). A turn that cannot be taken
// reaps anyway. A reap that pruned a full batch is followed by another at
// the session's next try, without a turn, until the prunes are done. A
// turn taken (or not known) also makes the check of the tables'
// statistics due (checkStatistics), if the session claimed items since
// the last check or the queue is reaped. It reports false when a step of
// the reap failed.
func (r *sessionRun) queueReapTurn(ctx context.Context, st *queueReapState, every time.Duration) (ok bool) {
	w := r.w
	if !st.retry && !st.more {
		var took, prune, due bool
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			took, prune, due, err = w.store.ReapsTakeQueueTurn(ctx, w.db, w.name, every, idleQueueReapEvery)
			return store.Classify(err)
		})
		if h := w.opts.Testing.AfterReapTurn; h != nil && ctx.Err() == nil {
			h(w.name, took, err)
		}
		if claimed := w.queue.Stats().Claimed; err != nil || took && (claimed != st.claimed || due || prune) {
			// The statistics check goes with the turn, when the session
			// claimed since the last one (a backlog whose statistics may
			// be wrong) or the queue is reaped.
			st.claimed = claimed
			select {
			case r.statsDue <- struct{}{}:
			default:
			}
		}
		switch {
		case ctx.Err() != nil:
			return true
		case err != nil:
			r.logFailure(ctx, "taking the queue's reap turn failed; reaping anyway", err)
		case !took:
			return true // a peer reaps
		case !due && !prune:
			return true // nothing to reap
		case !due:
			// The prune turn, and the item steps have nothing to do: the
			// whole reap runs only if the steps the turn's test leaves out
			// have something to do (an idle queue's prune turn is one
			// statement then, not the whole reap's 28). A test that
			// fails reaps anyway.
			pdue, err := w.maint.PrunesDue(ctx)
			if h := w.opts.Testing.AfterPrunesDue; h != nil && ctx.Err() == nil {
				h(pdue, err)
			}
			switch {
			case ctx.Err() != nil:
				return true
			case err != nil:
				r.logFailure(ctx, "testing whether the queue has anything to prune failed; reaping anyway", err)
			case !pdue:
				return true // nothing to prune either
			}
		}
	}
	ok, done := r.reapQueue(ctx)
	st.retry = !ok
	st.more = done.Pruned+done.DeadPruned >= pruneBatch
	return ok
}

// pruneBatch is the number of ended ids or dead items a reap's prune that
// may have left more behind deletes at least: one statement's batch.
const pruneBatch = 1000

// reapQueue runs one reap of the queue (queuemaint.Queue.Reap: the
// cancelled items no handler will end, the expired leases, the exhausted
// and expired items, the dependency sweep, the ended ids past the dedup
// window and the dead items beyond the retention), logs what it did, and
// reports false when a step failed: then the session's maintenance loop
// reaps again at the next heartbeat. It returns what the reap did.
func (r *sessionRun) reapQueue(ctx context.Context) (ok bool, st claim.ReapStats) {
	w, log := r.w, r.log
	qst, err := w.maint.Reap(ctx)
	st = claim.ReapStats(qst)
	if ctx.Err() != nil {
		return true, st
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
	return !r.logReapErrors(ctx, err), st
}

// logReapErrors logs the failures of a Reap, one line per failed step and
// per item that could not be released or moved (with its id), and reports
// whether a step failed: then the reaper runs again sooner. Such an item
// does not make it run sooner: it was ended, dead with reason
// claim.ReasonRefused, or stays as it is until the database lets it go, and
// every other item was reaped without it.
func (r *sessionRun) logReapErrors(ctx context.Context, err error) (stepFailed bool) {
	log := r.log
	if err == nil {
		return false
	}
	list := claim.ReapErrors(err)
	if len(list) == 0 {
		r.logFailure(ctx, "reaping expired leases failed", err)
		return true
	}
	for _, e := range list {
		if _, ok := denied.Of(e.Err); ok && !r.refused {
			// The first refusal of the reap says what the user lacks (one
			// statement); the lines of the others name the server's error.
			r.logFailure(ctx, "the database refused a step of the reap", e.Err, zap.String("step", e.Step))
		}
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

// logFailure logs a failure of the maintenance loop: at Warn with err; or,
// when the database refused it for lack of a privilege, at Error with what
// the user lacks of the worker's grants (explainRefusal: the table and the
// privileges), and then it sets r.refused, which makes the loop's next try
// of the failed reap back off (refusedRetryWait) rather than come at the
// next heartbeat: a grant comes back in minutes, not milliseconds.
func (r *sessionRun) logFailure(ctx context.Context, msg string, err error, fields ...zap.Field) {
	if _, ok := denied.Of(err); !ok {
		r.log.Warn(msg, append(fields, zap.Error(err))...)
		return
	}
	r.refused = true
	r.log.Error(msg, append(fields, zap.Error(r.w.explainRefusal(ctx, err)))...)
}

// refusedRetryWait is the wait before the next try of a reap after n
// refusals in a row for lack of a privilege: from a heartbeat, doubling, up
// to idleQueueReapEvery, jittered (half to one and a half of it), so that a
// worker whose grants were revoked neither spins nor waits long once they
// are back.
func refusedRetryWait(hb time.Duration, n int) time.Duration {
	d := idleQueueReapEvery
	if n < 16 {
		d = min(idleQueueReapEvery, hb<<max(0, n-1))
	}
	return d/2 + rand.N(d+1)
}
