package riverorders

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// TestOrders runs the River version of docs/migrating.md's order pipeline
// on a throwaway PostgreSQL server and checks the outcome examples/orders'
// test checks: every order paid by one charge, the card that timed out
// charged by its second attempt, a cleanup run.
func TestOrders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(3*time.Minute))
	defer cancel()
	pool := newPool(ctx, t)
	gw := NewGateway()
	client, err := NewClient(pool, gw)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	for _, o := range []ChargeArgs{
		{OrderID: uuid.New(), Card: "tok_visa", Cents: 1250},
		{OrderID: uuid.New(), Card: "tok_timeout_once", Cents: 4999},
		{OrderID: uuid.New(), Card: "tok_mastercard", Cents: 300},
	} {
		if err := PlaceOrder(ctx, pool, client, o); err != nil {
			t.Fatal(err)
		}
	}
	await.Until(t, "3 orders paid and a cleanup run", func() (bool, string) {
		var paid, cleanups int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE status = 'paid'),
			(SELECT count(*) FROM cleanups)`).Scan(&paid, &cleanups); err != nil {
			return false, err.Error()
		}
		return paid == 3 && cleanups > 0, fmt.Sprintf("%d paid, %d cleanups", paid, cleanups)
	})
	var charges, chargedOrders, retried int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id),
		count(*) FILTER (WHERE attempt = 2 AND order_id IN (SELECT id FROM orders WHERE card = 'tok_timeout_once'))
		FROM charges`).Scan(&charges, &chargedOrders, &retried); err != nil {
		t.Fatal(err)
	}
	if charges != 3 || chargedOrders != 3 || retried != 1 {
		t.Errorf("%d charges of %d orders, %d by attempt 2 of the card that timed out; want 3, 3, 1", charges, chargedOrders, retried)
	}
	if calls := gw.Calls(); calls != 4 {
		t.Errorf("%d gateway calls, want 4 (one retry)", calls)
	}
}

// newPool starts a throwaway PostgreSQL server, stopped at the test's end,
// and returns a pool on it with River's schema and the shop's tables.
func newPool(ctx context.Context, t *testing.T) *pgxpool.Pool {
	t.Helper()
	s, err := dbserver.Start(ctx, dbserver.Options{Prefer: dbserver.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	pool, err := pgxpool.New(ctx, s.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

type twiceArgs struct{}

func (twiceArgs) Kind() string { return "twice" }

// twiceWorker completes its job in a transaction, then again in another
// one, as a second run of the job would after a rescue (River moves a job
// that ran longer than RescueStuckJobsAfter back to be run again while the
// first run may still be running), and reports the second call's outcome.
type twiceWorker struct {
	river.WorkerDefaults[twiceArgs]
	pool *pgxpool.Pool
	out  chan string
}

func (w *twiceWorker) Work(ctx context.Context, job *river.Job[twiceArgs]) error {
	complete := func() (*river.Job[twiceArgs], error) {
		var done *river.Job[twiceArgs]
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
			var err error
			done, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
			return err
		})
		return done, err
	}
	if _, err := complete(); err != nil {
		w.out <- "first: " + err.Error()
		return err
	}
	done, err := complete()
	if err != nil {
		w.out <- "second: " + err.Error()
		return err
	}
	w.out <- "second: no error, state " + string(done.State)
	return nil
}

// TestJobCompleteTxOfACompletedJob checks what docs/migrating.md says of
// River's JobCompleteTx: it is conditioned on the job's state, not on the
// run that calls it, and a second call, in a transaction of its own after
// the job was completed, returns without an error (so that transaction's
// other writes would commit too). When River changes this, the page must
// change with it.
func TestJobCompleteTxOfACompletedJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(3*time.Minute))
	defer cancel()
	pool := newPool(ctx, t)
	w := &twiceWorker{pool: pool, out: make(chan string, 1)}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}},
		Workers: workers,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	if _, err := client.Insert(ctx, twiceArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	got := await.Recv(t, "the worker's report", w.out)
	if want := "second: no error, state " + string(rivertype.JobStateCompleted); got != want {
		t.Errorf("River's JobCompleteTx of a completed job: %q, want %q; docs/migrating.md describes River's behaviour", got, want)
	}
}
