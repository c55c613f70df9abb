package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The experiments (fairness, order) share one run: a queue emptied first,
// items enqueued, in-process workers in parts mode (or any part) that note
// what they claim and record a result row per item in its ack transaction,
// a wait until the queue is empty, and a check that every item was acked
// exactly once. What they measure comes from the workers' hooks.

// expQueue is the queue of the experiments.
const expQueue = "bench-experiment"

// expResults records the experiments' acks: one row per ack, so that a
// duplicate shows as a second row of an item.
const expResults = `CREATE TABLE IF NOT EXISTS bench_exp_results (
    row_id  UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    item_id UUID NOT NULL
)`

// expConfig are the flags every experiment has.
type expConfig struct {
	commonFlags
	items, workers, concurrency, parts int
	taskTime                           time.Duration
	timeout                            time.Duration
	json                               bool
	settle                             bool
	// Set by the experiment, not flags: anyPart runs the workers without
	// parts; lease is the claims' lease (0: the default); observe sees
	// every item its handler gets; onClaim is worker.Options.Testing.OnClaim;
	// urgentPriority the urgent lane's threshold when urgentLane.
	anyPart        bool
	lease          time.Duration
	observe        func(claim.Item)
	onClaim        func(ctx context.Context, items []claim.Item)
	urgentLane     bool
	urgentPriority int
}

func (c *expConfig) register(fs *flag.FlagSet, items int) {
	c.commonFlags.register(fs)
	fs.IntVar(&c.items, "items", items, "items enqueued up front")
	fs.IntVar(&c.workers, "workers", 4, "worker sessions, in this process")
	fs.IntVar(&c.concurrency, "concurrency", 256, "handlers per worker")
	fs.IntVar(&c.parts, "parts", 16, "parts of the queue")
	fs.DurationVar(&c.taskTime, "task-time", 2*time.Millisecond, "time the handler spends on each item")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up if items remain this long after the workers started")
	fs.BoolVar(&c.json, "json", false, "print the result as one JSON object on one line")
	fs.BoolVar(&c.settle, "settle", false, "in parts mode, keep the queue paused until the workers own the parts evenly, and time the drain from then (the steady fleet, not its start)")
}

// validate checks the shared flags.
func (c *expConfig) validate() error {
	switch {
	case c.items < 1 || c.items > 10_000_000:
		return fmt.Errorf("--items %d: must be between 1 and 10000000", c.items)
	case c.workers < 1 || c.workers > 1000:
		return fmt.Errorf("--workers %d: must be between 1 and 1000", c.workers)
	case c.concurrency < 1 || c.concurrency > 10_000:
		return fmt.Errorf("--concurrency %d: must be between 1 and 10000", c.concurrency)
	case c.parts < 1 || c.parts > partition.MaxParts:
		return fmt.Errorf("--parts %d: must be between 1 and %d", c.parts, partition.MaxParts)
	case c.taskTime < 0 || c.timeout <= 0:
		return errors.New("--task-time must not be negative and --timeout must be positive")
	}
	return nil
}

// expOutcome is what every experiment reports of its run.
type expOutcome struct {
	Engine         string  `json:"engine"`
	Items          int     `json:"items"`
	Enqueued       int64   `json:"enqueued"`
	Acked          int64   `json:"acked"`
	Duplicates     int64   `json:"duplicates"`
	Lost           int64   `json:"lost"`
	Workers        int     `json:"workers"`
	Concurrency    int     `json:"concurrency"`
	Parts          int     `json:"parts"`
	TaskTimeMS     float64 `json:"task_time_ms"`
	Settled        bool    `json:"settled,omitempty"` // the drain started once the parts were divided evenly
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	ItemsPerSecond float64 `json:"items_per_second"`
}

// expHooks are an experiment's parts of the run.
type expHooks struct {
	// setup configures the emptied queue (settings) before the enqueue.
	setup func(ctx context.Context, q *claim.Queue) error
	// enqueue enqueues the up-front items and returns how many.
	enqueue func(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue) (int, error)
	// started runs once the workers started (the fairness trickle); the
	// returned function stops what it started and says how many more
	// items it enqueued.
	started func(ctx context.Context, url string) (stop func() int, err error)
	// meter, if set, is called with the run's pool and URL before the
	// workers start (the order meter's own connections).
	meter func(ctx context.Context, url string) (func(), error)
}

// runExperiment runs one experiment on c's database (a throwaway server
// without --database-url).
func runExperiment(ctx context.Context, c *expConfig, h expHooks, out io.Writer) (expOutcome, error) {
	o := expOutcome{Items: c.items, Workers: c.workers, Concurrency: c.concurrency, Parts: c.parts,
		TaskTimeMS: float64(c.taskTime) / float64(time.Millisecond)}
	if c.json {
		out = io.Discard // the server's line would spoil the JSON
	}
	url, stopServer, err := c.database(ctx, out)
	if err != nil {
		return o, err
	}
	defer stopServer()
	pool, err := openPool(ctx, url, 4, "bench-setup")
	if err != nil {
		return o, err
	}
	defer pool.Close()
	if d, err := store.DetectDialect(ctx, pool); err == nil {
		o.Engine = d.String()
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		return o, fmt.Errorf("crdbwork schema: %w", err)
	}
	if _, err := pool.Exec(ctx, expResults); err != nil {
		return o, fmt.Errorf("creating bench_exp_results: %w", err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE bench_exp_results`); err != nil {
		return o, err
	}
	expAcked.Store(0)
	stmts := store.New(crsql.Tables{})
	for {
		r, err := stmts.VerifyDeleteQueueRows(ctx, pool, expQueue, 10_000)
		if err != nil {
			return o, err
		}
		if r.Items+r.DeadItems+r.Ended == 0 {
			break
		}
	}
	if err := stmts.VerifyDeleteQueueRest(ctx, pool, expQueue); err != nil {
		return o, err
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, expQueue, c.parts); err != nil {
		return o, err
	}
	q, err := claim.New(pool, claim.Options{Queue: expQueue})
	if err != nil {
		return o, err
	}
	if h.setup != nil {
		if err := h.setup(ctx, q); err != nil {
			return o, err
		}
	}
	settle := c.settle && !c.anyPart
	if settle {
		// Paused: the workers start, divide the parts and claim nothing
		// until the drain starts.
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.On}); err != nil {
			return o, err
		}
	}
	n, err := h.enqueue(ctx, pool, q)
	if err != nil {
		return o, fmt.Errorf("enqueueing: %w", err)
	}
	o.Enqueued = int64(n)
	if h.meter != nil {
		done, err := h.meter(ctx, url)
		if err != nil {
			return o, err
		}
		defer done()
	}

	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	errs := make(chan error, c.workers)
	for i := range c.workers {
		wk, wpool, err := c.newWorker(ctx, url, i)
		if err != nil {
			stopWorkers()
			wg.Wait()
			return o, err
		}
		defer wpool.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := wk.Run(wctx); err != nil && wctx.Err() == nil {
				errs <- err
			}
		}()
	}
	if settle {
		if err := waitSettled(ctx, pool, stmts, c, errs); err != nil {
			stopWorkers()
			wg.Wait()
			return o, err
		}
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.Off}); err != nil {
			stopWorkers()
			wg.Wait()
			return o, err
		}
		o.Settled = true
	}
	start := time.Now()
	stopped := func() int { return 0 }
	if h.started != nil {
		if stopped, err = h.started(ctx, url); err != nil {
			stopWorkers()
			wg.Wait()
			return o, err
		}
	}
	waitErr := waitEmpty(ctx, pool, stmts, c.timeout, errs, o.Enqueued)
	more := stopped()
	if waitErr == nil {
		waitErr = waitEmpty(ctx, pool, stmts, c.timeout, errs, o.Enqueued+int64(more)) // the items enqueued since
	}
	elapsed := time.Since(start)
	stopWorkers()
	wg.Wait()
	if waitErr != nil {
		return o, waitErr
	}
	o.Enqueued += int64(more)
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT item_id), count(*) FROM bench_exp_results`).Scan(&o.Acked, &rows); err != nil {
		return o, err
	}
	o.Duplicates = rows - o.Acked
	o.Lost = o.Enqueued - o.Acked
	o.ElapsedSeconds = elapsed.Seconds()
	o.ItemsPerSecond = float64(o.Acked) / elapsed.Seconds()
	if o.Lost != 0 || o.Duplicates != 0 {
		return o, fmt.Errorf("not exactly once: %d items enqueued, %d acked, %d acked twice", o.Enqueued, o.Acked, o.Duplicates)
	}
	return o, nil
}

// waitSettled waits until every part of the queue is owned and each of the
// c.workers sessions owns parts/workers of them (rounded down or up), a
// worker fails, ctx ends or c.timeout passes.
func waitSettled(ctx context.Context, pool *pgxpool.Pool, stmts *store.Store, c *expConfig, errs <-chan error) error {
	deadline := time.NewTimer(c.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lo, hi := c.parts/c.workers, (c.parts+c.workers-1)/c.workers
	for {
		owners, err := stmts.PartsOwners(ctx, pool, expQueue)
		if err == nil && len(owners) == c.parts {
			per := map[uuid.UUID]int{}
			for _, s := range owners {
				per[s]++
			}
			even := len(per) == min(c.workers, c.parts)
			for _, k := range per {
				even = even && k >= lo && k <= hi
			}
			if even {
				return nil
			}
		}
		if err := nextTick(ctx, errs, deadline, tick, func() error {
			return fmt.Errorf("the workers did not divide the parts evenly within %v", c.timeout)
		}); err != nil {
			return err
		}
	}
}

// nextTick waits for tick's next tick; it returns ctx's error if ctx ends
// first, a worker's failure if one comes on errs, and late() if deadline
// fires.
func nextTick(ctx context.Context, errs <-chan error, deadline *time.Timer, tick *time.Ticker, late func() error) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-errs:
		return fmt.Errorf("a worker failed: %w", err)
	case <-deadline.C:
		return late()
	case <-tick.C:
		return nil
	}
}

// expAcked counts the results the experiment's workers wrote (their ack
// transactions' result rows, counted when the INSERT ran: a transaction
// retried after it counts twice). waitEmpty reads it to know when counting
// the queue's items is worth its cost; the result table stays the check.
var expAcked atomic.Int64

// waitEmpty waits until the queue holds no item, a worker fails, ctx ends
// or timeout passes. It counts the queue's items (a read of every item:
// 20–50 ms of server time on a backlog of 100k, which the drain would pay)
// only once the workers have written at least want results, or once a
// second until then (items enqueued meanwhile, by the trickle, are not in
// want); it watches the workers' own count every 5 ms.
func waitEmpty(ctx context.Context, pool *pgxpool.Pool, stmts *store.Store, timeout time.Duration, errs <-chan error, want int64) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var n int64 = -1
	var counted time.Time
	for {
		if expAcked.Load() >= want || time.Since(counted) >= time.Second {
			var err error
			n, err = stmts.VerifyCountItems(ctx, pool, expQueue)
			counted = time.Now()
			if err == nil && n == 0 {
				return nil
			}
		}
		if err := nextTick(ctx, errs, deadline, tick, func() error {
			return fmt.Errorf("timed out after %v with %d items left", timeout, n)
		}); err != nil {
			return err
		}
	}
}

// newWorker returns worker i with its own pool.
func (c *expConfig) newWorker(ctx context.Context, url string, i int) (*worker.Worker, *pgxpool.Pool, error) {
	parts := c.parts
	if c.anyPart {
		parts = 0
	}
	opts := worker.Options{
		Concurrency:     c.concurrency,
		Parts:           parts,
		ShutdownTimeout: 5 * time.Second,
		Name:            fmt.Sprintf("bench-experiment-%d", i),
		BatchRecord:     recordExpResults,
		UrgentLane:      c.urgentLane,
		UrgentPriority:  c.urgentPriority,
		Testing:         worker.TestingOptions{OnClaim: c.onClaim},
	}
	pool, err := newPool(ctx, url, worker.PoolConns(opts))
	if err != nil {
		return nil, nil, err
	}
	q, err := claim.New(pool, claim.Options{Queue: expQueue, Lease: c.lease})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	taskTime, observe := c.taskTime, c.observe
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if observe != nil {
			observe(it)
		}
		if taskTime > 0 {
			t := time.NewTimer(taskTime)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		return nil, worker.RecordValue(ctx, [16]byte(it.ID))
	}
	w, err := worker.New(q, h, opts)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return w, pool, nil
}

// recordExpResults writes the result rows of an ack transaction in one
// INSERT.
func recordExpResults(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
	ids := make([][16]byte, len(acked))
	for i, r := range acked {
		ids[i] = r.Value.([16]byte)
	}
	_, err := tx.Exec(ctx, `INSERT INTO bench_exp_results (item_id) SELECT unnest($1::UUID[])`, ids)
	if err == nil {
		expAcked.Add(int64(len(ids)))
	}
	return err
}

// enqueueChunks enqueues items by calls of at most 1000 items each.
func enqueueChunks(ctx context.Context, q *claim.Queue, items []claim.NewItem) error {
	for start := 0; start < len(items); start += 1000 {
		chunk := items[start:min(start+1000, len(items))]
		if _, err := q.Enqueue(ctx, chunk...); err != nil {
			return fmt.Errorf("enqueueing items %d..%d: %w", start, start+len(chunk)-1, err)
		}
	}
	return nil
}

// printOutcome writes the run's lines of the human summary.
func printOutcome(tw io.Writer, o expOutcome) {
	fmt.Fprintf(tw, "  engine\t%s\n", o.Engine)
	fmt.Fprintf(tw, "  workers\t%d in-process sessions × %d handlers, %d parts, task time %v\n", o.Workers, o.Concurrency, o.Parts,
		time.Duration(o.TaskTimeMS*float64(time.Millisecond)))
	fmt.Fprintf(tw, "  items\t%d enqueued, %d acked exactly once\n", o.Enqueued, o.Acked)
	fmt.Fprintf(tw, "  elapsed\t%.2fs (%.0f items/s)\n", o.ElapsedSeconds, o.ItemsPerSecond)
}

// printJSON writes v as one line of JSON.
func printJSON(out io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}
