package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// Options.Testing.OnClaim sees every claimed item once, before its handler
// starts.
func TestTestingOnClaimSeesEveryClaimBeforeItsHandler(t *testing.T) {
	t.Parallel()
	const n = 200
	pool := setup(t)
	enqueue(t, pool, "default", n, false)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{} // OnClaim calls per item
	var early []uuid.UUID       // items whose handler ran before OnClaim saw them
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		mu.Lock()
		if seen[it.ID] == 0 {
			early = append(early, it.ID)
		}
		mu.Unlock()
		return recordHandler(0)(ctx, it)
	}
	r := start(t, pool, h, worker.Options{Concurrency: 8, Testing: worker.TestingOptions{
		OnClaim: func(_ context.Context, items []claim.Item) {
			mu.Lock()
			defer mu.Unlock()
			for _, it := range items {
				seen[it.ID]++
			}
		},
	}})
	waitFor(t, "the queue to drain", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	r.Stop(t)
	assertExactlyOnce(t, pool, n)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != n {
		t.Errorf("OnClaim saw %d items, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("OnClaim saw item %v %d times, want once", id, c)
		}
	}
	if len(early) > 0 {
		t.Errorf("%d handlers started before OnClaim saw their items (first: %v)", len(early), early[0])
	}
}
