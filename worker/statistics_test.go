package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
)

// TestWorkerAnalyzesABacklogNeverAnalyzed enqueues 20,000 items into a
// queue of a database whose tables PostgreSQL never analyzed (autovacuum is
// off for them, so nothing else does), and starts a worker of the queue in
// parts mode whose handlers hold their items: the worker must have the
// items table analyzed soon after its session starts (claim.Queue.
// RefreshStatistics), so that the claims in parts mode read their parts'
// index rather than the whole queue's (issue #19). CockroachDB refreshes its
// statistics itself.
func TestWorkerAnalyzesABacklogNeverAnalyzed(t *testing.T) {
	pool := setup(t)
	if testdb.Kind(t) != "postgres" {
		t.Skip("CockroachDB's automatic statistics need no worker")
	}
	ctx := context.Background()
	for _, table := range []string{"crdbwork_items", "crdbwork_ended"} {
		if _, err := pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(t, pool, "alpha", 20000, false)
	analyzed := func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_user_tables WHERE relname = 'crdbwork_items' AND last_analyze IS NOT NULL`) == 1
	}
	if analyzed() {
		t.Fatal("the items table was analyzed before any worker started")
	}
	hold := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	startQueue(t, pool, "alpha", hold, 4)
	waitFor(t, "the worker to have the items table analyzed", 30*time.Second, analyzed)
	if n := remainingIn(t, pool, "alpha"); n != 20000 {
		t.Fatalf("%d items of 20,000 left: the handlers ended some", n)
	}
}
