package worker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Run a worker woken by the idle probe instead of LISTEN, as it is by
// default on CockroachDB: while it idles, its process reads the queue every
// 50 ms (one read-only statement per queue, whatever the number of
// workers) and wakes it when another process enqueued; its own claims,
// while the probe answers, come only every 5 s.
func ExampleWakeMode() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (name TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO reports (name) VALUES ($1)`, string(it.Payload))
			return err
		}, nil
	}, worker.Options{
		Wake:       worker.WakeProbe,
		ProbeEvery: 50 * time.Millisecond,
		ProbePoll:  5 * time.Second,
		Session:    session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("weekly")}); err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM reports`, 1)
	fmt.Println("wake-ups by:", worker.WakeProbe, "- acked:", w.Stats().Acked)
	// Output:
	// wake-ups by: probe - acked: 1
}
