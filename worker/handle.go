package worker

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

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
			Explain:   w.explainRefusal,
		},
		handler: w.attemptHandler,
		logs:    core.Enabled(zap.InfoLevel) || core.Enabled(zap.WarnLevel) || core.Enabled(zap.ErrorLevel),
	}
}
