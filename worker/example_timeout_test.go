package worker_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// An item with a timeout of its own: its handler's context ends at the
// item's deadline, not at the worker's ItemTimeout, and a run that times
// out is a failed attempt; after its last attempt the item is dead with
// the timeout as its error.
func ExampleWorker_Run_itemTimeout() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "thumbnails", BackoffBase: time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}

	// README:begin item-timeout
	// This item may take at most 50 ms a run, whatever the worker's
	// ItemTimeout (5 minutes by default).
	_, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("huge.png"), Timeout: 50 * time.Millisecond, MaxAttempts: 2})
	// README:end item-timeout
	if err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		<-ctx.Done() // a resize that takes longer than the item allows
		return nil, ctx.Err()
	}
	w, err := worker.New(q, handle, worker.Options{Concurrency: 1, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM crdbwork_dead_items`, 1)
	page, err := q.DeadItems(ctx, claim.DeadQuery{Limit: 1})
	if err != nil {
		log.Fatal(err)
	}
	d := page.Items[0]
	fmt.Println("attempts:", d.Attempts, "reason:", d.Reason)
	fmt.Println(strings.SplitN(d.LastError, ":", 2)[0])
	// Output:
	// attempts: 2 reason: failed
	// item timed out after 50ms (its own Timeout)
}
