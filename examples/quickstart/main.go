// Command quickstart is the library quick start of the README and of
// docs/getting-started.md: it applies the schema, enqueues three e-mails in a
// transaction of its own, and works them off with a worker that records each
// receipt inside the ack transaction.
//
//	DATABASE_URL='postgresql://root@localhost:26257/app?sslmode=disable' go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("DATABASE_URL")); err != nil {
		log.Fatal(err)
	}
}

// workerOptions are the worker's options. ConfigurePool sets up the pool
// from them, so that the server ends a transaction left idle longer than the
// session expiry (a worker frozen mid-ack would otherwise keep its locks).
var workerOptions = worker.Options{Concurrency: 16, Parts: 16}

func run(ctx context.Context, url string) error {
	pool, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		return err
	}
	ids, err := produce(ctx, pool, q)
	if err != nil {
		return err
	}
	// A service would run the worker until it is told to stop; this program
	// stops it once its three e-mails are sent.
	wctx, stopWorker := context.WithCancel(ctx)
	defer stopWorker()
	done := make(chan error, 1)
	go func() { done <- work(wctx, q) }()
	if err := waitSent(ctx, pool, ids, done); err != nil {
		return err
	}
	stopWorker()
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("sent %d e-mails\n", len(ids))
	return nil
}

// connect opens the pool, configured for the worker, and applies the
// crdbwork schema (or apply sql/schema.sql yourself) and the handler's
// results table.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if err := worker.ConfigurePool(cfg, workerOptions); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS sent (
		item_id UUID PRIMARY KEY, receipt TEXT NOT NULL)`); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// README:begin
// produce enqueues three e-mails inside a transaction of its own: they exist
// only if it commits. The queue gets its parts first: an item's part is fixed
// when it is enqueued, and a queue without a stored count has one part. On
// CockroachDB any transaction may have to run again (SQLSTATE 40001, at any
// statement or at COMMIT): crdb.ExecuteCtx runs it again, whole.
func produce(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue) (ids []uuid.UUID, err error) {
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Parts: workerOptions.Parts}); err != nil {
		return nil, err
	}
	err = crdb.ExecuteCtx(ctx, func(ctx context.Context, _ ...any) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op once committed
		// ... your own writes in tx ...
		res, err := q.EnqueueTx(ctx, tx,
			claim.NewItem{Payload: []byte("Hello Ada"), Key: "ada"},
			claim.NewItem{Payload: []byte("Hello Grace"), Key: "grace"},
			claim.NewItem{Payload: []byte("Hello Edsger"), Key: "edsger", Priority: -1})
		if err != nil {
			return err
		}
		ids = res.IDs
		return tx.Commit(ctx)
	})
	return ids, err
}

// work runs a worker on q until ctx ends, then stops gracefully.
func work(ctx context.Context, q *claim.Queue) error {
	w, err := worker.New(q, sendEmail, workerOptions)
	if err != nil {
		return err
	}
	return w.Run(ctx)
}

// sendEmail is the handler: the slow work outside any transaction, its
// result written inside the ack transaction.
func sendEmail(ctx context.Context, it claim.Item) (worker.Record, error) {
	receipt, err := send(ctx, it.Payload, it.ID.String()) // the item id as idempotency key
	if err != nil {
		return nil, err // nack: retried with backoff, dead-lettered after MaxAttempts
	}
	return worker.Exec(`INSERT INTO sent (item_id, receipt) VALUES ($1, $2)`, it.ID, receipt), nil
}

// README:end

// send stands in for a mail provider's API.
func send(ctx context.Context, body []byte, idempotencyKey string) (receipt string, err error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: %d bytes", idempotencyKey, len(body)), nil
}

// waitSent waits until every item of ids has its row in sent.
func waitSent(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, workerDone <-chan error) error {
	for {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM sent WHERE item_id = ANY($1)`, ids).Scan(&n)
		if err != nil {
			return err
		}
		if n == len(ids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-workerDone:
			return fmt.Errorf("the worker stopped early: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
