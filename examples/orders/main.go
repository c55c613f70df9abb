// Command orders is the order pipeline of docs/migrating.md, the program
// that page writes with River, Oban, pg-boss and graphile-worker too: a shop
// stores an order and enqueues its charge in one transaction; a worker
// charges the card through a payment gateway (which times out once for one
// of the cards), retries with backoff, and records the charge exactly once,
// in the transaction that acknowledges the item; a periodic cleanup deletes
// orders left unpaid for a week. Charges and cleanups are two kinds, with a
// typed handler each, in two queues that one worker group works.
//
//	DATABASE_URL='postgresql://root@localhost:26257/app?sslmode=disable' go run ./examples/orders
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/schedule"
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

// README:begin setup
// Charge and Cleanup are the typed arguments of the two kinds of items, as
// River's JobArgs: the kind names the handler, the fields travel as the
// item's JSON payload.
type Charge struct {
	OrderID uuid.UUID `json:"order_id"`
	Card    string    `json:"card"`
	Cents   int64     `json:"cents"`
}

func (Charge) Kind() string { return "charge" }

type Cleanup struct{}

func (Cleanup) Kind() string { return "cleanup" }

// The queues, as Oban's queues: [orders: 10, maintenance: 1]. Retries of
// the charges: backoff from 100 ms doubling up to 10 s, with jitter (the
// defaults are 1 s and 1 h); a charge has 5 attempts (placeOrder).
var (
	ordersQueue        = claim.Options{Queue: "orders", BackoffBase: 100 * time.Millisecond, BackoffMax: 10 * time.Second}
	maintenanceQueue   = claim.Options{Queue: "maintenance"}
	ordersOptions      = worker.Options{Concurrency: 10}
	maintenanceOptions = worker.Options{Concurrency: 1}
)

// serve runs what River's started client runs: one group that works both
// queues with one session (a handler per kind in each), and the schedule
// runner, until ctx ends. Every process of the service runs the same; no
// leader is elected.
func serve(ctx context.Context, pool *pgxpool.Pool, gw *gateway) error {
	orders, err := claim.New(pool, ordersQueue)
	if err != nil {
		return err
	}
	maintenance, err := claim.New(pool, maintenanceQueue)
	if err != nil {
		return err
	}
	charges, cleanups := worker.NewKinds(), worker.NewKinds()
	worker.AddKind(charges, chargeHandler(gw))
	worker.AddKind(cleanups, cleanup)
	g, err := worker.NewGroup([]worker.QueueConfig{
		{Queue: orders, Handler: charges.Handler(), Options: ordersOptions},
		{Queue: maintenance, Handler: cleanups.Handler(), Options: maintenanceOptions},
	}, worker.GroupOptions{Name: "shop"})
	if err != nil {
		return err
	}
	// One cleanup per hour, whichever process enqueues it (the database
	// makes it one item per period); the current hour's at once.
	cleanupItem, err := claim.ArgsItem(Cleanup{})
	if err != nil {
		return err
	}
	runner, err := schedule.New(maintenance, schedule.Options{},
		schedule.Schedule{Name: "cleanup", Every: time.Hour, Item: cleanupItem})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, 1)
	go func() { errs <- runner.Run(ctx) }()
	err = g.Run(ctx)
	stop() // the group stopped (or failed to start): stop the runner too
	return errors.Join(err, <-errs)
}

// README:end setup

// README:begin orders
// placeOrder stores the order and enqueues its charge in one transaction:
// the item exists only if the order does. The unique key makes a second
// enqueue of the same order's charge add nothing. On CockroachDB any
// transaction may have to run again (SQLSTATE 40001): crdb.ExecuteCtx runs
// it again, whole.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue, o Charge) error {
	it, err := claim.ArgsItem(o) // Kind "charge", the arguments' JSON as Payload
	if err != nil {
		return err
	}
	it.UniqueKey = "charge:" + o.OrderID.String()
	it.MaxAttempts = 5
	return crdb.ExecuteCtx(ctx, func(ctx context.Context, _ ...any) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // a no-op once committed
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, card, cents) VALUES ($1, $2, $3)`,
			o.OrderID, o.Card, o.Cents); err != nil {
			return err
		}
		if _, err := q.EnqueueTx(ctx, tx, it); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}

// chargeHandler returns the handler of the charges. The card is charged
// outside any transaction, with the item's id as the gateway's
// idempotency key (a handler may run more than once); the charge is
// recorded by the returned Record, inside the transaction that acks the
// item, which commits at most once per item.
func chargeHandler(gw *gateway) func(context.Context, worker.Job[Charge]) (worker.Record, error) {
	return func(ctx context.Context, job worker.Job[Charge]) (worker.Record, error) {
		o := job.Args
		receipt, err := gw.Charge(ctx, job.ID.String(), o.Card, o.Cents)
		if err != nil {
			return nil, err // retried with backoff; dead after its 5 attempts
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, receipt, attempt) VALUES ($1, $2, $3)`,
				o.OrderID, receipt, job.Attempt); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, o.OrderID)
			return err
		}, nil
	}
}

// cleanup is the handler of the cleanups: all its work is in the ack
// transaction, so a cleanup commits once per item.
func cleanup(ctx context.Context, job worker.Job[Cleanup]) (worker.Record, error) {
	return func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM orders WHERE status = 'pending' AND created_at < now() - INTERVAL '7 days'`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO cleanups (item_id, deleted) VALUES ($1, $2)`, job.ID, tag.RowsAffected())
		return err
	}, nil
}

// README:end orders

// run applies the schema, places three orders (the second one's card times
// out once at the gateway), serves until they are paid and a cleanup ran,
// then stops, as a test would; a service would serve until told to stop.
func run(ctx context.Context, url string) error {
	pool, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := claim.New(pool, ordersQueue)
	if err != nil {
		return err
	}
	placed := []Charge{
		{OrderID: uuid.New(), Card: "tok_visa", Cents: 1250},
		{OrderID: uuid.New(), Card: "tok_timeout_once", Cents: 4999},
		{OrderID: uuid.New(), Card: "tok_mastercard", Cents: 300},
	}
	for _, o := range placed {
		if err := placeOrder(ctx, pool, q, o); err != nil {
			return err
		}
	}
	gw := newGateway()
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	done := make(chan error, 1)
	go func() { done <- serve(sctx, pool, gw) }()
	ids := make([]uuid.UUID, len(placed))
	for i, o := range placed {
		ids[i] = o.OrderID
	}
	if err := waitDone(ctx, pool, ids, done); err != nil {
		return err
	}
	stopServing()
	if err := <-done; err != nil {
		return err
	}
	fmt.Printf("charged %d orders in %d gateway calls\n", len(placed), gw.Calls())
	return nil
}

// connect opens the pool, sized for the group's two queues, the producer
// and the schedule runner, and applies the crdbwork schema and the shop's
// tables.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if err := worker.ConfigurePool(cfg, ordersOptions); err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(worker.GroupPoolConns(ordersOptions, maintenanceOptions) + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		pool.Close()
		return nil, err
	}
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS orders (id UUID PRIMARY KEY, card TEXT NOT NULL, cents INT8 NOT NULL,
			status TEXT NOT NULL DEFAULT 'pending', created_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
		// No unique constraint on order_id: a second charge would show.
		`CREATE TABLE IF NOT EXISTS charges (order_id UUID NOT NULL, receipt TEXT NOT NULL, attempt INT8 NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS cleanups (item_id UUID NOT NULL, deleted INT8 NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// waitDone waits until every order of ids is paid and a cleanup ran.
func waitDone(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, served <-chan error) error {
	for {
		var paid, cleanups int
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE id = ANY($1) AND status = 'paid'),
			(SELECT count(*) FROM cleanups)`, ids).Scan(&paid, &cleanups)
		if err != nil {
			return err
		}
		if paid == len(ids) && cleanups > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-served:
			return fmt.Errorf("the service stopped early: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// gateway stands in for a payment provider's API: a charge is idempotent
// by its key (a second call with the same key returns the first receipt),
// and the card tok_timeout_once times out on its first call.
type gateway struct {
	mu       sync.Mutex
	calls    int
	receipts map[string]string
	timedOut map[string]bool
}

func newGateway() *gateway {
	return &gateway{receipts: map[string]string{}, timedOut: map[string]bool{}}
}

// Charge charges cents to card once per idempotency key.
func (g *gateway) Charge(ctx context.Context, key, card string, cents int64) (receipt string, err error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	if card == "tok_timeout_once" && !g.timedOut[key] {
		g.timedOut[key] = true
		return "", errors.New("gateway: timeout")
	}
	if r, ok := g.receipts[key]; ok {
		return r, nil
	}
	g.receipts[key] = fmt.Sprintf("ch_%d_%s", len(g.receipts)+1, key[:8])
	return g.receipts[key], nil
}

// Calls returns the number of Charge calls so far.
func (g *gateway) Calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}
