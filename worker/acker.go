package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
)

// ackers is the number of ack transactions a session runs at once. Two keep
// the handlers busy while one transaction commits: items that finish during
// a commit are gathered by the other acker instead of waiting for it.
const ackers = 2

// acker commits the acks of one session's handlers together (group commit):
// each acker goroutine takes the acks that are waiting, up to max, and
// commits them in one transaction with claim.Queue.AckEach. A handler's ack
// waits only for the transaction it joins, so batching adds no delay: the
// batch is whatever finished while the previous transaction ran.
type acker struct {
	q       *claim.Queue
	max     int
	timeout time.Duration
	reqs    chan ackReq
	wg      sync.WaitGroup
	observe func(n int) // told the size of each ack transaction; may be nil
}

type ackReq struct {
	claim.AckRequest
	done chan error
}

// startAcker starts the ack goroutines. Stop them with stop, once no ack is
// in flight.
func startAcker(q *claim.Queue, max int, timeout time.Duration, observe func(n int)) *acker {
	a := &acker{q: q, max: max, timeout: timeout, reqs: make(chan ackReq), observe: observe}
	a.wg.Add(ackers)
	for range ackers {
		go a.run()
	}
	return a
}

func (a *acker) run() {
	defer a.wg.Done()
	batch := make([]ackReq, 0, a.max)
	reqs := make([]claim.AckRequest, 0, a.max)
	for first := range a.reqs {
		batch = append(batch[:0], first)
	gather:
		for len(batch) < a.max {
			select {
			case r, ok := <-a.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		reqs = reqs[:0]
		for _, r := range batch {
			reqs = append(reqs, r.AckRequest)
		}
		// The acks run to the end whatever becomes of the handlers' contexts:
		// a handler waits for its answer, and a lost session's claims are
		// refused anyway.
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		errs := a.q.AckEach(ctx, reqs)
		cancel()
		if a.observe != nil {
			a.observe(len(reqs))
		}
		for i, r := range batch {
			r.done <- errs[i]
		}
	}
}

// ack acknowledges it with record in the next transaction of the acker, with
// the contract of claim.Queue.Ack. If ctx ends before the ack joined a
// transaction, nothing was done.
func (a *acker) ack(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error {
	done := make(chan error, 1)
	select {
	case a.reqs <- ackReq{AckRequest: claim.AckRequest{Item: it, Record: record}, done: done}:
		return <-done
	case <-ctx.Done():
		return fmt.Errorf("claim: ack of item %s: %w", it.ID, ctx.Err())
	}
}

// stop ends the ack goroutines. No ack may be in flight or start after it.
func (a *acker) stop() {
	close(a.reqs)
	a.wg.Wait()
}
