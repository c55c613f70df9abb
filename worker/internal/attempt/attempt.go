// Package attempt runs one attempt of a claimed item: the handler outside any
// transaction, bounded by the item timeout and with panics recovered (its
// Record's too), then the ack with the handler's record, or the nack with its
// error — retried until the item is settled, its claim is lost, or the
// session ends. Package worker and package workertest both run items through
// it, so a handler tested with workertest runs exactly as it does in a
// worker.
package attempt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
)

// Handler is worker.Handler with its Record as a plain function type, so
// that this package does not import worker.
type Handler func(ctx context.Context, it claim.Item) (func(ctx context.Context, tx pgx.Tx) error, error)

// Settler acks, nacks and releases claimed items; *claim.Queue is one.
type Settler interface {
	Ack(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error
	Nack(ctx context.Context, it claim.Item, cause error) (claim.Outcome, error)
	Release(ctx context.Context, it claim.Item) error
}

// CancelEnder is a Settler that can also end an item cancelled while its
// handler ran (claim.Queue.EndCancelled); *claim.Queue is one.
type CancelEnder interface {
	EndCancelled(ctx context.Context, it claim.Item) error
}

// TryBounder is a Settler that bounds each try itself, by the try timeout
// from the moment the try is asked, whatever the context it is called with
// says (Run calls it with Options.SettleCtx, whose end must not stop a try):
// Run then makes no context per try.
type TryBounder interface {
	BoundsTries()
}

// ValueAcker is a Settler that can also hand a value of the handler's (see
// SetValue) to a batch record with the item's ack.
type ValueAcker interface {
	AckValue(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error, value any) error
}

// valueKey is the context key of an attempt's value box.
type valueKey struct{}

// valueBox holds the value a handler set with SetValue, and the queue and
// item its checkpoints are saved on (checkpoint.go).
type valueBox struct {
	mu  sync.Mutex
	v   any
	set bool
	q   *claim.Queue
	it  *claim.Item // not copied: the caller's, unchanged while the attempt runs
	// kindKnown: a handler registered for the item's kind took it
	// (MarkKindKnown); atomic, as an abandonment reads it while the
	// handler may still run.
	kindKnown atomic.Bool
}

// MarkKindKnown records, in the attempt whose handler runs with ctx (or a
// context derived from it), that a handler registered for the item's kind
// took the item (worker.Kinds: the kind is one the program named, not any
// string a producer wrote). It reports false when ctx is not such a
// handler's context.
func MarkKindKnown(ctx context.Context) bool {
	b, ok := ctx.Value(valueKey{}).(*valueBox)
	if !ok {
		return false
	}
	b.kindKnown.Store(true)
	return true
}

// SetValue hands v on to the item's ack, for a batch record (see
// claim.AckRequest.Value), from a handler running under Run with ctx (or a
// context derived from it). It reports false when ctx is not such a
// handler's context.
func SetValue(ctx context.Context, v any) bool {
	b, ok := ctx.Value(valueKey{}).(*valueBox)
	if !ok {
		return false
	}
	b.mu.Lock()
	b.v, b.set = v, true
	b.mu.Unlock()
	return true
}

func (b *valueBox) get() (any, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.v, b.set
}

// Defaults for Options.
const (
	DefaultTryTimeout = 15 * time.Second
	DefaultGrace      = 2 * time.Second
	// The settle retries back off from minBackoff to maxBackoff, doubling,
	// with jitter.
	minBackoff = 20 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// Options configure Run.
type Options struct {
	// Timeout bounds the handler, unless its item has its own timeout
	// (claim.Item.Timeout), which bounds it instead.
	Timeout time.Duration
	// Grace is how long Run still waits for a handler whose context ended
	// (timed out, or cancelled) before it abandons it: it stops waiting,
	// settles the item without it, and reports Result.Abandoned. The
	// handler's goroutine runs on; its result is ignored. Default
	// DefaultGrace.
	Grace time.Duration
	// Settle is where the item is acked, nacked or released. Nil: the
	// queue given to Run.
	Settle Settler
	// SettleCtx bounds the retries of the ack, nack or release: while it
	// is live, a failed try is retried with backoff (unless the claim was
	// lost); once it ends, a failing settle is given up (the session's end
	// or the item's lease releases the item). The first try runs whatever
	// SettleCtx says. Nil: the handler's parent context given to Run.
	SettleCtx context.Context
	// TryTimeout bounds one try of an ack, nack or release. Default
	// DefaultTryTimeout.
	TryTimeout time.Duration
	// OnRetry, if set, is called before each retry of an ack, nack or
	// release.
	OnRetry func()
	// GiveBack is asked when the handler failed: if it reports true (the
	// worker is stopping, or its session was lost), the item is released
	// without counting the attempt instead of nacked. Nil: never.
	GiveBack func() bool
	// Log receives the attempt's logs. Nil: none.
	Log *zap.Logger
	// Explain, if set, returns the error a log line shows for a settle's
	// failure that a retry will not fix (the worker names the table and
	// the privileges of a refusal for lack of one).
	Explain func(ctx context.Context, err error) error
}

// Result is what one attempt did.
type Result struct {
	// Outcome is how the attempt ended (never the zero Outcome).
	Outcome claim.Outcome
	// Err is why the item was not acked: the handler's error (a recovered
	// panic or a timeout included), or the error of the ack whose record
	// failed. Nil when acked.
	Err error
	// SettleErr is the error of the ack, nack or release that left the item
	// Unsettled.
	SettleErr error
	// Unknown reports an ack whose outcome stays unknown: a try's commit
	// had no answer and a later try found the item no longer claimed, so
	// the first may have committed. Never counted as acked or as lost.
	Unknown bool
	// Tries counts the tries of the ack, nack or release (1 without a
	// failure).
	Tries int
	// Panicked and TimedOut report a handler (or its Record) that panicked,
	// or a handler that outlived Options.Timeout.
	Panicked, TimedOut bool
	// Abandoned reports a handler that had not returned Grace after its
	// context ended: Run stopped waiting for it. HandlerDone is closed when
	// its goroutine does return (at once for other handlers).
	Abandoned   bool
	HandlerDone <-chan struct{}
}

// handlerResult is what a handler's goroutine hands back.
type handlerResult struct {
	record   func(context.Context, pgx.Tx) error
	err      error
	panicked bool
}

// Run runs h on it and settles the item on q (or o.Settle). ctx is the
// handler's parent context; the handler gets it bounded by o.Timeout (or
// the item's own Timeout).
func Run(ctx context.Context, q *claim.Queue, it claim.Item, h Handler, o Options) Result {
	s, settleCtx, log := o.fill(q, ctx)
	box := &valueBox{q: q, it: &it}
	hctx, cancel := context.WithTimeout(context.WithValue(ctx, valueKey{}, box), TimeoutOf(&it, o.Timeout))
	defer cancel()
	var res Result
	done := make(chan struct{})
	res.HandlerDone = done
	out := make(chan handlerResult, 1)
	go func() {
		defer close(done)
		out <- call(hctx, h, it)
	}()
	var hr handlerResult
	select {
	case hr = <-out:
	case <-hctx.Done():
		grace := time.NewTimer(o.Grace)
		select {
		case hr = <-out:
		case <-grace.C:
			res.Abandoned = true
			hr.err = fmt.Errorf("the handler did not return within %v after its context ended (%w); abandoned", o.Grace, context.Cause(hctx))
			log.Error("handler abandoned: it ignores its context; its goroutine runs on", zap.Duration("grace", o.Grace))
		}
		grace.Stop()
	}
	var st settling
	conclude(&st, s, settleCtx, &it, hr, box, &o, &res, log, hctx.Err() != nil, context.Cause(ctx))
	return res
}

// conclude settles the item after its handler: hr is what the handler
// returned (or the abandonment's error), box its value box, hctxEnded
// whether the handler's own context had ended, and parentCause the cause of
// the end of the handler's parent context (the item's: a lost claim, a
// cancel, the session's end), nil while it is live. It fills res.
func conclude(st *settling, s Settler, settleCtx context.Context, it *claim.Item, hr handlerResult, box *valueBox, o *Options, res *Result, log *zap.Logger, hctxEnded bool, parentCause error) {
	res.Panicked = res.Panicked || hr.panicked
	err := hr.err
	*st = settling{s: s, it: it, ctx: settleCtx, tryTimeout: o.TryTimeout, res: res, log: log, onRetry: o.OnRetry, explain: o.Explain}
	_, st.bounded = s.(TryBounder)
	switch {
	case it.AtMostOnce:
		st.atMostOnce(hr, err, box)
	case errors.Is(parentCause, claim.ErrCancelled):
		// The item was cancelled while the handler ran: whatever it
		// returned, its result cannot be acked (the cancel moved the
		// claim's token on); the item ends as cancelled.
		res.Err = parentCause
		if !st.endCancelled() {
			res.Outcome = claim.Unsettled
			if res.SettleErr == nil {
				res.SettleErr = claim.ErrClaimLost
			}
		}
	case err == nil:
		v, hasValue := box.get()
		st.ack(recoverRecord(hr.record, res), v, hasValue)
	case errors.Is(parentCause, ErrGivenUp) || (o.GiveBack != nil && o.GiveBack()):
		// Shutdown gave up waiting, or the session was lost: give the item
		// back without counting the attempt (refused if the claim is gone).
		res.Err = err
		st.release()
	default:
		if errors.Is(err, context.DeadlineExceeded) && hctxEnded && parentCause == nil {
			res.TimedOut = true
			if it.Timeout > 0 {
				err = fmt.Errorf("item timed out after %v (its own Timeout): %w", it.Timeout, err)
			} else {
				err = fmt.Errorf("item timed out after %v: %w", o.Timeout, err)
			}
		}
		res.Err = err
		st.nack(err)
	}
}

// ErrGivenUp is the cause of a handler's context cancelled because the
// session gives up its item's part after the part's drain timed out: the
// item is given back without counting the attempt (unless the handler
// succeeded: then it is acked, while the claim lasts), to run again where
// the part goes.
var ErrGivenUp = errors.New("the item's part is being given up by this session (its drain timed out): the item runs again elsewhere")

// TimeoutOf returns how long the handler of it may run: its own Timeout
// (claim.NewItem.Timeout) if it has one, def otherwise.
func TimeoutOf(it *claim.Item, def time.Duration) time.Duration {
	if it.Timeout > 0 {
		return it.Timeout
	}
	return def
}

// call runs the handler, turning a panic into an error.
func call(ctx context.Context, h Handler, it claim.Item) (r handlerResult) {
	defer func() {
		if p := recover(); p != nil {
			r = handlerResult{err: fmt.Errorf("handler panic: %v\n%s", p, debug.Stack()), panicked: true}
		}
	}()
	rec, err := h(ctx, it)
	return handlerResult{record: rec, err: err}
}

// RecordPanicError is the error of a Record function that panicked: the
// panic is recovered in the ack transaction, which rolls back, and the item
// is nacked with this error's text.
type RecordPanicError struct {
	Value any
	Stack []byte
}

func (e *RecordPanicError) Error() string {
	return fmt.Sprintf("record panic: %v\n%s", e.Value, e.Stack)
}

// recordError marks an error returned by the handler's Record function.
type recordError struct{ err error }

func (e *recordError) Error() string { return e.err.Error() }
func (e *recordError) Unwrap() error { return e.err }

// recoverRecord wraps record so that its panics become errors and its errors
// are known as its own.
func recoverRecord(record func(context.Context, pgx.Tx) error, res *Result) func(context.Context, pgx.Tx) error {
	if record == nil {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = &recordError{&RecordPanicError{Value: p, Stack: debug.Stack()}}
			}
		}()
		if err := record(ctx, tx); err != nil {
			return &recordError{err}
		}
		return nil
	}
}

// settling acks, nacks or releases one item, retrying failed tries.
type settling struct {
	s          Settler
	it         *claim.Item
	ctx        context.Context
	tryTimeout time.Duration
	res        *Result
	log        *zap.Logger
	backoff    time.Duration
	onRetry    func()
	explain    func(ctx context.Context, err error) error
	// bounded: s is a TryBounder, which bounds each try itself.
	bounded bool
}

// try runs one try of op, bounded by tryTimeout, whatever the settle
// context says: a handler that finished after its session was lost still
// gets its answer.
func (st *settling) try(op func(ctx context.Context) error) error {
	st.res.Tries++
	if st.bounded {
		return op(st.ctx)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), st.tryTimeout)
	defer cancel()
	return op(ctx)
}

// explained returns err as Options.Explain shows it (err without it).
func (st *settling) explained(err error) error {
	if st.explain == nil {
		return err
	}
	return st.explain(st.ctx, err)
}

// again waits before the next try and reports whether there is one: not
// once the settle context ended.
func (st *settling) again(what string, err error) bool {
	if st.ctx.Err() != nil {
		st.log.Warn(what+" failed and the session ended: the session's end or the item's lease releases it", zap.Error(err), zap.Int("tries", st.res.Tries))
		return false
	}
	st.backoff = min(max(2*st.backoff, minBackoff), maxBackoff)
	d := st.backoff/2 + rand.N(st.backoff/2+1)
	if st.res.Tries == 1 {
		st.log.Warn(what+" failed; retrying until it is settled", zap.Error(err))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		if st.onRetry != nil {
			st.onRetry()
		}
		return true
	case <-st.ctx.Done():
		st.log.Warn(what+" failed and the session ended: the session's end or the item's lease releases it", zap.Error(err), zap.Int("tries", st.res.Tries))
		return false
	}
}

// Unknown reports whether err says that a statement or commit may or may not
// have taken effect.
func Unknown(err error) bool {
	return errors.Is(err, retry.ErrCommitUnknown)
}

// ack acks the item with record, retrying until it is settled: a database
// failure never throws the handler's result away (the ack runs again, and
// record with it); only a failure of record itself (its error, its panic, or
// a COMMIT refused because of what it wrote) nacks the item.
func (st *settling) ack(record func(context.Context, pgx.Tx) error, value any, hasValue bool) {
	st.ackFrom(st.tryAck(record, value, hasValue), record, value, hasValue)
}

// tryAck runs one try of the ack.
func (st *settling) tryAck(record func(context.Context, pgx.Tx) error, value any, hasValue bool) error {
	va, withValue := st.s.(ValueAcker)
	withValue = withValue && hasValue
	return st.try(func(ctx context.Context) error {
		if withValue {
			return va.AckValue(ctx, *st.it, record, value)
		}
		return st.s.Ack(ctx, *st.it, record)
	})
}

// ackFrom goes on with the ack after a try that returned err: it settles
// the item, trying again as ack says.
func (st *settling) ackFrom(err error, record func(context.Context, pgx.Tx) error, value any, hasValue bool) {
	res := st.res
	for {
		switch {
		case err == nil:
			res.Outcome, res.Err, res.SettleErr = claim.Acked, nil, nil
			if res.Tries > 1 {
				st.log.Info("acked after retries", zap.Int("tries", res.Tries))
			}
			return
		case errors.Is(err, claim.ErrClaimLost):
			if st.endCancelled() {
				// Cancelled after the handler returned: the ack was
				// refused and nothing of it committed.
				res.Err = fmt.Errorf("%w: %w", claim.ErrCancelled, err)
				return
			}
			res.Outcome, res.SettleErr = claim.Unsettled, err
			if res.Unknown {
				res.Err = fmt.Errorf("ack outcome unknown: an earlier try's commit had no answer and the item is no longer claimed: %w", err)
				st.log.Warn("ack outcome unknown: the item is no longer ours; it was acked by the unanswered try, or released", zap.Error(err))
			} else {
				res.Err = err
				st.log.Info("ack refused: the claim was lost; another session will handle the item", zap.Error(err))
			}
			return
		case Unknown(err):
			res.Unknown = true
			if !st.again("ack (outcome unknown)", err) {
				res.Outcome, res.Err, res.SettleErr = claim.Unsettled, err, err
				return
			}
		case recordPanicked(err), errors.Is(err, claim.ErrRecordPanic):
			res.Panicked = true
			res.Err = err
			st.nack(err)
			return
		case recordFailure(err) != nil && !Transient(recordFailure(err).err):
			// The result could not be recorded: the item runs again.
			res.Err = recordFailure(err).err
			st.nack(res.Err)
			return
		case !Transient(err) && recordFailure(err) == nil:
			// The database refused the transaction for what it wrote (a
			// constraint checked at COMMIT, say): the record's failure.
			res.Err = err
			st.nack(err)
			return
		default:
			if !st.again("ack", err) {
				res.Outcome, res.Err, res.SettleErr = claim.Unsettled, err, err
				return
			}
		}
		err = st.tryAck(record, value, hasValue)
	}
}

// recordPanicked reports whether err is a Record's panic. (A function, so
// that the target errors.As needs is allocated on failures only.)
func recordPanicked(err error) bool {
	var p *RecordPanicError
	return errors.As(err, &p)
}

// recordFailure returns the Record's error in err's tree, or nil.
func recordFailure(err error) *recordError {
	var r *recordError
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// atMostOnce settles an at-most-once item: its claim deleted it, so a
// failed handler drops it, and a successful one's record is written by one
// ack try, never retried (with no claim left to fence it, a retry after an
// unknown outcome could write the record twice).
func (st *settling) atMostOnce(hr handlerResult, err error, box *valueBox) {
	res := st.res
	if err == nil {
		v, hasValue := box.get()
		record := recoverRecord(hr.record, res)
		va, withValue := st.s.(ValueAcker)
		err = st.try(func(ctx context.Context) error {
			if withValue && hasValue {
				return va.AckValue(ctx, *st.it, record, v)
			}
			return st.s.Ack(ctx, *st.it, record)
		})
		if err == nil {
			res.Outcome, res.Err = claim.Acked, nil
			return
		}
		res.Unknown = Unknown(err)
		var panicErr *RecordPanicError
		if errors.As(err, &panicErr) || errors.Is(err, claim.ErrRecordPanic) {
			res.Panicked = true
		}
	}
	res.Outcome, res.Err = claim.Dropped, err
	st.log.Warn("at-most-once item dropped: it is not retried", zap.Error(err), zap.Bool("outcome_unknown", res.Unknown))
}

// nack nacks the item with cause, retrying until it is settled.
func (st *settling) nack(cause error) {
	res := st.res
	for {
		var out claim.Outcome
		err := st.try(func(ctx context.Context) error {
			var err error
			out, err = st.s.Nack(ctx, *st.it, cause)
			return err
		})
		switch {
		case err == nil && out == claim.Dead:
			res.Outcome, res.SettleErr = claim.Dead, nil
			st.log.Warn("item dead-lettered", zap.Error(cause))
			return
		case err == nil && out == claim.Snoozed:
			res.Outcome, res.SettleErr = claim.Snoozed, nil
			st.log.Debug("item snoozed", zap.Error(cause))
			return
		case err == nil:
			res.Outcome, res.SettleErr = claim.Retried, nil
			st.log.Info("item failed; will retry", zap.Error(cause))
			return
		case errors.Is(err, claim.ErrClaimLost):
			if st.endCancelled() {
				return
			}
			res.Outcome, res.SettleErr = claim.Unsettled, err
			st.log.Info("nack refused: the claim was lost", zap.Error(err), zap.NamedError("cause", cause))
			return
		case errors.Is(err, claim.ErrDeadLetterFailed):
			// Settled: the item is out of claims for good, and the reaper
			// moves it to the dead items once the database lets it.
			res.Outcome, res.SettleErr = claim.Dead, nil
			st.log.Error("item failed for good, but the database refused its move to the dead items: it is held out of claims for the reaper",
				zap.Error(st.explained(err)), zap.NamedError("cause", cause))
			return
		case !Transient(err):
			// A retry would be refused the same way: the item's lease (or
			// its session's end) releases it, and its attempts bound how
			// often that can happen.
			res.Outcome, res.SettleErr = claim.Unsettled, err
			st.log.Error("nack failed for a reason a retry will not fix; the item's lease releases it", zap.Error(st.explained(err)), zap.NamedError("cause", cause))
			return
		case !st.again("nack", err):
			res.Outcome, res.SettleErr = claim.Unsettled, err
			return
		}
	}
}

// release gives the item back, retrying until it is settled.
func (st *settling) release() {
	res := st.res
	for {
		err := st.try(func(ctx context.Context) error { return st.s.Release(ctx, *st.it) })
		switch {
		case err == nil:
			res.Outcome, res.SettleErr = claim.Released, nil
			return
		case errors.Is(err, claim.ErrClaimLost):
			res.Outcome, res.SettleErr = claim.Unsettled, err
			return
		case !st.again("release", err):
			res.Outcome, res.SettleErr = claim.Unsettled, err
			return
		}
	}
}

// endCancelled ends the item as cancelled if the Settler can
// (CancelEnder) and the item is one whose cancel was asked for while this
// claim held it, retrying failures as the other settles do; it reports
// whether it did (then the outcome is Cancelled). Its tries count in
// Result.Tries only when it did: after a lost claim that was no cancel,
// the result reads as before.
func (st *settling) endCancelled() (ended bool) {
	ce, ok := st.s.(CancelEnder)
	if !ok {
		return false
	}
	tries := st.res.Tries
	defer func() {
		if !ended {
			st.res.Tries = tries
		}
	}()
	for {
		err := st.try(func(ctx context.Context) error { return ce.EndCancelled(ctx, *st.it) })
		switch {
		case err == nil:
			st.res.Outcome, st.res.SettleErr = claim.Cancelled, nil
			st.log.Info("item cancelled while its handler ran: ended as cancelled, its result not written")
			return true
		case errors.Is(err, claim.ErrClaimLost):
			return false
		case !st.again("ending the cancelled item", err):
			st.res.SettleErr = err
			return false
		}
	}
}
