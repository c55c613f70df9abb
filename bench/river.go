package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/crdbwork/crdbwork/internal/store"
)

// noopArgs is River plain's job: no work, no result row.
type noopArgs struct{}

func (noopArgs) Kind() string { return "bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// txArgs is River's transactional job: the worker writes a result row and
// completes the job in one transaction (river.JobCompleteTx).
type txArgs struct{}

func (txArgs) Kind() string { return "bench_tx" }

type txWorker struct {
	river.WorkerDefaults[txArgs]
	pool *pgxpool.Pool
}

func (w txWorker) Work(ctx context.Context, job *river.Job[txArgs]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO bench_river_results (job_id) VALUES ($1)`, job.ID); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// setupRiver applies River's migrations and creates the result table of its
// transactional mode.
func setupRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_river_results (
    job_id BIGINT PRIMARY KEY, done_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	return err
}

// riverSystem drains River jobs, plain or transactional.
type riverSystem struct {
	tx         bool
	maxWorkers int
	conns      int
}

func (r riverSystem) name() string {
	if r.tx {
		return "River JobCompleteTx"
	}
	return "River plain"
}

func (r riverSystem) run(ctx context.Context, url string, d drain, m marks) (result, error) {
	items, total := d.items, d.items+d.backlog
	pool, err := newPool(ctx, url, r.conns)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `TRUNCATE river_job, bench_river_results`); err != nil {
		return result{}, err
	}
	if err := store.RefreshStats(ctx, pool, "river_job"); err != nil {
		return result{}, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
	river.AddWorker(workers, txWorker{pool: pool})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: r.maxWorkers}},
		FetchCooldown: time.Millisecond,
		Workers:       workers,
	})
	if err != nil {
		return result{}, fmt.Errorf("river client: %w", err)
	}
	params := make([]river.InsertManyParams, 0, 10_000)
	for done := 0; done < total; done += len(params) {
		params = params[:0]
		for range min(cap(params), total-done) {
			if r.tx {
				params = append(params, river.InsertManyParams{Args: txArgs{}})
			} else {
				params = append(params, river.InsertManyParams{Args: noopArgs{}})
			}
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return result{}, fmt.Errorf("river insert: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE river_job`); err != nil {
		return result{}, err
	}
	events, cancelEvents := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: total + 1000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancelEvents()

	mon, err := startConnMonitor(ctx, url)
	if err != nil {
		return result{}, err
	}
	m.start()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		mon.stop()
		return result{}, fmt.Errorf("river start: %w", err)
	}
	var runErr error
	completed := 0
	timeout := time.After(runTimeout(items))
wait:
	for completed < items {
		select {
		case ev := <-events:
			if ev.Kind != river.EventKindJobCompleted {
				runErr = fmt.Errorf("river job %d failed: %v", ev.Job.ID, ev.Job.Errors)
				break wait
			}
			completed++
		case <-timeout:
			runErr = fmt.Errorf("timed out with %d of %d jobs completed", completed, items)
			break wait
		case <-ctx.Done():
			runErr = ctx.Err()
			break wait
		}
	}
	elapsed := time.Since(start)
	peak, monErr := mon.stop()
	if runErr == nil {
		m.done()
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && runErr == nil {
		runErr = fmt.Errorf("river stop: %w", err)
	}
	if runErr != nil {
		return result{}, runErr
	}
	// The events follow the completions' commits; check the database agrees
	// (with a backlog, jobs may complete between the last counted event and
	// the stop).
	var n, rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&n); err != nil {
		return result{}, err
	}
	if n < items || (d.backlog == 0 && n != items) || n > total {
		return result{}, fmt.Errorf("%d of %d jobs completed in the database (%d counted)", n, total, items)
	}
	if r.tx {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM bench_river_results`).Scan(&rows); err != nil {
			return result{}, err
		}
		if rows != n {
			return result{}, fmt.Errorf("%d result rows for %d completed jobs", rows, n)
		}
	}
	return result{elapsed: elapsed, peakConns: peak, poolConns: int(pool.Config().MaxConns)}, errors.Join(monErr)
}
