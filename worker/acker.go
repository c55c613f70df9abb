package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// errStopped is returned for a settle asked of an acker that has stopped.
var errStopped = errors.New("worker: the session's settle goroutines have stopped")

// acker settles the items of one session's handlers on a fixed set of
// goroutines, each using at most one connection at a time: handlers never
// hold a connection, so the connections a worker needs do not grow with its
// Concurrency. Acks are committed together (group commit): a goroutine takes
// the acks that are waiting, up to max, and commits them in one transaction
// with claim.Queue.AckMany. An ack waits only for the transaction it joins,
// so batching adds no delay: the batch is whatever finished while the
// previous transaction ran. An item's ack asked with AckAsync is not waited
// for at all: the goroutine that commits it ends the item. Nacks and
// releases run one by one on the same goroutines.
type acker struct {
	q   *claim.Queue
	max int
	// queue holds the requests no settle goroutine has taken yet, in the
	// order asked; ready is signalled (without blocking) when it may hold
	// some: a request waits for its answer only, never for a goroutine to
	// take it.
	mu    sync.Mutex
	queue []settleReq
	// stopped: stop has run; requests asked later are answered at once.
	stopped bool
	ready   chan struct{}
	quit    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	// observe, if not nil, is told of each ack transaction: its requests
	// and their errors.
	observe func(reqs []claim.AckRequest, errs []error)
	// ackOpts record the results of each ack transaction in one call or
	// statement (claim.AckOptions.Batch and Statement).
	ackOpts claim.AckOptions
	// base is the parent of the contexts of the tries (the session's
	// settle context, without its cancellation: a try runs whatever it
	// says); tryTimeout bounds each try from the moment it is asked (the
	// acker is an attempt.TryBounder: no context per try).
	base       context.Context
	tryTimeout time.Duration
}

type settleKind int

const (
	ackKind settleKind = iota
	nackKind
	releaseKind
	endCancelKind
)

type settleReq struct {
	// deadline bounds the try: tryTimeout after it was asked.
	deadline time.Time
	kind     settleKind
	item     *claim.Item // unchanged until the request is answered
	record   func(context.Context, pgx.Tx) error
	value    any
	cause    error
	// done receives the answer; or, for an ack asked with AckAsync,
	// waiter is told it.
	done   chan settleAnswer
	waiter attempt.AckWaiter
}

// answer hands r its answer.
func (r *settleReq) answer(ans settleAnswer) {
	if r.waiter != nil {
		r.waiter.AckAnswered(ans.err)
		return
	}
	r.done <- ans
}

type settleAnswer struct {
	out claim.Outcome
	err error
}

// startAcker starts n settle goroutines, each acking up to max items in one
// transaction, telling observe (if not nil) of each, and recording
// each transaction's results with ackOpts; each try is bounded by
// tryTimeout from when it was asked, with a context derived from base.
// Stop them with stop.
func startAcker(q *claim.Queue, n, max int, observe func(reqs []claim.AckRequest, errs []error), ackOpts claim.AckOptions, base context.Context, tryTimeout time.Duration) *acker {
	a := &acker{q: q, max: max, ready: make(chan struct{}, 1), quit: make(chan struct{}), observe: observe, ackOpts: ackOpts,
		base: base, tryTimeout: tryTimeout}
	a.wg.Add(n)
	for range n {
		go a.run()
	}
	return a
}

func (a *acker) run() {
	defer a.wg.Done()
	acks := make([]settleReq, 0, a.max)
	var others []settleReq
	reqs := make([]claim.AckRequest, 0, a.max)
	var taken []settleReq
	for {
		select {
		case <-a.quit:
			return // stop answers the requests still waiting
		default:
		}
		taken = a.take(taken[:0])
		if len(taken) == 0 {
			select {
			case <-a.ready:
				continue
			case <-a.quit:
				return
			}
		}
		acks, others = acks[:0], others[:0]
		now := time.Now()
		for _, r := range taken {
			switch {
			case now.After(r.deadline):
				// It waited for a settle goroutine past its try's bound:
				// the try timed out before it started.
				r.answer(settleAnswer{err: fmt.Errorf("claim: settling item %s: %w", r.item.ID, context.DeadlineExceeded)})
			case r.kind == ackKind:
				acks = append(acks, r)
			default:
				others = append(others, r)
			}
		}
		clear(taken)
		if len(acks) > 0 {
			reqs = reqs[:0]
			for _, r := range acks {
				reqs = append(reqs, claim.AckRequest{Item: *r.item, Record: r.record, Value: r.value})
			}
			// Each request carries its own bound, the try timeout from
			// when it was asked: the last asked has the loosest.
			ctx, cancel := context.WithDeadline(a.base, acks[len(acks)-1].deadline)
			errs := a.q.AckMany(ctx, reqs, a.ackOpts)
			cancel()
			if a.observe != nil {
				a.observe(reqs, errs)
			}
			for i := range acks {
				acks[i].answer(settleAnswer{err: errs[i]})
			}
			clear(acks) // the records and values are not kept past their transaction
			clear(reqs)
		}
		for _, r := range others {
			var ans settleAnswer
			ctx, cancel := context.WithDeadline(a.base, r.deadline)
			switch r.kind {
			case nackKind:
				ans.out, ans.err = a.q.Nack(ctx, *r.item, r.cause)
			case endCancelKind:
				ans.err = a.q.EndCancelled(ctx, *r.item)
			default:
				ans.err = a.q.Release(ctx, *r.item)
			}
			cancel()
			r.answer(ans)
		}
		clear(others)
	}
}

// answers recycles the answer channels of settle requests (one per item
// otherwise).
var answers = sync.Pool{New: func() any { return make(chan settleAnswer, 1) }}

// take moves up to max of the waiting requests to buf (the first asked
// first), and signals ready again if some are left, for another settle
// goroutine.
func (a *acker) take(buf []settleReq) []settleReq {
	a.mu.Lock()
	n := min(len(a.queue), a.max)
	buf = append(buf, a.queue[:n]...)
	rest := copy(a.queue, a.queue[n:])
	clear(a.queue[rest:])
	a.queue = a.queue[:rest]
	a.mu.Unlock()
	if rest > 0 {
		a.signal()
	}
	return buf
}

func (a *acker) signal() {
	select {
	case a.ready <- struct{}{}:
	default:
	}
}

// ask queues r for a settle goroutine, bounding its try by tryTimeout from
// now (a settle goroutine that takes it later answers with
// context.DeadlineExceeded without trying), or answers it with errStopped
// if the acker has stopped.
func (a *acker) ask(r settleReq) {
	r.deadline = time.Now().Add(a.tryTimeout)
	a.mu.Lock()
	if a.stopped {
		a.mu.Unlock()
		r.answer(settleAnswer{err: fmt.Errorf("claim: settling item %s: %w", r.item.ID, errStopped)})
		return
	}
	a.queue = append(a.queue, r)
	a.mu.Unlock()
	a.signal()
}

// do hands r to a settle goroutine and waits for its answer (see ask).
func (a *acker) do(r settleReq) settleAnswer {
	r.done = answers.Get().(chan settleAnswer)
	a.ask(r)
	ans := <-r.done
	answers.Put(r.done) // empty again: each request is answered once
	return ans
}

// BoundsTries marks the acker as an attempt.TryBounder: it bounds each try
// itself (ask), and the contexts its methods are given only carry values.
func (*acker) BoundsTries() {}

// AckAsync asks for it to be acked with record (and value, if hasValue) in
// the next transaction of a settle goroutine, which then tells w the
// outcome (attempt.AsyncAcker).
func (a *acker) AckAsync(it *claim.Item, record func(context.Context, pgx.Tx) error, value any, hasValue bool, w attempt.AckWaiter) {
	if !hasValue {
		value = nil
	}
	a.ask(settleReq{kind: ackKind, item: it, record: record, value: value, waiter: w})
}

// Ack acknowledges it with record in the next transaction of a settle
// goroutine, with the contract of claim.Queue.Ack.
func (a *acker) Ack(_ context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error {
	return a.do(settleReq{kind: ackKind, item: &it, record: record}).err
}

// AckValue is Ack with the value the handler set with RecordValue, handed to
// the batch record.
func (a *acker) AckValue(_ context.Context, it claim.Item, record func(context.Context, pgx.Tx) error, value any) error {
	return a.do(settleReq{kind: ackKind, item: &it, record: record, value: value}).err
}

// Nack is claim.Queue.Nack on a settle goroutine.
func (a *acker) Nack(_ context.Context, it claim.Item, cause error) (claim.Outcome, error) {
	ans := a.do(settleReq{kind: nackKind, item: &it, cause: cause})
	return ans.out, ans.err
}

// Release is claim.Queue.Release on a settle goroutine.
func (a *acker) Release(_ context.Context, it claim.Item) error {
	return a.do(settleReq{kind: releaseKind, item: &it}).err
}

// EndCancelled is claim.Queue.EndCancelled on a settle goroutine.
func (a *acker) EndCancelled(_ context.Context, it claim.Item) error {
	return a.do(settleReq{kind: endCancelKind, item: &it}).err
}

// stop ends the settle goroutines once they finish what they are doing,
// and answers the requests none has taken, and those asked later, with
// errStopped. It does not wait for the goroutines.
func (a *acker) stop() {
	a.once.Do(func() {
		a.mu.Lock()
		a.stopped = true
		left := a.queue
		a.queue = nil
		a.mu.Unlock()
		close(a.quit)
		for i := range left {
			left[i].answer(settleAnswer{err: fmt.Errorf("claim: settling item %s: %w", left[i].item.ID, errStopped)})
		}
	})
}
