package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// benchQueue is the crdbwork queue the runs use.
const benchQueue = "bench"

// insertResult writes an item's result row inside its ack transaction;
// insertResults those of a whole ack transaction.
const (
	insertResult  = `INSERT INTO bench_cw_results (item_id) VALUES ($1)`
	insertResults = `INSERT INTO bench_cw_results (item_id) SELECT unnest($1::UUID[])`
)

// setupCrdbwork applies the crdbwork schema and creates the result table.
func setupCrdbwork(ctx context.Context, pool *pgxpool.Pool) error {
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		return fmt.Errorf("crdbwork schema: %w", err)
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_cw_results (
    item_id UUID PRIMARY KEY, done_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	return err
}

// crdbworkSystem drains items with in-process workers (one session each)
// that write a result row in each item's ack transaction: exactly-once.
type crdbworkSystem struct {
	workers     int
	concurrency int
	ackBatch    int
	ackers      int    // 0: the worker's default
	record      string // "statement": one INSERT per ack transaction as SQL (Options.BatchStatement); "batch": the same by Options.BatchRecord; "each": one per item (worker.Exec); "func": one per item run by a Record function
	parts       int    // 0: no parts mode
	conns       int    // per worker; 0: worker.PoolConns
	profile     string // CPU profile file for the next run ("" none)
	label       string // the name in the output ("": crdbwork exactly-once)
	dedupOff    bool   // the queue's dedup window off (claim.Policy.DedupOff): no ended-id record per ack
	kind        string // every item's kind (claim.NewItem.Kind; "": none), run by the one handler
}

// options returns the worker options of the runs.
func (c *crdbworkSystem) options() worker.Options {
	return worker.Options{
		Concurrency:    c.concurrency,
		MaxAckBatch:    c.ackBatch,
		Ackers:         c.ackers,
		Parts:          c.parts,
		Poll:           10 * time.Millisecond,
		Partition:      partition.Tuning{Poll: 100 * time.Millisecond},
		BatchRecord:    c.batchRecord(),
		BatchStatement: c.batchStatement(),
	}
}

// batchStatement writes the result rows of an ack transaction with one
// INSERT given as SQL (with --cw-record statement): the worker sends the
// whole ack transaction in one round trip.
func (c *crdbworkSystem) batchStatement() claim.BatchStatement {
	if c.record != "statement" {
		return nil
	}
	return func(acked []claim.AckRequest) (string, []any) {
		ids := make([][16]byte, len(acked))
		for i, r := range acked {
			ids[i] = r.Value.([16]byte)
		}
		return insertResults, []any{ids}
	}
}

// batchRecord writes the result rows of an ack transaction's items in one
// INSERT (with --cw-record batch).
func (c *crdbworkSystem) batchRecord() claim.BatchRecord {
	if c.record != "batch" {
		return nil
	}
	return func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		ids := make([][16]byte, len(acked))
		for i, r := range acked {
			ids[i] = r.Value.([16]byte)
		}
		_, err := tx.Exec(ctx, insertResults, ids)
		return err
	}
}

// handler is the no-op handler: it hands its result (the item's id) to the
// batch record, or returns a Record that inserts it: worker.Exec's (with
// --cw-record each: the INSERTs of an ack transaction go with its COMMIT)
// or a function running the INSERT itself (--cw-record func: one round trip
// per item).
func (c *crdbworkSystem) handler() worker.Handler {
	switch c.record {
	case "each":
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return worker.Exec(insertResult, [16]byte(it.ID)), nil // [16]byte: pgx encodes uuid.UUID through its text form
		}
	case "func":
	default:
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return nil, worker.RecordValue(ctx, [16]byte(it.ID))
		}
	}
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insertResult, [16]byte(it.ID)) // [16]byte: pgx encodes uuid.UUID through its text form
			return err
		}, nil
	}
}

// poolConns is the pool size of each worker.
func (c *crdbworkSystem) poolConns() int {
	if c.conns > 0 {
		return c.conns
	}
	return worker.PoolConns(c.options())
}

func (c *crdbworkSystem) name() string {
	if c.label != "" {
		return c.label
	}
	return "crdbwork exactly-once"
}

func (c *crdbworkSystem) settings() string {
	parts := "no parts"
	if c.parts > 0 {
		parts = fmt.Sprintf("%d parts", c.parts)
	}
	ackers := "default ackers"
	if c.ackers > 0 {
		ackers = fmt.Sprintf("%d ackers", c.ackers)
	}
	ackBatch := fmt.Sprintf("ack batch %d", c.ackBatch)
	if c.ackBatch == 0 {
		ackBatch = "ack batch: the worker's default (a quarter of the handlers, 64 to 256)"
	}
	if c.dedupOff {
		parts += ", dedup window off (no ended-id record)"
	}
	return fmt.Sprintf("%d workers × %d handlers, %s, %s, %s, results recorded %s, pool of %d per worker (worker.Connections: %d)",
		c.workers, c.concurrency, ackBatch, ackers, parts, map[string]string{"statement": "in one INSERT per ack transaction, given as SQL (BatchStatement: one round trip per ack)", "batch": "in one INSERT per ack transaction (BatchRecord)", "each": "by one INSERT per item (worker.Exec, sent with COMMIT)", "func": "by one INSERT per item (a Record function: a round trip each)"}[c.record],
		c.poolConns(), worker.Connections(c.options()))
}

func (c *crdbworkSystem) run(ctx context.Context, url string, d drain, m marks) (result, error) {
	items, total := d.items, d.items+d.backlog
	pool, err := newSetupPool(ctx, url)
	if err != nil {
		return result{}, err
	}
	defer pool.Close()
	pools := make([]*pgxpool.Pool, c.workers)
	for i := range pools {
		if pools[i], err = newPool(ctx, url, c.poolConns()); err != nil {
			return result{}, err
		}
		defer pools[i].Close()
	}
	if _, err := pool.Exec(ctx, `TRUNCATE bench_cw_results`); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, benchQueue); err != nil {
		return result{}, err
	}
	parts := max(c.parts, 1)
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, benchQueue, parts); err != nil {
		return result{}, fmt.Errorf("setting %d parts: %w", parts, err)
	}
	q, err := claim.New(pool, claim.Options{Queue: benchQueue})
	if err != nil {
		return result{}, err
	}
	// The queue's policy is stored in the database, which the systems
	// share: set it on every run, to the default or with the dedup window off.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: c.dedupOff}}); err != nil {
		return result{}, fmt.Errorf("setting the dedup window: %w", err)
	}
	batch := make([]claim.NewItem, 0, 5000)
	for done := 0; done < total; done += len(batch) {
		batch = batch[:0]
		for range min(cap(batch), total-done) {
			batch = append(batch, claim.NewItem{Payload: []byte{}, Kind: c.kind})
		}
		if _, err := q.Enqueue(ctx, batch...); err != nil {
			return result{}, fmt.Errorf("enqueue: %w", err)
		}
	}
	if err := store.RefreshStats(ctx, pool, "crdbwork_items"); err != nil {
		return result{}, err
	}

	ws := make([]*worker.Worker, c.workers)
	for i := range ws {
		wq, err := claim.New(pools[i], claim.Options{Queue: benchQueue})
		if err != nil {
			return result{}, err
		}
		ws[i], err = worker.New(wq, c.handler(), c.options())
		if err != nil {
			return result{}, err
		}
	}
	acked := func() int64 {
		var n int64
		for _, w := range ws {
			n += w.Stats().Acked
		}
		return n
	}

	if c.profile != "" {
		f, err := os.Create(c.profile)
		if err != nil {
			return result{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return result{}, err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
		c.profile = ""
	}
	mon, err := startConnMonitor(ctx, url)
	if err != nil {
		return result{}, err
	}
	var peak int
	var monErr error
	elapsed, runErr := drainWorkers(ctx, ws, items, acked, m.start, func(ok bool) {
		peak, monErr = mon.stop()
		if ok {
			m.done()
		}
	})
	if runErr != nil {
		return result{}, runErr
	}
	// Exactly once: one result row per acked item (the results' primary
	// key refuses a second), every other item still queued.
	var n, left int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_cw_results), (SELECT count(*) FROM crdbwork_items WHERE queue = $1)`,
		benchQueue).Scan(&n, &left); err != nil {
		return result{}, err
	}
	if got := acked(); int64(n) != got || n < items || n+left != total {
		return result{}, fmt.Errorf("%d result rows, %d acked and %d items left for %d items", n, got, left, total)
	}
	return result{elapsed: elapsed, peakConns: peak, poolConns: c.workers * c.poolConns(), retries: workerRetries(ws)}, monErr
}

// drainWorkers runs the workers ws until acked reports items, a worker
// stops, ctx ends or runTimeout(items) passes, then stops them and waits
// for them. started runs just before the clock starts; stopped (ok: every
// item was acked) just after it stops, before the workers are stopped.
// It returns the time from starting the workers to the last ack.
func drainWorkers(ctx context.Context, ws []*worker.Worker, items int, acked func() int64, started func(), stopped func(ok bool)) (time.Duration, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make(chan error, len(ws))
	var wg sync.WaitGroup
	started()
	start := time.Now()
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- w.Run(runCtx) }()
	}
	var runErr error
	deadline := time.Now().Add(runTimeout(items))
	t := time.NewTicker(time.Millisecond)
	for acked() < int64(items) && runErr == nil {
		select {
		case err := <-errs:
			runErr = fmt.Errorf("a worker stopped: %v", err)
		case <-ctx.Done():
			runErr = ctx.Err()
		case <-t.C:
			if time.Now().After(deadline) {
				runErr = fmt.Errorf("timed out with %d of %d items acked", acked(), items)
			}
		}
	}
	t.Stop()
	elapsed := time.Since(start)
	stopped(runErr == nil)
	stop()
	wg.Wait()
	return elapsed, runErr
}

// workerRetries sums the serialization-failure retries of the workers ws.
func workerRetries(ws []*worker.Worker) int64 {
	var n int64
	for _, w := range ws {
		for _, r := range w.Stats().Retries {
			n += r
		}
	}
	return n
}
