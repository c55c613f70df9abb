package attempt

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
)

// Inline is one attempt whose handler runs on its caller's goroutine, for
// package worker, which keeps one goroutine per item and supervises the
// handlers' deadlines and abandonment itself: the caller gives the handler
// the context that Context returns, runs it with Call, and then settles the
// item with Conclude — or, when the handler has not returned Grace after its
// context ended, settles it with Abandon from another goroutine and never
// calls Conclude. Run, by contrast, starts a goroutine for the handler and
// a context with a timer for its timeout.
//
// Its zero value is ready for Context. It is meant to be embedded in the
// caller's per-item state, so that an attempt costs no allocation of its
// own: the handler's context, its value box and the result live in it.
type Inline struct {
	hctx handlerCtx
	hr   handlerResult
	res  Result
	st   settling
	// For an ack asked with Start: its record and value, and the error of
	// its first try.
	record   func(context.Context, pgx.Tx) error
	value    any
	hasValue bool
	firstErr error
}

// AckWaiter is told the outcome of one try of an ack asked of an
// AsyncAcker: err as the Settler's Ack would have returned it.
type AckWaiter interface {
	AckAnswered(err error)
}

// AsyncAcker is a TryBounder that can take one try of an ack without its
// asker waiting for it: it calls w.AckAnswered once the try is done, on a
// goroutine of its own (never before AckAsync returns). *it must not
// change until then. value, if hasValue, is handed on as AckValue does.
type AsyncAcker interface {
	TryBounder
	AckAsync(it *claim.Item, record func(context.Context, pgx.Tx) error, value any, hasValue bool, w AckWaiter)
}

// handlerCtx is a handler's context under Inline: the item's context (which
// carries the handler's deadline and its cancellations) with the attempt's
// value box, without a context of its own. Done, Err, Deadline and the
// cause (context.Cause) are the item context's, so contexts derived from it
// are its children (no goroutine of their own).
type handlerCtx struct {
	context.Context
	box valueBox
}

// Value returns the attempt's value box for valueKey, and ctx's values
// otherwise.
func (c *handlerCtx) Value(key any) any {
	if _, ok := key.(valueKey); ok {
		return &c.box
	}
	return c.Context.Value(key)
}

// Context returns the handler's context: ctx, which must end at the
// handler's deadline (Options.Timeout from its start, or later) with
// context.DeadlineExceeded and when the item's claim is lost, with the
// attempt's value box (SetValue, SaveCheckpoint, ReportProgress) for item
// *it of q (not copied: *it must not change while the attempt runs).
func (a *Inline) Context(ctx context.Context, q *claim.Queue, it *claim.Item) context.Context {
	a.hctx.Context = ctx
	a.hctx.box.q, a.hctx.box.it = q, it
	return &a.hctx
}

// KindKnown reports whether a handler registered for the item's kind took
// it (MarkKindKnown); safe to call while the handler runs.
func (a *Inline) KindKnown() bool { return a.hctx.box.kindKnown.Load() }

// Call runs h on it with the handler's context, on the caller's goroutine,
// turning a panic into an error.
func (a *Inline) Call(h Handler, it claim.Item) {
	a.hr = call(&a.hctx, h, it)
}

// Conclude settles item it on q (or o.Settle) after Call returned, as Run
// does after its handler. parentCause is the cause of the end of the item's
// context for a reason other than the handler's deadline (its claim was
// lost, it was cancelled, the session ended), nil if there was none: a
// handler that failed with context.DeadlineExceeded is counted as timed out
// only without one. The result lives in a.
func (a *Inline) Conclude(q *claim.Queue, it *claim.Item, o *Options, parentCause error) *Result {
	s, settleCtx, log := o.fill(q, a.hctx.Context)
	conclude(&a.st, s, settleCtx, it, a.hr, &a.hctx.box, o, &a.res, log, a.hctx.Err() != nil, parentCause)
	return &a.res
}

// Start is Conclude without waiting for the ack of a handler that
// succeeded, when the item is acked on an AsyncAcker (o.Settle) and is
// neither at most once nor cancelled: it asks the ack's first try and
// returns nil; the AsyncAcker then calls w.AckAnswered, which must call
// Answered, and Continue if that reports the attempt not over. Otherwise
// it is Conclude, and returns its result.
func (a *Inline) Start(q *claim.Queue, it *claim.Item, o *Options, parentCause error, w AckWaiter) *Result {
	aa, async := o.Settle.(AsyncAcker)
	if !async || a.hr.err != nil || it.AtMostOnce || errors.Is(parentCause, claim.ErrCancelled) {
		return a.Conclude(q, it, o, parentCause)
	}
	s, settleCtx, log := o.fill(q, a.hctx.Context)
	a.res.Panicked = a.hr.panicked
	a.st = settling{s: s, it: it, ctx: settleCtx, tryTimeout: o.TryTimeout, res: &a.res, log: log, onRetry: o.OnRetry, bounded: true}
	a.value, a.hasValue = a.hctx.box.get()
	a.record = recoverRecord(a.hr.record, &a.res)
	a.res.Tries++
	aa.AckAsync(it, a.record, a.value, a.hasValue, w)
	return nil
}

// Answered takes the outcome of the ack's first try that Start asked, and
// reports whether the attempt is over (then its result is Result): if
// not, call Continue, on a goroutine that may wait (it retries).
func (a *Inline) Answered(err error) bool {
	if err == nil {
		a.res.Outcome, a.res.Err, a.res.SettleErr = claim.Acked, nil, nil
		return true
	}
	a.firstErr = err
	return false
}

// Continue settles the item after a first try of its ack that failed, as
// Conclude would have, and returns the attempt's result.
func (a *Inline) Continue() *Result {
	a.st.ackFrom(a.firstErr, a.record, a.value, a.hasValue)
	return &a.res
}

// Result returns the attempt's result once it is over.
func (a *Inline) Result() *Result { return &a.res }

// Abandon settles item it without its handler's result, as Run does with a
// handler that had not returned o.Grace after its context ended: call it
// (instead of Conclude) from another goroutine than the handler's, which
// runs on and whose result is ignored. parentCause is as for Conclude.
func (a *Inline) Abandon(q *claim.Queue, it *claim.Item, o *Options, parentCause error) *Result {
	s, settleCtx, log := o.fill(q, a.hctx.Context)
	a.res.Abandoned = true
	hr := handlerResult{err: fmt.Errorf("the handler did not return within %v after its context ended (%w); abandoned", o.Grace, context.Cause(&a.hctx))}
	log.Error("handler abandoned: it ignores its context; its goroutine runs on", zap.Duration("grace", o.Grace))
	conclude(&a.st, s, settleCtx, it, hr, &a.hctx.box, o, &a.res, log, true, parentCause)
	return &a.res
}

// fill fills in o's defaults (o.Grace and o.TryTimeout in place) and returns
// where the item is settled, the settle context and the logger: parent is
// the handler's parent context.
func (o *Options) fill(q *claim.Queue, parent context.Context) (Settler, context.Context, *zap.Logger) {
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.TryTimeout <= 0 {
		o.TryTimeout = DefaultTryTimeout
	}
	var s Settler = q
	if o.Settle != nil {
		s = o.Settle
	}
	settleCtx := o.SettleCtx
	if settleCtx == nil {
		settleCtx = parent
	}
	return s, settleCtx, log
}
