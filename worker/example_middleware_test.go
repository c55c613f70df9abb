package worker_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Middleware wraps every handler run: here it counts the runs per attempt,
// as package otelcrdbwork's Middleware starts a span from the trace
// context in the item's headers.
func ExampleOptions_middleware() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE runs (item_id UUID PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	attempts := map[int]int{}
	counting := func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			mu.Lock()
			attempts[it.Attempt]++
			mu.Unlock()
			return next(ctx, it)
		}
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO runs (item_id) VALUES ($1)`, it.ID)
			return err
		}, nil
	}
	q, err := claim.New(pool, claim.Options{Queue: "counted"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{Middleware: counting, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")}); err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM runs`, 2)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("first attempts:", attempts[1])
	// Output:
	// first attempts: 2
}
