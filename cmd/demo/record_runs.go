package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/worker"
)

// recordRuns wraps h so that each run is recorded in demo_runs through db
// (its start before h runs, its end after, each in its own statement).
// Both writes are retried until they succeed (the database may be
// restarting), inside the handler, so the recorded interval holds the run
// and is what the worker counted as running: the start is written before h
// starts (if ctx ends first, h does not run and the start, if it was
// written, is deleted), the end after h returned (tried for at most
// runEndPatience). A failed write is logged on stderr.
func recordRuns(db *pgxpool.Pool, out *cli.Console, h worker.Handler) worker.Handler {
	pid := int64(os.Getpid())
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		id := uuid.New()
		// ON CONFLICT: a retry after a start written whose answer was lost.
		if err := retryRecord(ctx, out, "start", func(ctx context.Context) error {
			_, err := db.Exec(ctx, `INSERT INTO demo_runs (run_id, item_id, pid, started_at) VALUES ($1, $2, $3, clock_timestamp())
ON CONFLICT (run_id) DO NOTHING`, id, it.ID, pid)
			return err
		}); err != nil {
			// The start may have been written all the same (the answer
			// lost to the cancellation): h does not run, so no run stays.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runEndPatience)
			defer cancel()
			_ = retryRecord(dctx, out, "withdrawal", func(ctx context.Context) error {
				_, err := db.Exec(ctx, `DELETE FROM demo_runs WHERE run_id = $1`, id)
				return err
			})
			return nil, err
		}
		rec, err := h(ctx, it)
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runEndPatience)
		defer cancel()
		_ = retryRecord(ectx, out, "end", func(ctx context.Context) error {
			_, err := db.Exec(ctx, `UPDATE demo_runs SET ended_at = clock_timestamp() WHERE run_id = $1`, id)
			return err
		})
		return rec, err
	}
}

// runEndPatience bounds the retries of a run's end record.
const runEndPatience = 2 * time.Minute

// retryRecord runs write until it succeeds or ctx ends, 100 ms apart,
// logging the first failure and the last.
func retryRecord(ctx context.Context, out *cli.Console, what string, write func(context.Context) error) error {
	for try := 1; ; try++ {
		err := write(ctx)
		if err == nil {
			if try > 1 {
				out.Errorf("demo work: recorded a run's %s after %d tries", what, try)
			}
			return nil
		}
		if try == 1 {
			out.Errorf("demo work: recording a run's %s: %v (trying again)", what, err)
		}
		select {
		case <-ctx.Done():
			out.Errorf("demo work: recording a run's %s: gave up after %d tries: %v", what, try, err)
			return fmt.Errorf("recording a run's %s: %w", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
