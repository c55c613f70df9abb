// Package attempt runs one attempt of a claimed item: the handler outside any
// transaction, bounded by the item timeout and with panics recovered, then
// the ack with the handler's record, or the nack with its error. Package
// worker and package workertest both run items through it, so a handler
// tested with workertest runs exactly as it does in a worker.
package attempt

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
)

// Handler is worker.Handler with its Record as a plain function type, so
// that this package does not import worker.
type Handler func(ctx context.Context, it claim.Item) (func(ctx context.Context, tx pgx.Tx) error, error)

// Outcome says how an attempt ended for the item.
type Outcome int

// Outcomes of Run.
const (
	// Acked: the ack, with the handler's record, committed.
	Acked Outcome = iota
	// Retried: the item was nacked and runs again after a backoff.
	Retried
	// Dead: the item was nacked into the dead-items table.
	Dead
	// Released: the item was given back without counting the attempt.
	Released
	// Unsettled: the ack, nack or release did not happen (the claim was
	// lost, the database failed, or an ack's outcome is unknown); see
	// Result.SettleErr.
	Unsettled
)

// Options configure Run.
type Options struct {
	// Timeout bounds the handler.
	Timeout time.Duration
	// SettleTimeout bounds the ack, nack or release, which run even after
	// the handler's context ended.
	SettleTimeout time.Duration
	// GiveBack is asked when the handler failed: if it reports true (the
	// worker is stopping, or its session was lost), the item is released
	// without counting the attempt instead of nacked. Nil: never.
	GiveBack func() bool
	// Log receives the attempt's logs. Nil: none.
	Log *zap.Logger
	// Ack acknowledges the item with the handler's record, with the
	// contract of claim.Queue.Ack. Nil: the queue's Ack.
	Ack AckFunc
}

// AckFunc acknowledges an item with its record, as claim.Queue.Ack does.
type AckFunc func(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error

// Result is what one attempt did.
type Result struct {
	Outcome Outcome
	// Err is why the item was not acked: the handler's error (a recovered
	// panic or a timeout included), or the error of the ack whose record
	// failed. Nil when acked.
	Err error
	// SettleErr is the error of the ack, nack or release that left the item
	// Unsettled, or of the ack whose outcome was unknown before a release.
	SettleErr error
	// Panicked and TimedOut report a handler that panicked or outlived
	// Options.Timeout.
	Panicked, TimedOut bool
}

// Run runs h on it and settles the item on q. ctx is the handler's parent
// context; the handler gets it bounded by o.Timeout.
func Run(ctx context.Context, q *claim.Queue, it claim.Item, h Handler, o Options) Result {
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	hctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var res Result
	record, err := call(hctx, h, it, &res)
	// The ack, nack or release must not die with the handler's context, but
	// is bounded: a lost session's claims are refused anyway.
	opCtx, opCancel := context.WithTimeout(context.WithoutCancel(hctx), o.SettleTimeout)
	defer opCancel()
	ack := o.Ack
	if ack == nil {
		ack = q.Ack
	}
	switch {
	case err == nil:
		err := ack(opCtx, it, record)
		switch {
		case err == nil:
			res.Outcome = Acked
			log.Debug("acked")
		case errors.Is(err, claim.ErrClaimLost):
			res.Outcome, res.Err, res.SettleErr = Unsettled, err, err
			log.Info("ack refused: the claim was lost; another session will handle the item", zap.Error(err))
		case errors.Is(err, retry.ErrCommitUnknown):
			log.Warn("ack outcome unknown; releasing the item if it is still ours", zap.Error(err))
			res.Err = err
			release(opCtx, q, it, &res, log)
			if res.Outcome == Unsettled {
				res.SettleErr = errors.Join(err, res.SettleErr)
			} else {
				res.SettleErr = err
			}
		default:
			// The result could not be recorded: the item runs again.
			res.Err = err
			nack(opCtx, q, it, err, &res, log)
		}
	case o.GiveBack != nil && o.GiveBack():
		// Shutdown gave up waiting, or the session was lost: give the item
		// back without counting the attempt (refused if the claim is gone).
		res.Err = err
		release(opCtx, q, it, &res, log)
	default:
		if errors.Is(err, context.DeadlineExceeded) && hctx.Err() != nil {
			res.TimedOut = true
			err = fmt.Errorf("item timed out after %v: %w", o.Timeout, err)
		}
		res.Err = err
		nack(opCtx, q, it, err, &res, log)
	}
	return res
}

// call runs the handler, turning a panic into an error.
func call(ctx context.Context, h Handler, it claim.Item, res *Result) (rec func(context.Context, pgx.Tx) error, err error) {
	defer func() {
		if p := recover(); p != nil {
			res.Panicked = true
			rec, err = nil, fmt.Errorf("handler panic: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx, it)
}

func nack(ctx context.Context, q *claim.Queue, it claim.Item, cause error, res *Result, log *zap.Logger) {
	out, err := q.Nack(ctx, it, cause)
	switch {
	case err != nil:
		res.Outcome, res.SettleErr = Unsettled, err
		log.Info("nack refused", zap.Error(err), zap.NamedError("cause", cause))
	case out == claim.Dead:
		res.Outcome = Dead
		log.Warn("item dead-lettered", zap.Error(cause))
	default:
		res.Outcome = Retried
		log.Info("item failed; will retry", zap.Error(cause))
	}
}

func release(ctx context.Context, q *claim.Queue, it claim.Item, res *Result, log *zap.Logger) {
	err := q.Release(ctx, it)
	if err == nil {
		res.Outcome = Released
		return
	}
	res.Outcome, res.SettleErr = Unsettled, err
	if !errors.Is(err, claim.ErrClaimLost) {
		log.Warn("release failed; the session's end releases the item", zap.Error(err))
	}
}
