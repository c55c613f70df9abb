package worker

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// limitSource reads a queue's limits and the database clock (zero: unknown).
type limitSource func(ctx context.Context) (Limits, time.Time, error)

// errAtLimit is why an item of a tenant at its share is given back.
var errAtLimit = errors.New("worker: the item's tenant is at its share of its limit")

// limitQuietRefresh is how often a session reads limits that limit
// nothing when its queue's change marker does not move: writes of schema
// version 6 (claim.Queue.UpdateSettings, SetTenantLimit, RemoveTenantLimit)
// raise the marker, which the session's next heartbeat sees, and the
// session reads them at once; writes of code of versions 3 to 5 do not,
// and take effect within this interval.
const limitQuietRefresh = 30 * time.Second

// refreshLimits reads the stored limits and what the session's shares
// derive from (the queue's parts, or the queue's live members), and hands
// them to lim. A failure is counted and logged; the last limits read stay
// in force (none before the first read, when the session claims nothing)
// until they are LimitOptions.StaleAfter old: then lim claims nothing they
// govern until a read succeeds (see "When the limits cannot be read" in
// limits.go).
//
// The values read are dated from the start of the read, not its end: a
// read held up (behind a lock, by retries, on a busy machine) returns
// values at least that old, and a limit lowered meanwhile is not in them.
// A read is bounded by StaleAfter, since what it returns later is stale on
// arrival: a read that cannot finish (a table locked by a migration)
// counts as a failure, and it does not hold up the session's other chores
// that share its loop (lease extensions, cancels, reaps; see maintain).
//
// It reports whether the read succeeded.
func (w *Worker) refreshLimits(ctx context.Context, sess *session.Session, lim *limiter, log *zap.Logger) (ok bool) {
	readAt := time.Now()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, w.opts.Limits.StaleAfter)
	defer cancel()
	lims, dbNow, err := w.limitSource(ctx)
	if err != nil {
		if parent.Err() == nil {
			lim.failed()
			log.Warn("reading the queue's limits failed; keeping the last ones read until they are LimitOptions.StaleAfter old, then claiming nothing they govern", zap.Error(err))
		}
		return false
	}
	parts, rank, k := 0, -1, 0
	if !lims.none() {
		if w.opts.Parts > 0 {
			parts, err = partition.Parts(ctx, w.db, w.tables, w.name)
		} else {
			// The queue's members share its limits: sessions of other
			// queues in the database take no share.
			// (session.LimitSharers also counts the sessions of code older
			// than queue membership, which take a share of every queue's
			// limits: with them counted the shares never add up to more
			// than the limit during a rolling upgrade.)
			var live []uuid.UUID
			live, err = session.LimitSharers(ctx, w.db, w.tables, w.name)
			if err == nil && !slices.Contains(live, sess.ID()) {
				// Not a member (the membership row was deleted, or the
				// session expired): join again, and read again.
				if err = sess.Join(ctx, w.name); err == nil {
					live, err = session.LimitSharers(ctx, w.db, w.tables, w.name)
				}
			}
			k, rank = len(live), slices.Index(live, sess.ID())
		}
		if err != nil {
			if parent.Err() == nil {
				lim.failed()
				log.Warn("reading the queue's parts or members for its limits failed", zap.Error(err))
			}
			return false
		}
	} else if w.opts.Parts > 0 {
		parts = w.opts.Parts // unused while nothing is limited
	}
	lim.set(readAt, lims, dbNow, parts, rank, k)
	return true
}

// limitWait waits, after a claim held back by the limits, until an item
// ends, the rate allows another item, Poll passes (the shares may have
// changed), or ctx ends (false).
func (w *Worker) limitWait(ctx context.Context, freed chan struct{}, pl plan) bool {
	d := w.opts.Poll
	if pl.wait > 0 {
		d = min(d, pl.wait)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var ended <-chan struct{}
	if pl.full {
		ended = freed
	}
	select {
	case <-ctx.Done():
		return false
	case <-ended:
	case <-t.C:
	}
	return true
}

// giveBack releases an item the limits refused, without running it and
// without counting the attempt, retrying like any settle.
func (w *Worker) giveBack(itemCtx, settleCtx context.Context, it claim.Item, a *acker, log *zap.Logger) {
	defer w.running.Add(-1)
	refuse := func(context.Context, claim.Item) (func(context.Context, pgx.Tx) error, error) { return nil, errAtLimit }
	attempt.Run(itemCtx, w.queue, it, refuse, attempt.Options{
		Timeout:   w.opts.ItemTimeout,
		Grace:     w.opts.HangGrace,
		Settle:    a,
		SettleCtx: settleCtx,
		OnRetry:   func() { w.settleRetries.Add(1) },
		GiveBack:  func() bool { return true },
		Log:       log.With(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.String("why", "tenant at its limit")),
	})
}
