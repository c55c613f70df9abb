package worker

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
)

// Cancel and snooze, the worker's side (docs/cancel-and-snooze.md).
//
// A cancel asked of a running item (claim.Queue.CancelItem) reaches its
// handler's context through the session's maintenance loop: at every
// heartbeat (session Tuning.Heartbeat, default 1 s) while the session
// holds items, and at once when the queue's cancel notification arrives
// (PostgreSQL, unless NoWake or WakeProbe), the loop reads the session's items whose
// cancel was asked for (claim.Claimer.CancelRequests) and cancels their
// handlers' contexts with a *claim.CancelledError as the cause. When the
// handler returns, its item ends as cancelled (claim.Queue.EndCancelled)
// whatever it returned: the request moved the claim's token on, so its
// result could not be acked anyway.

// Snooze returns the error that hands the item back for d without
// spending an attempt (claim.Snooze): a handler that finds its item not
// ready yet ends with
//
//	return nil, worker.Snooze(30 * time.Second)
//
// The item is claimable again after d; the snooze after the queue's
// claim.Options.MaxSnoozes (default 100) moves it to the dead items with
// reason "snoozed too often". At-most-once items cannot be snoozed (their
// claim deleted them): a snooze drops them like any failure.
func Snooze(d time.Duration) error { return claim.Snooze(d) }

// SnoozeUnlimited is Snooze without the queue's bound (claim.SnoozeUnlimited):
// the item is claimable again after d, however often it was snoozed, and
// never moved to the dead items for it. A handler that waits for an outside
// condition for as long as it takes ends with
//
//	return nil, worker.SnoozeUnlimited(time.Minute)
//
// (claim.Options.MaxSnoozes = claim.UnlimitedSnoozes lifts the bound for
// every snooze of a queue).
func SnoozeUnlimited(d time.Duration) error { return claim.SnoozeUnlimited(d) }

// Cancelled reports whether ctx, a handler's context, was cancelled
// because its item was cancelled from outside, and if so who cancelled
// it and why. A handler that sees it should stop: its result will not be
// written, whatever it returns.
func Cancelled(ctx context.Context) (*claim.CancelledError, bool) {
	var ce *claim.CancelledError
	if errors.As(context.Cause(ctx), &ce) {
		return ce, true
	}
	return nil, false
}

// cancelled cancels the handlers of the items fl holds that the requests
// name (for the same claim), with the request's cause, and returns the
// requests it acted on (not those it acted on before).
func (f *flights) cancelled(reqs []claim.CancelRequest) []claim.CancelRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var done []claim.CancelRequest
	for _, r := range reqs {
		fl := f.m[r.ID]
		if fl == nil || fl.item.Token != r.Token || fl.cancelAsked {
			continue
		}
		fl.cancelAsked = true
		f.end(fl, r.Cause)
		done = append(done, r)
	}
	return done
}

// empty reports whether fl holds no items.
func (f *flights) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m) == 0
}

// checkCancels cancels the handlers of the session's items whose cancel
// was asked for. It reads nothing while the session holds no items.
func (w *Worker) checkCancels(ctx context.Context, sessID uuid.UUID, fl *flights, log *zap.Logger) {
	if fl.empty() {
		return
	}
	reqs, err := w.queue.Claimer(sessID).CancelRequests(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("reading cancel requests failed; the next heartbeat tries again", zap.Error(err))
		}
		return
	}
	if done := fl.cancelled(reqs); len(done) > 0 {
		w.cancelsSeen.Add(int64(len(done)))
		for _, r := range done {
			log.Info("item cancelled while its handler ran: cancelling the handler", zap.Stringer("item", r.ID),
				zap.String("by", r.Cause.By), zap.String("reason", r.Cause.Reason))
		}
	}
}
