package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
)

// enqueueChunk is the number of items enqueued per transaction.
const enqueueChunk = 1000

// keySpace is the number of distinct item keys: item i has key "key-<i%keySpace>".
const keySpace = 1000

// enqueueDemo enqueues n demo items into queue and records their ids in
// demo_enqueued under runID, chunk by chunk, each chunk in one transaction
// with its record, so that verify knows exactly what was enqueued.
func enqueueDemo(ctx context.Context, pool *pgxpool.Pool, queue string, runID uuid.UUID, n int) error {
	return enqueueDemoShaped(ctx, pool, queue, runID, n, itemShape{})
}

// itemShape is what demo enqueue's flags give every item.
type itemShape struct {
	ttl        time.Duration // NewItem.TTL
	atMostOnce bool          // NewItem.AtMostOnce
	// priorities > 1 gives each item a uniformly random priority in [0,
	// priorities); otherwise 0.
	priorities int
}

// enqueueDemoShaped is enqueueDemo with every item shaped by shape.
func enqueueDemoShaped(ctx context.Context, pool *pgxpool.Pool, queue string, runID uuid.UUID, n int, shape itemShape) error {
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		return err
	}
	for start := 0; start < n; start += enqueueChunk {
		items := make([]claim.NewItem, 0, min(enqueueChunk, n-start))
		for i := start; i < min(start+enqueueChunk, n); i++ {
			it := claim.NewItem{
				Payload:    []byte(strconv.Itoa(i)),
				Key:        fmt.Sprintf("key-%d", i%keySpace),
				TTL:        shape.ttl,
				AtMostOnce: shape.atMostOnce,
			}
			if shape.priorities > 1 {
				it.Priority = rand.IntN(shape.priorities)
			}
			items = append(items, it)
		}
		if err := enqueueChunkTx(ctx, pool, q, runID, items); err != nil {
			return fmt.Errorf("enqueueing items %d..%d: %w", start, start+len(items)-1, err)
		}
	}
	return nil
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
			ids, err := q.EnqueueTx(ctx, tx, items...)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO demo_enqueued (item_id, run_id) SELECT unnest($1::UUID[]), $2::UUID`, ids, runID); err != nil {
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
	count int
	parts int
	shape itemShape
}

func cmdEnqueue(ctx context.Context, name string, args []string, out *console) error {
	var c enqueueConfig
	f := newFlagSet(name, `Enqueues demo items (payload: the item's number; key "key-<i % 1000>") into the
queue, and records their ids in demo_enqueued under a new run id, in the same
transactions, so that "demo verify" can check them. Needs "demo migrate" first.
With --ttl, items not acked within it end dead with reason "expired" ("demo
dead"); with --at-most-once, the claim that hands an item out deletes it.`)
	c.register(f, urlRequired)
	f.intVar(&c.count, "count", 1000, 1, 100_000_000, "number of items to enqueue")
	f.durationVar(&c.shape.ttl, "ttl", 0, true, "give every item this time to live (0: none)")
	f.boolVar(&c.shape.atMostOnce, "at-most-once", false, "make every item at-most-once (handled at most once, lost if its handler fails)")
	f.flagOnly("at-most-once")
	f.intVar(&c.parts, "parts", defaultParts, 1, partition.MaxParts, "set the queue's number of parts first (not given: keep the stored number; a new queue gets the default)")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	pool, err := openChecked(ctx, &c.common, f, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireDemoTables(ctx, pool); err != nil {
		return err
	}
	var parts int
	if f.isSet("parts") {
		if err := partition.SetParts(ctx, pool, tables, c.queue, c.parts); err != nil {
			return failf(1, "%v", err)
		}
		parts = c.parts
	} else if parts, err = partition.EnsureParts(ctx, pool, tables, c.queue, c.parts); err != nil {
		return failf(1, "%v", err)
	}
	runID := uuid.New()
	start := time.Now()
	if err := enqueueDemoShaped(ctx, pool, c.queue, runID, c.count, c.shape); err != nil {
		if ctx.Err() != nil {
			return failf(130, "interrupted: %v", err)
		}
		return failf(1, "%v", err)
	}
	elapsed := time.Since(start)
	if c.json {
		return printJSON(out, map[string]any{
			"enqueued": c.count, "queue": c.queue, "parts": parts, "run_id": runID.String(),
			"elapsed_seconds": elapsed.Seconds(),
		})
	}
	out.printf("enqueued %d items into queue %q (%d parts) in %s; run id %s\n", c.count, c.queue, parts, round(elapsed), runID)
	return nil
}
