// Package riverorders is the order pipeline of docs/migrating.md written
// with River, as a River user would write it from River's documentation:
// the same program as examples/orders (crdbwork), so that the page's River
// version is code that builds and runs (its test runs it on a throwaway
// PostgreSQL server), not a sketch. It lives in the bench module, which may
// depend on River; the library may not.
package riverorders

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// README:begin river
// ChargeArgs are the charge job's arguments; its kind names its worker.
type ChargeArgs struct {
	OrderID uuid.UUID `json:"order_id"`
	Card    string    `json:"card"`
	Cents   int64     `json:"cents"`
}

func (ChargeArgs) Kind() string { return "charge" }

// InsertOpts: 5 attempts; one charge job per order (unique by its args).
func (ChargeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 5, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

type ChargeWorker struct {
	river.WorkerDefaults[ChargeArgs]
	pool *pgxpool.Pool
	gw   *Gateway
}

func (w *ChargeWorker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	receipt, err := w.gw.Charge(ctx, strconv.FormatInt(job.ID, 10), job.Args.Card, job.Args.Cents)
	if err != nil {
		return err // retried at NextRetry; discarded after MaxAttempts
	}
	// The charge and the job's completion commit together.
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO charges (order_id, receipt, attempt) VALUES ($1, $2, $3)`,
		job.Args.OrderID, receipt, job.Attempt); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, job.Args.OrderID); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// NextRetry: backoff from 100 ms doubling (River's default is attempt^4 s).
func (w *ChargeWorker) NextRetry(job *river.Job[ChargeArgs]) time.Time {
	return time.Now().Add(100 * time.Millisecond << (job.Attempt - 1))
}

type CleanupArgs struct{}

func (CleanupArgs) Kind() string { return "cleanup" }

type CleanupWorker struct {
	river.WorkerDefaults[CleanupArgs]
	pool *pgxpool.Pool
}

func (w *CleanupWorker) Work(ctx context.Context, job *river.Job[CleanupArgs]) error {
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM orders WHERE status = 'pending' AND created_at < now() - INTERVAL '7 days'`)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO cleanups (job_id, deleted) VALUES ($1, $2)`, job.ID, tag.RowsAffected()); err != nil {
			return err
		}
		_, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// NewClient registers the workers by kind and the hourly cleanup (run by
// the elected leader; the first at once), and works the default queue.
func NewClient(pool *pgxpool.Pool, gw *Gateway) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &ChargeWorker{pool: pool, gw: gw})
	river.AddWorker(workers, &CleanupWorker{pool: pool})
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers: workers,
		PeriodicJobs: []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
			func() (river.JobArgs, *river.InsertOpts) { return CleanupArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true})},
	})
}

// PlaceOrder stores the order and inserts its charge job in one transaction.
func PlaceOrder(ctx context.Context, pool *pgxpool.Pool, client *river.Client[pgx.Tx], o ChargeArgs) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, card, cents) VALUES ($1, $2, $3)`,
			o.OrderID, o.Card, o.Cents); err != nil {
			return err
		}
		_, err := client.InsertTx(ctx, tx, o, nil)
		return err
	})
}

// README:end river

// Setup applies River's migrations and creates the shop's tables (the same
// as examples/orders', with the job's BIGINT id in cleanups).
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	for _, ddl := range []string{
		`CREATE TABLE IF NOT EXISTS orders (id UUID PRIMARY KEY, card TEXT NOT NULL, cents INT8 NOT NULL,
			status TEXT NOT NULL DEFAULT 'pending', created_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
		`CREATE TABLE IF NOT EXISTS charges (order_id UUID NOT NULL, receipt TEXT NOT NULL, attempt INT8 NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS cleanups (job_id INT8 NOT NULL, deleted INT8 NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("the shop's tables: %w", err)
		}
	}
	return nil
}

// Gateway stands in for a payment provider's API, as in examples/orders: a
// charge is idempotent by its key, and the card tok_timeout_once times out
// on its first call.
type Gateway struct {
	mu       sync.Mutex
	calls    int
	receipts map[string]string
	timedOut map[string]bool
}

// NewGateway returns a gateway that has charged nothing.
func NewGateway() *Gateway {
	return &Gateway{receipts: map[string]string{}, timedOut: map[string]bool{}}
}

// Charge charges cents to card once per idempotency key.
func (g *Gateway) Charge(ctx context.Context, key, card string, cents int64) (receipt string, err error) {
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
	g.receipts[key] = fmt.Sprintf("ch_%d_%s", len(g.receipts)+1, key)
	return g.receipts[key], nil
}

// Calls returns the number of Charge calls so far.
func (g *Gateway) Calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}
