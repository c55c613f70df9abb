package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
)

// errStopped is returned for a settle asked of an acker that has stopped.
var errStopped = errors.New("worker: the session's settle goroutines have stopped")

// acker settles the items of one session's handlers on a fixed set of
// goroutines, each using at most one connection at a time: handlers never
// hold a connection, so the connections a worker needs do not grow with its
// Concurrency. Acks are committed together (group commit): a goroutine takes
// the acks that are waiting, up to max, and commits them in one transaction
// with claim.Queue.AckMany. A handler's ack waits only for the transaction it
// joins, so batching adds no delay: the batch is whatever finished while the
// previous transaction ran. Nacks and releases run one by one on the same
// goroutines.
type acker struct {
	q   *claim.Queue
	max int
	// queue holds the requests no settle goroutine has taken yet, in the
	// order asked; ready is signalled (without blocking) when it may hold
	// some: a request waits for its answer only, never for a goroutine to
	// take it.
	mu    sync.Mutex
	queue []settleReq
	ready chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	// observe, if not nil, is told the size of each ack transaction.
	observe func(n int)
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
	item     claim.Item
	record   func(context.Context, pgx.Tx) error
	value    any
	cause    error
	done     chan settleAnswer
}

type settleAnswer struct {
	out claim.Outcome
	err error
}

// startAcker starts n settle goroutines, each acking up to max items in one
// transaction, telling observe (if not nil) the size of each, and recording
// each transaction's results with ackOpts; each try is bounded by
// tryTimeout from when it was asked, with a context derived from base.
// Stop them with stop.
func startAcker(q *claim.Queue, n, max int, observe func(n int), ackOpts claim.AckOptions, base context.Context, tryTimeout time.Duration) *acker {
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
			return // the requests still waiting are taken back by their askers
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
				r.done <- settleAnswer{err: fmt.Errorf("claim: settling item %s: %w", r.item.ID, context.DeadlineExceeded)}
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
				reqs = append(reqs, claim.AckRequest{Item: r.item, Record: r.record, Value: r.value})
			}
			// Each request carries its own bound, the try timeout from
			// when it was asked: the last asked has the loosest.
			ctx, cancel := context.WithDeadline(a.base, acks[len(acks)-1].deadline)
			errs := a.q.AckMany(ctx, reqs, a.ackOpts)
			cancel()
			if a.observe != nil {
				a.observe(len(reqs))
			}
			for i, r := range acks {
				r.done <- settleAnswer{err: errs[i]}
			}
			clear(acks) // the records and values are not kept past their transaction
			clear(reqs)
		}
		for _, r := range others {
			var ans settleAnswer
			ctx, cancel := context.WithDeadline(a.base, r.deadline)
			switch r.kind {
			case nackKind:
				ans.out, ans.err = a.q.Nack(ctx, r.item, r.cause)
			case endCancelKind:
				ans.err = a.q.EndCancelled(ctx, r.item)
			default:
				ans.err = a.q.Release(ctx, r.item)
			}
			cancel()
			r.done <- ans
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

// do hands r to a settle goroutine and waits for its answer. The try is
// bounded by tryTimeout from now: a settle goroutine that takes it later
// answers with context.DeadlineExceeded without trying. If the acker
// stopped before a goroutine took it, nothing was done.
func (a *acker) do(r settleReq) settleAnswer {
	r.deadline = time.Now().Add(a.tryTimeout)
	r.done = answers.Get().(chan settleAnswer)
	a.mu.Lock()
	a.queue = append(a.queue, r)
	a.mu.Unlock()
	a.signal()
	select {
	case ans := <-r.done:
		answers.Put(r.done) // empty again: a settle goroutine answers each request once
		return ans
	case <-a.quit:
	}
	// Stopped: take it back if no goroutine took it; a goroutine that did
	// answers it.
	a.mu.Lock()
	for i := range a.queue {
		if a.queue[i].done == r.done {
			a.queue = slices.Delete(a.queue, i, i+1)
			a.mu.Unlock()
			answers.Put(r.done) // never sent: nobody answers on it
			return settleAnswer{err: fmt.Errorf("claim: settling item %s: %w", r.item.ID, errStopped)}
		}
	}
	a.mu.Unlock()
	ans := <-r.done
	answers.Put(r.done)
	return ans
}

// BoundsTries marks the acker as an attempt.TryBounder: it bounds each try
// itself (do), and the contexts its methods are given only carry values.
func (*acker) BoundsTries() {}

// Ack acknowledges it with record in the next transaction of a settle
// goroutine, with the contract of claim.Queue.Ack.
func (a *acker) Ack(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error {
	return a.do(settleReq{kind: ackKind, item: it, record: record}).err
}

// AckValue is Ack with the value the handler set with RecordValue, handed to
// the batch record.
func (a *acker) AckValue(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error, value any) error {
	return a.do(settleReq{kind: ackKind, item: it, record: record, value: value}).err
}

// Nack is claim.Queue.Nack on a settle goroutine.
func (a *acker) Nack(ctx context.Context, it claim.Item, cause error) (claim.Outcome, error) {
	ans := a.do(settleReq{kind: nackKind, item: it, cause: cause})
	return ans.out, ans.err
}

// Release is claim.Queue.Release on a settle goroutine.
func (a *acker) Release(ctx context.Context, it claim.Item) error {
	return a.do(settleReq{kind: releaseKind, item: it}).err
}

// EndCancelled is claim.Queue.EndCancelled on a settle goroutine.
func (a *acker) EndCancelled(ctx context.Context, it claim.Item) error {
	return a.do(settleReq{kind: endCancelKind, item: it}).err
}

// stop ends the settle goroutines once they finish what they are doing;
// later settles fail with errStopped. It does not wait for them.
func (a *acker) stop() {
	a.once.Do(func() { close(a.quit) })
}
