package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/worker"
)

// The statements of a run's record, each safe to try again (a try whose
// answer was lost may have been written). A try the recorder gave up on may still
// run at the server afterwards: pgx gives up on a statement when the
// handler's context ends (it sends a cancel request, closes the connection
// and returns at once), and the server may finish the statement before the
// request lands, after the recorder has moved on. So a withdrawal and the
// start it withdraws commute: whichever comes second, the run ends up
// withdrawn, never open.
const (
	// runStart records a run's start (nothing if a start or a withdrawal
	// of the run is there).
	runStart = `INSERT INTO demo_runs (run_id, item_id, pid, started_at) VALUES ($1, $2, $3, clock_timestamp())
ON CONFLICT (run_id) DO NOTHING`
	// runEnd records a run's end; it follows a start that was written.
	runEnd = `UPDATE demo_runs SET ended_at = clock_timestamp() WHERE run_id = $1`
	// runWithdrawal records that the handler did not run: a run of no
	// length (ended_at = started_at), at its start if the start was
	// written; a start that lands later finds it and does nothing. (A
	// DELETE, as before, let such a start leave a run open for ever.)
	// The alias form, as internal/store's schedules' upsert, on both
	// engines.
	runWithdrawal = `INSERT INTO demo_runs AS r (run_id, item_id, pid, started_at, ended_at) VALUES ($1, $2, $3, now(), now())
ON CONFLICT (run_id) DO UPDATE SET ended_at = r.started_at`
)

// runRecorder records the handler runs of one process in demo_runs
// through db (wrap), and keeps the process from ending while a run is
// being recorded (close): a worker's graceful stop does not wait for the
// handlers it abandoned (HangGrace after their contexts ended) or that
// outlived its shutdown timeouts, and a process that exited under one of
// them, between its run's start and its end, left the run open though it
// was not killed.
type runRecorder struct {
	db  *pgxpool.Pool
	out *cli.Console
	pid int64

	mu sync.Mutex
	// recording counts the runs between the first try of their start and
	// the last of their end or withdrawal.
	recording int
	// idle, once close waits, is closed when recording drops to 0.
	idle chan struct{}
}

// newRunRecorder returns a recorder writing through db, logging its
// failures to out.
func newRunRecorder(db *pgxpool.Pool, out *cli.Console) *runRecorder {
	return &runRecorder{db: db, out: out, pid: int64(os.Getpid())}
}

// wrap wraps h so that each run is recorded (its start before h runs, its
// end after, each in its own statement). Both writes are retried until they
// succeed (the database may be restarting), inside the handler, so the
// recorded interval holds the run and is what the worker counted as
// running: the start is written before h starts; if ctx ends first, h does
// not run and the run is withdrawn (a run of no length, which no count of
// runs at once sees, whether or not the start was written or is written
// later); the end after h returned (tried for at most runEndPatience, as
// is the withdrawal). A failed write is logged on stderr.
func (r *runRecorder) wrap(h worker.Handler) worker.Handler {
	db, out, pid := r.db, r.out, r.pid
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		r.begin()
		defer r.end()
		id := uuid.New()
		if err := retryRecord(ctx, out, "start", func(ctx context.Context) error {
			_, err := db.Exec(ctx, runStart, id, it.ID, pid)
			return err
		}); err != nil {
			// The start may have been written all the same, or may yet be
			// (a try given up on, still running at the server): h does
			// not run, and the withdrawal ends the run either way.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runEndPatience)
			defer cancel()
			_ = retryRecord(dctx, out, "withdrawal", func(ctx context.Context) error {
				_, err := db.Exec(ctx, runWithdrawal, id, it.ID, pid)
				return err
			})
			return nil, err
		}
		rec, err := h(ctx, it)
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runEndPatience)
		defer cancel()
		_ = retryRecord(ectx, out, "end", func(ctx context.Context) error {
			_, err := db.Exec(ctx, runEnd, id)
			return err
		})
		return rec, err
	}
}

func (r *runRecorder) begin() {
	r.mu.Lock()
	r.recording++
	r.mu.Unlock()
}

func (r *runRecorder) end() {
	r.mu.Lock()
	r.recording--
	if r.recording == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
	r.mu.Unlock()
}

// close waits for the runs being recorded to have their ends (or
// withdrawals) written, at most runEndPatience and a second (each write's
// patience; the worker has cancelled the handlers' contexts by then, so
// the demo handler has returned or returns at once), and closes db.
func (r *runRecorder) close() {
	defer r.db.Close()
	r.mu.Lock()
	n := r.recording
	idle := make(chan struct{})
	if n > 0 {
		r.idle = idle
	}
	r.mu.Unlock()
	if n == 0 {
		return
	}
	r.out.Errorf("demo work: waiting for %d handler runs to record their ends", n)
	t := time.NewTimer(runEndPatience + time.Second)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
		r.mu.Lock()
		n = r.recording
		r.mu.Unlock()
		r.out.Errorf("demo work: gave up waiting for %d handler runs to record their ends: they stay open", n)
	}
}

// runEndPatience bounds the retries of a run's end or withdrawal record.
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
		if try == 1 && ctx.Err() == nil {
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
