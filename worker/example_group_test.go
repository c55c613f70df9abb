package worker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Work three queues in one process with one group: one session (one
// heartbeat tells the fleet the process is alive; its end releases every
// queue's items), one wake-up listener, and a pool that OpenGroup sizes
// for the queues; each queue has its own handler, concurrency and parts.
func ExampleOpenGroup() {
	ctx := context.Background()
	url, drop := exampleSchemaURL(ctx)
	defer drop()

	// README:begin group
	// done records a handled item in the ack's transaction.
	done := func(queue string) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			// ... the queue's slow work, outside any transaction ...
			return worker.Exec(`INSERT INTO handled (queue, payload) VALUES ($1, $2)`, queue, string(it.Payload)), nil
		}
	}
	g, err := worker.OpenGroup(ctx, url, []worker.QueueConfig{
		{Claim: claim.Options{Queue: "emails"}, Handler: done("emails"), Options: worker.Options{Concurrency: 20}},
		{Claim: claim.Options{Queue: "reports"}, Handler: done("reports"), Options: worker.Options{Concurrency: 2}},
		{Claim: claim.Options{Queue: "orders"}, Handler: done("orders"), Options: worker.Options{Concurrency: 8, Parts: 16}},
	}, worker.GroupOptions{
		Name:    "app-1",
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close() // the pool, after Run returned
	// README:end group

	if _, err := g.Pool().Exec(ctx, `CREATE TABLE handled (queue TEXT NOT NULL, payload TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	for _, queue := range []string{"emails", "reports", "orders"} {
		if _, err := g.Queue(queue).Enqueue(ctx, claim.NewItem{Payload: []byte("first " + queue)}); err != nil {
			log.Fatal(err)
		}
	}
	runGroupUntil(ctx, g, `SELECT count(*) FROM handled`, 3)
	fmt.Println("pool connections:", g.Pool().Config().MaxConns, "- used by the group:", g.PoolConns())
	st := g.Stats()
	fmt.Println("acked:", st["emails"].Acked, st["reports"].Acked, st["orders"].Acked)
	// Output:
	// pool connections: 18 - used by the group: 16
	// acked: 1 1 1
}

// exampleSchemaURL returns the URL of a fresh database with the crdbwork
// schema, and a function that drops it.
func exampleSchemaURL(ctx context.Context) (string, func()) {
	url, drop := testdb.ExampleURL()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		drop()
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		drop()
		log.Fatal(err)
	}
	return url, drop
}

// runGroupUntil runs g until query (on g's pool) counts want rows (at most
// 10 s, stretched with the machine's load), then stops it gracefully.
func runGroupUntil(ctx context.Context, g *worker.Group, query string, want int) {
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- g.Run(runCtx) }()
	for deadline := time.Now().Add(await.Stretch(10 * time.Second)); ; time.Sleep(20 * time.Millisecond) { // a poll, not a wait
		var n int
		if err := g.Pool().QueryRow(ctx, query).Scan(&n); err != nil {
			log.Fatal(err)
		}
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("only %d of %d results", n, want)
		}
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
}
