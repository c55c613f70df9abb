package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/partition"
)

// enqueueChunk is the number of items enqueued per transaction.
const enqueueChunk = 10_000

// keySpace is the number of distinct item keys: item i has key "key-<i%keySpace>".
const keySpace = 1000

// recordEnqueued records enqueued ids in demo_enqueued, with their run and
// queue (verify and cleanup tell queues apart by it).
const recordEnqueued = `INSERT INTO demo_enqueued (item_id, run_id, queue) SELECT unnest($1::UUID[]), $2::UUID, $3::TEXT`

// itemShape is what demo enqueue's flags give every item.
type itemShape struct {
	ttl        time.Duration // NewItem.TTL
	atMostOnce bool          // NewItem.AtMostOnce
	// priorities > 1 gives each item a uniformly random priority in [0,
	// priorities); otherwise 0.
	priorities int
	// tenants > 0 gives item i the tenant "tenant-<i % tenants>" and no
	// key, so that a tenant's items share its part.
	tenants int
	// kinds > 0 gives item i the kind "kind-<i % kinds>" (NewItem.Kind):
	// the demo's workers run every kind with their one handler, as a
	// worker of schema version 5 does.
	kinds int
}

// item returns demo item i, shaped.
func (s itemShape) item(i int64) claim.NewItem {
	it := claim.NewItem{
		Payload:    []byte(strconv.FormatInt(i, 10)),
		Key:        fmt.Sprintf("key-%d", i%keySpace),
		TTL:        s.ttl,
		AtMostOnce: s.atMostOnce,
	}
	if s.priorities > 1 {
		it.Priority = rand.IntN(s.priorities)
	}
	if s.tenants > 0 {
		it.Tenant, it.Key = fmt.Sprintf("tenant-%d", i%int64(s.tenants)), ""
	}
	if s.kinds > 0 {
		it.Kind = fmt.Sprintf("kind-%d", i%int64(s.kinds))
	}
	return it
}

// enqueueStreams is the number of chunks enqueueDemoShaped has in flight at
// once, each in its own transaction on its own connection: while one
// chunk's transaction writes its items and its record on the server, the
// next chunk is built and sent. Chunks are independent (each records its own
// ids with them), so their order of commit does not matter to verify.
const enqueueStreams = 2

// enqueueDemoShaped enqueues n demo items shaped by shape into queue and
// records their ids in demo_enqueued under runID, chunk by chunk, each chunk
// in one transaction with its record, so that verify knows exactly what was
// enqueued. Up to enqueueStreams chunks are in flight at once. progress, if
// not nil, is called after each chunk with the items enqueued so far (in
// chunks committed).
func enqueueDemoShaped(ctx context.Context, pool *pgxpool.Pool, queue string, runID uuid.UUID, n int, shape itemShape, progress func(done int)) error {
	q, err := claim.New(pool, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64 // the first item of the next chunk to take
		mu       sync.Mutex
		done     int
		firstErr error
		wg       sync.WaitGroup
	)
	for range enqueueStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				start := int(next.Add(enqueueChunk) - enqueueChunk)
				if start >= n || ctx.Err() != nil {
					return
				}
				items := make([]claim.NewItem, 0, min(enqueueChunk, n-start))
				for i := start; i < min(start+enqueueChunk, n); i++ {
					items = append(items, shape.item(int64(i)))
				}
				err := enqueueChunkTx(ctx, pool, q, runID, items)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("enqueueing items %d..%d: %w", start, start+len(items)-1, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				done += len(items)
				if progress != nil {
					progress(done)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// enqueueChunkTx enqueues items and records their ids in one transaction,
// retrying the whole transaction on serialization failures.
func enqueueChunkTx(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue, runID uuid.UUID, items []claim.NewItem) error {
	for attempt := 1; ; attempt++ {
		err := func() error {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			res, err := q.EnqueueTx(ctx, tx, items...)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, recordEnqueued, res.IDs, runID, q.Name()); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}()
		if err == nil || !retryable(err) || attempt >= 20 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
		}
	}
}

// retryable reports a serialization failure.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

type enqueueConfig struct {
	common
	count     int
	parts     int
	shared    bool
	shape     itemShape
	producers int
	buffered  bool
}

// maxEnqueue bounds `demo enqueue --count`: a demo's load, not a bulk load
// (ten million items take minutes to enqueue, and cleanup as long again).
const maxEnqueue = 10_000_000

// recordChunk is the number of ids the producers' recorder writes into
// demo_enqueued per statement.
const recordChunk = 1000

// enqueueProducers enqueues n demo items from producers goroutines, one
// item per call: straight Queue.Enqueue calls, or, with buffered, calls of
// one claim.Buffer (group commit). Each id is recorded in demo_enqueued
// under runID once its enqueue committed (an unknown outcome is retried
// with the same id first). Every item is shaped by shape. progress, if not
// nil, is called with the ids recorded so far after each chunk recorded. It
// returns the buffer's flushes (0 without).
func enqueueProducers(ctx context.Context, pool *pgxpool.Pool, queue string, runID uuid.UUID, n, producers int, buffered bool, shape itemShape, progress func(done int)) (flushes int64, err error) {
	q, err := claim.New(pool, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return 0, err
	}
	var buf *claim.Buffer
	if buffered {
		if buf, err = claim.NewBuffer(q, claim.BufferOptions{}); err != nil {
			return 0, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make(chan uuid.UUID, recordChunk)
	recorded := make(chan error, 1)
	go func() {
		// The recorder: ids in chunks, each chunk one INSERT.
		var chunk []uuid.UUID
		saved := 0
		flush := func() error {
			if len(chunk) == 0 {
				return nil
			}
			_, err := pool.Exec(ctx, recordEnqueued, chunk, runID, queue)
			saved += len(chunk)
			chunk = chunk[:0]
			if err == nil && progress != nil {
				progress(saved)
			}
			return err
		}
		for id := range ids {
			chunk = append(chunk, id)
			if len(chunk) == recordChunk {
				if err := flush(); err != nil {
					cancel()
					recorded <- fmt.Errorf("recording enqueued ids: %w", err)
					for range ids {
					}
					return
				}
			}
		}
		recorded <- flush()
	}()
	var next atomic.Int64
	errs := make(chan error, producers)
	var wg sync.WaitGroup
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				it := shape.item(i)
				for attempt := 1; ; attempt++ {
					var id uuid.UUID
					var got claim.Enqueued
					var err error
					if buf != nil {
						got, err = buf.Enqueue(ctx, it)
					} else {
						got, err = q.Enqueue(ctx, it)
					}
					if len(got.IDs) == 1 {
						id = got.IDs[0]
					}
					if err == nil {
						ids <- id
						break
					}
					if !errors.Is(err, claim.ErrOutcomeUnknown) || attempt == 20 || ctx.Err() != nil {
						errs <- fmt.Errorf("enqueueing item %d: %w", i, err)
						cancel()
						return
					}
					it.ID = id // the same id again: added once, whatever happened
				}
			}
		}()
	}
	wg.Wait()
	close(ids)
	if buf != nil {
		if err := buf.Close(context.WithoutCancel(ctx)); err != nil {
			return 0, err
		}
		flushes = buf.Stats().Flushes
	}
	close(errs)
	if err := <-errs; err != nil {
		return flushes, err
	}
	return flushes, <-recorded
}

func cmdEnqueue(ctx context.Context, name string, args []string, out *cli.Console) error {
	var c enqueueConfig
	f := prog.NewFlagSet(name, `Enqueues demo items (payload: the item's number; key "key-<i % 1000>") into the
queue, and records their ids in demo_enqueued under a new run id, in the same
transactions, so that "demo verify" can check them. It enqueues only into a
queue the demo created (or a new one, which it creates), and creates the
crdbwork schema and the demo's tables if they are missing; a database holding
other queues needs --shared-database. Long runs show their progress on stderr.
With --ttl, items not acked within it end dead with reason "expired" ("demo
dead"); with --at-most-once, the claim that hands an item out deletes it.
With --tenants, the items belong to tenants (for fair queues and tenant
limits); with --priorities, they get random priorities (for the urgent lane);
with --kinds, kinds (which the demo's workers, like any plain handler, all run).`)
	c.register(f, urlRequired)
	f.IntVar(&c.count, "count", 1000, 1, maxEnqueue, "number of items to enqueue (at most 10,000,000)")
	f.DurationVar(&c.shape.ttl, "ttl", 0, true, "give every item this time to live (0: none)")
	f.BoolVar(&c.shape.atMostOnce, "at-most-once", false, "make every item at-most-once (handled at most once, lost if its handler fails)")
	f.FlagOnly("at-most-once")
	f.IntVar(&c.shape.tenants, "tenants", 0, 0, 1_000_000, "give item i the tenant \"tenant-<i % N>\" and no key (a tenant's items then share one part; 0: no tenants, keys \"key-<i % 1000>\")")
	f.IntVar(&c.shape.kinds, "kinds", 0, 0, 1_000_000, "give item i the kind \"kind-<i % N>\" (claim.NewItem.Kind; 0: none)")
	f.IntVar(&c.shape.priorities, "priorities", 1, 1, 1<<30, "give every item a uniformly random priority in [0, N) (1: all 0)")
	f.IntVar(&c.parts, "parts", defaultParts, 1, partition.MaxParts, "set the queue's number of parts first (not given: keep the stored number; a new queue gets the default)")
	f.IntVar(&c.producers, "producers", 0, 0, 10_000, "enqueue from this many goroutines, one item per call, each id recorded once committed (0: chunks of 10,000 items per transaction, two at a time)")
	f.BoolVar(&c.buffered, "buffered", false, "with --producers: the calls share statements through one claim.Buffer (group commit)")
	f.BoolVar(&c.shared, "shared-database", false, sharedUsage)
	f.FlagOnly("shared-database")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if c.buffered && c.producers == 0 {
		return f.UsageError("--buffered needs --producers")
	}
	conns := 4
	if c.producers > 0 && !c.buffered {
		conns = min(c.producers, 32) + 1 // the producers' statements, the recorder
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := cli.Connect(ctx, c.databaseURL, conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := openDemo(ctx, pool, "enqueue", c.queue, c.shared, out); err != nil {
		return err
	}
	var parts int
	if f.IsSet("parts") {
		if err := partition.SetParts(ctx, pool, tables, c.queue, c.parts); err != nil {
			return cli.Failf(1, "%v", err)
		}
		parts = c.parts
	} else if parts, err = partition.EnsureParts(ctx, pool, tables, c.queue, c.parts); err != nil {
		return cli.Failf(1, "%v", err)
	}
	runID := uuid.New()
	start := time.Now()
	var flushes int64
	progress := enqueueProgress(out, c.queue, c.count, start)
	if c.producers > 0 {
		flushes, err = enqueueProducers(ctx, pool, c.queue, runID, c.count, c.producers, c.buffered, c.shape, progress)
	} else {
		err = enqueueDemoShaped(ctx, pool, c.queue, runID, c.count, c.shape, progress)
	}
	out.EndProgress()
	if err != nil {
		if ctx.Err() != nil {
			return cli.Failf(130, "interrupted: %v", err)
		}
		return cli.Failf(1, "%v", err)
	}
	elapsed := time.Since(start)
	rate := float64(c.count) / elapsed.Seconds()
	if c.json {
		m := map[string]any{
			"enqueued": c.count, "queue": c.queue, "parts": parts, "run_id": runID.String(),
			"elapsed_seconds": elapsed.Seconds(), "items_per_second": rate,
		}
		if c.producers > 0 {
			m["producers"], m["buffered"] = c.producers, c.buffered
		}
		if c.buffered {
			m["flushes"] = flushes
		}
		return cli.PrintJSON(out, m)
	}
	how := ""
	switch {
	case c.buffered:
		how = fmt.Sprintf(" from %d producers through a buffer (%d flushes, %.1f items each)", c.producers, flushes, float64(c.count)/float64(max(flushes, 1)))
	case c.producers > 0:
		how = fmt.Sprintf(" from %d producers, one statement per item", c.producers)
	}
	out.Printf("enqueued %d items into queue %q (%d parts)%s in %s (%.0f items/s); run id %s\n", c.count, c.queue, parts, how, round(elapsed), rate, runID)
	return nil
}

// progressAfter is how long an enqueue or a cleanup runs before it shows
// its progress: short ones stay quiet.
const progressAfter = 2 * time.Second

// enqueueProgress returns the progress callback of an enqueue of total
// items into queue started at start: a line on stderr (redrawn on a
// terminal, at most one a second otherwise) once it runs longer than
// progressAfter.
func enqueueProgress(out *cli.Console, queue string, total int, start time.Time) func(done int) {
	return func(done int) {
		elapsed := time.Since(start)
		if elapsed < progressAfter {
			return
		}
		rate := float64(done) / elapsed.Seconds()
		line := fmt.Sprintf("demo enqueue: %d/%d items into %q (%.0f%%), %.0f items/s, %s", done, total, queue,
			100*float64(done)/float64(total), rate, elapsed.Round(time.Second))
		if rate > 0 && done < total {
			line += fmt.Sprintf(", about %s left", time.Duration(float64(total-done)/rate*float64(time.Second)).Round(time.Second))
		}
		out.Progress(line, false)
	}
}
