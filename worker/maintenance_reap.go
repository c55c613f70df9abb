package worker

import (
	"context"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/google/uuid"
	"go.uber.org/zap"
)

// reapQueue runs one reap of the queue (queuemaint.Queue.Reap: the
// cancelled items no handler will end, the expired leases, the exhausted
// and expired items, the dependency sweep, the ended ids past the dedup
// window and the dead items beyond the retention), logs what it did, and
// reports false when a step failed: then the session's maintenance loop
// reaps again at the next heartbeat.
func (r *sessionRun) reapQueue(ctx context.Context) (ok bool) {
	w, log := r.w, r.log
	qst, err := w.maint.Reap(ctx)
	st := claim.ReapStats(qst)
	if ctx.Err() != nil {
		return true
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
	return !r.logReapErrors(err)
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
