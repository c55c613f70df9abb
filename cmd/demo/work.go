package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// insertResult records one handled item, inside the ack transaction.
const insertResult = `INSERT INTO demo_results (item_id, session_id, part, attempt) VALUES ($1, $2, $3, $4)`

// demoHandler "works" for taskTime (giving up when ctx ends) and returns
// the Record that writes the item's result row in the ack transaction.
func demoHandler(taskTime time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if taskTime > 0 {
			t := time.NewTimer(taskTime)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insertResult, it.ID, it.Session, int64(it.Part), int64(it.Attempt))
			return err
		}, nil
	}
}

// workerSettings are the settings shared by `run` and `work`.
type workerSettings struct {
	concurrency int
	ackBatch    int
	taskTime    time.Duration
	heartbeat   time.Duration
	expiry      time.Duration
	rebalance   time.Duration
}

func (w *workerSettings) register(f *flagSet) {
	f.intVar(&w.concurrency, "concurrency", 8, 1, 10_000, "handlers running at once in each worker")
	f.intVar(&w.ackBatch, "ack-batch", worker.DefaultMaxAckBatch, 1, 10_000, "most items acked in one transaction (1: each item in its own)")
	f.durationVar(&w.taskTime, "task-time", 2*time.Millisecond, true, "time the demo handler spends on each item")
	f.durationVar(&w.heartbeat, "heartbeat", session.DefaultHeartbeat, false, "session heartbeat interval")
	f.durationVar(&w.expiry, "expiry", session.DefaultExpiry, false, "session expiry: a session that has not heartbeaten for this long is deleted by its peers")
	f.durationVar(&w.rebalance, "rebalance", 500*time.Millisecond, false, "interval between part rebalances")
}

// validate checks what the flags alone cannot.
func (w *workerSettings) validate(f *flagSet) error {
	if w.expiry < session.MinExpiryFactor*w.heartbeat {
		return f.usageError("--expiry %v must be at least %d heartbeats (%v): raise --expiry or lower --heartbeat",
			w.expiry, session.MinExpiryFactor, session.MinExpiryFactor*w.heartbeat)
	}
	return nil
}

// poolSize is the pool connections one worker needs, whatever its
// concurrency (worker.PoolConns: claims, settle goroutines, maintenance,
// rebalancer; the heartbeat has one more of its own, outside the pool).
func (w *workerSettings) poolSize() int {
	return worker.PoolConns(worker.Options{Parts: true, MaxAckBatch: w.ackBatch})
}

// newWorker returns a parts-mode worker with the demo handler.
func (w *workerSettings) newWorker(db worker.DB, queue, name string, log *zap.Logger) (*worker.Worker, error) {
	return worker.New(db, demoHandler(w.taskTime), worker.Options{
		Queue:           queue,
		Tables:          tables,
		Concurrency:     w.concurrency,
		MaxAckBatch:     w.ackBatch,
		Parts:           true,
		ShutdownTimeout: 5 * time.Second,
		Session:         session.Options{Heartbeat: w.heartbeat, Expiry: w.expiry, Name: name},
		Partition:       partition.Options{Poll: w.rebalance},
		Logger:          log.With(zap.String("worker", name)),
	})
}

type workConfig struct {
	common
	workerSettings
	name string
}

func cmdWork(ctx context.Context, name string, args []string, out *console) error {
	var c workConfig
	f := newFlagSet(name, `Runs one worker process on --queue in parts mode until SIGINT or SIGTERM, then
stops gracefully (in-flight items finish, the session is deleted, which releases
its parts at once). The handler waits --task-time and records the item in
demo_results inside the ack transaction. A final line with the worker's
counters goes to stderr. Needs "demo migrate" first.`)
	c.common.register(f, urlRequired)
	c.workerSettings.register(f)
	host, _ := os.Hostname()
	f.stringVar(&c.name, "name", fmt.Sprintf("demo-work-%s-%d", host, os.Getpid()), "NAME", "session name shown by `demo status`", nil)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	if err := c.validate(f); err != nil {
		return err
	}
	log, err := newLogger(c.logLevel, out)
	if err != nil {
		return err
	}
	defer log.Sync()
	// SIGINT or SIGTERM while starting is a stop request like any other.
	stoppedEarly := func(err error) error {
		if ctx.Err() != nil {
			out.errorf("demo work: %s stopped before it started working", c.name)
			return nil
		}
		return err
	}
	pool, err := connect(ctx, c.databaseURL, c.poolSize())
	if err != nil {
		return stoppedEarly(err)
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool); err != nil {
		return stoppedEarly(err)
	}
	if err := requireDemoTables(ctx, pool); err != nil {
		return stoppedEarly(err)
	}
	warm(ctx, pool)
	w, err := c.newWorker(pool, c.queue, c.name, log)
	if err != nil {
		return failf(2, "%v", err)
	}
	start := time.Now()
	runErr := w.Run(ctx)
	st := w.Stats()
	elapsed := time.Since(start)
	if c.json {
		b, _ := json.Marshal(map[string]any{
			"name": c.name, "pid": os.Getpid(), "elapsed_seconds": elapsed.Seconds(),
			"sessions": st.Sessions, "sessions_lost": st.SessionsLost, "claimed": st.Claimed,
			"acked": st.Acked, "nacked": st.Nacked, "released": st.Released, "dead": st.Dead,
			"claims_lost": st.LostClaims, "retries": st.Retries, "error": errString(runErr),
		})
		out.errorLine(string(b))
	} else {
		out.errorf("demo work: %s stopped after %s: acked %d, claimed %d, nacked %d, released %d, dead %d, claims lost %d, sessions %d (%d lost)",
			c.name, round(elapsed), st.Acked, st.Claimed, st.Nacked, st.Released, st.Dead, st.LostClaims, st.Sessions, st.SessionsLost)
	}
	if runErr != nil {
		if errors.Is(runErr, crsql.ErrSchemaMissing) {
			return failf(2, "the crdbwork schema is not in this database: run `demo migrate` first")
		}
		return failf(1, "%v", runErr)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
