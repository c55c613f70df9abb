package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// At-most-once items through a worker: each is handled at most once (no
// item has two result rows, none runs twice), the ones whose handler fails
// are dropped, not retried and not dead-lettered, and every item ends: the
// items table drains.
func TestWorkerAtMostOnceItems(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "amo"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i)), AtMostOnce: i%2 == 0}
	}
	ids, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	fails := map[uuid.UUID]bool{}
	for i, id := range ids.IDs {
		if i%10 == 0 { // at-most-once (even) items that fail: dropped
			fails[id] = true
		}
	}
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		mu.Lock()
		runs[it.ID]++
		mu.Unlock()
		if fails[it.ID] {
			return nil, errors.New("fails")
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, part, owned) VALUES ($1, $2, 0, false)`, it.ID, it.Session)
			return err
		}, nil
	}
	var ws []*running
	for range 2 {
		ws = append(ws, startOn(t, newQueue(t, pool, claim.Options{Queue: "amo"}), h, worker.Options{Concurrency: 16}))
	}
	waitFor(t, "the queue to drain", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 &&
			count(t, pool, `SELECT count(*) FROM results`) == n-len(fails)
	})
	var dropped int64
	for _, r := range ws {
		r.Stop(t)
		dropped += r.w.Stats().Dropped
	}
	if dropped != int64(len(fails)) {
		t.Fatalf("dropped %d, want the %d failing at-most-once items", dropped, len(fails))
	}
	if c := count(t, pool, `SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id HAVING count(*) > 1) AS d`); c != 0 {
		t.Fatalf("%d items recorded twice", c)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); c != 0 {
		t.Fatalf("%d dead items; failing at-most-once items are dropped, not dead-lettered", c)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids.IDs {
		if i%2 == 0 && runs[id] != 1 {
			t.Fatalf("at-most-once item %d ran %d times", i, runs[id])
		}
	}
}

// Items with a deadline that a busy worker cannot reach in time end dead
// with reason "expired" and are never handled; the rest are acked: every
// item ends, in bound.
func TestWorkerItemsExpire(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "ttl"})
	if err != nil {
		t.Fatal(err)
	}
	// 40 items of 50 ms each through 2 handlers take about a second; the
	// 20 low-priority items expire after 300 ms, long before their turn.
	var items []claim.NewItem
	for i := range 40 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint(i))})
	}
	for i := range 20 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("late ", i)), Priority: 9, TTL: 300 * time.Millisecond})
	}
	ids, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	late := map[uuid.UUID]bool{}
	for _, id := range ids.IDs[40:] {
		late[id] = true
	}
	var mu sync.Mutex
	handledLate := 0
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if late[it.ID] {
			mu.Lock()
			handledLate++
			mu.Unlock()
		}
		time.Sleep(50 * time.Millisecond) // the handler's work: the late items expire meanwhile
		return nil, nil
	}
	r := startOn(t, newQueue(t, pool, claim.Options{Queue: "ttl"}), h, worker.Options{Concurrency: 2})
	waitFor(t, "every item to end", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'ttl'`) == 0
	})
	r.Stop(t)
	expired := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE reason = 'expired'`)
	mu.Lock()
	defer mu.Unlock()
	if expired+handledLate != 20 || expired == 0 {
		t.Fatalf("of 20 items with a deadline: %d expired, %d handled; want all accounted for, most expired", expired, handledLate)
	}
	if st := r.w.Stats(); st.Acked != int64(40+handledLate) {
		t.Fatalf("acked %d, want %d", st.Acked, 40+handledLate)
	}
}
