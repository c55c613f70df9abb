package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// When a part's drain times out (its items still run), the session that
// gives it up first cancels those items' handlers and gives the items
// back, so that where the part goes they never run beside their first
// run: a first worker holds every item of two parts until its handlers'
// contexts end, a second joins and takes one part, and no item runs twice
// at once; every item is acked once.
func TestDrainTimeoutCancelsTheHandlersOfThePartGivenUp(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	if err := partition.SetParts(context.Background(), pool, crsql.Tables{}, "default", 2); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var mu sync.Mutex
	running := map[uuid.UUID]int{}
	var overlaps []string
	givenUp := 0
	// handler returns the handler of a worker: the first holds each item
	// until its context ends; the second acks at once.
	handler := func(holds bool) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			mu.Lock()
			running[it.ID]++
			if running[it.ID] > 1 {
				overlaps = append(overlaps, fmt.Sprintf("item %s (part %d) attempt %d started while an earlier run still ran", it.ID, it.Part, it.Attempt))
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				running[it.ID]--
				mu.Unlock()
			}()
			if !holds {
				return nil, nil
			}
			<-ctx.Done()
			if c := context.Cause(ctx); c != nil && strings.Contains(c.Error(), "part is being given up") {
				mu.Lock()
				givenUp++
				mu.Unlock()
			}
			return nil, ctx.Err()
		}
	}
	opts := worker.Options{Parts: 2, Concurrency: n,
		Partition: partition.Tuning{Poll: 50 * time.Millisecond, DrainTimeout: 300 * time.Millisecond}}
	first := start(t, pool, handler(true), opts)
	await.Until(t, "the first worker to own both parts", func() (bool, string) {
		st := first.w.Stats().Parts
		return st.Acquired-st.Released == 2, fmt.Sprintf("%d owned", st.Acquired-st.Released)
	})
	enqueue(t, pool, "default", n, true)
	await.Until(t, "the first worker to run every item", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(running) == n, fmt.Sprintf("%d running", len(running))
	})
	var parts [2]int
	rows, err := pool.Query(context.Background(), `SELECT part, count(*) FROM crdbwork_items GROUP BY part`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p, c int
		if err := rows.Scan(&p, &c); err != nil {
			t.Fatal(err)
		}
		parts[p] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if parts[0] == 0 || parts[1] == 0 {
		t.Fatalf("items by part %v: want items in both parts (the keys hash to one part only)", parts)
	}
	second := start(t, pool, handler(false), opts)
	await.Until(t, "the second worker to take a part and run its items", func() (bool, string) {
		st := second.w.Stats()
		return st.Parts.Acquired > 0 && st.Acked > 0, fmt.Sprintf("parts acquired %d, acked %d", st.Parts.Acquired, st.Acked)
	})
	first.Stop(t) // ends the runs of the part it kept
	await.Until(t, "every item acked", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d items left", left)
	})
	second.Stop(t)
	mu.Lock()
	defer mu.Unlock()
	for _, o := range overlaps {
		t.Error(o)
	}
	if givenUp == 0 {
		t.Error("no handler of the first worker was cancelled because its part was given up")
	}
	t.Logf("items by part %v; %d handlers cancelled as their part was given up", parts, givenUp)
}
