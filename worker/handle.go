package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// handle runs the handler for one item and acks, nacks or releases it
// through the session's settle goroutines. A handler that fails after both
// handlerCtx and claimCtx ended (the session lost, or a shutdown that
// stopped waiting) has its item released, its attempt not counted, rather
// than nacked.
//
// itemCtx is the handler's parent context: handlerCtx, also cancelled when
// the item's claim is found lost.
func (r *sessionRun) handle(itemCtx context.Context, it claim.Item) {
	w := r.w
	o := r.attemptOpts // what every item of the session shares (see itemOptions)
	h := o.handler
	var took *atomic.Int64 // the handler's duration, in nanoseconds (with an Observer)
	start := time.Now()
	if w.opts.Observer != nil {
		took = new(atomic.Int64)
		h = func(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
			defer func() { took.Store(int64(time.Since(start))) }() // also when it panics
			return w.handler(ctx, it)
		}
	}
	if o.logs {
		// Lazily: the fields are encoded only if the attempt logs.
		o.Log = r.log.WithLazy(zap.Stringer("item", it.ID), zap.Int("part", it.Part), zap.Int("attempt", it.Attempt))
	}
	res := attempt.Run(itemCtx, w.queue, it, h, o.Options)
	if res.Panicked {
		w.panics.Add(1)
	}
	if res.TimedOut {
		w.timeouts.Add(1)
	}
	if obs := w.opts.Observer; obs != nil {
		d := time.Duration(took.Load())
		if res.Abandoned {
			d = time.Since(start) // it has not returned
		}
		obs.HandlerDone(w.name, d, res.Outcome)
	}
	if res.Unknown && res.Outcome == claim.Unsettled {
		w.unknown.Add(1)
	}
	if res.Outcome == claim.Dropped {
		w.dropped.Add(1)
	}
	if !res.Abandoned {
		w.running.Add(-1)
		return
	}
	w.abandoned.Add(1)
	w.abandonedRunning.Add(1)
	go func() {
		<-res.HandlerDone
		w.abandonedRunning.Add(-1)
		w.running.Add(-1)
	}()
}

// RecordValue hands v to Options.BatchRecord with the ack of the item whose
// handler calls it (with the context the handler was given): the batch
// record finds it in claim.AckRequest.Value and writes it with the other
// results of the transaction in one statement. It returns an error when ctx
// is not a handler's context. The last call before the handler returns
// wins; a handler that fails is nacked as usual, its value dropped.
func RecordValue(ctx context.Context, v any) error {
	if !attempt.SetValue(ctx, v) {
		return errors.New("worker: RecordValue outside a handler's context")
	}
	return nil
}

// attemptHandler is the handler as package attempt takes it.
func (w *Worker) attemptHandler(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
	return w.handler(ctx, it)
}

// itemOptions are the attempt options every item of a session shares, made
// once per session rather than once per item (each closure, and the
// handler's method value, would be an allocation per item).
type itemOptions struct {
	attempt.Options
	// handler is w.attemptHandler.
	handler attempt.Handler
	// logs: the session's logger writes something at the levels an attempt
	// logs at; if not, items get it without their fields.
	logs bool
}

// newItemOptions returns r's itemOptions.
func (r *sessionRun) newItemOptions() itemOptions {
	w := r.w
	core := r.log.Core()
	return itemOptions{
		Options: attempt.Options{
			Timeout:   w.opts.ItemTimeout,
			Grace:     w.opts.HangGrace,
			Settle:    r.a,
			SettleCtx: r.settleCtx,
			OnRetry:   func() { w.settleRetries.Add(1) },
			GiveBack:  func() bool { return r.handlerCtx.Err() != nil && r.claimCtx.Err() != nil },
			Log:       r.log,
		},
		handler: w.attemptHandler,
		logs:    core.Enabled(zap.InfoLevel) || core.Enabled(zap.WarnLevel) || core.Enabled(zap.ErrorLevel),
	}
}
