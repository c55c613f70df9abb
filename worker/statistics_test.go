package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
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
	t.Parallel()
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

// TestSlowStatisticsCheckHoldsUpNoChore holds the session's check of the
// tables' statistics (whose ANALYZE may take up to 30 s) with the test
// hook, while two items run with a one-second lease: their leases must go
// on being extended, and a lowered limit must be read, meanwhile. (With
// the check on the maintenance loop, which extends the leases and reads
// the limits, neither happened until it ended: the items lost their leases
// while their handlers ran, and the limits went stale.)
func TestSlowStatisticsCheckHoldsUpNoChore(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 5}})
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	opts := limitOpts(0)
	opts.Session = longSession()
	opts.Testing.OnStatistics = func(ctx context.Context) {
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	m := &meter{}
	hold := make(chan struct{})
	r := startOn(t, newQueue(t, pool, claim.Options{Lease: time.Second}), m.held(hold), opts)
	defer close(hold)
	defer close(release)
	enqueue(t, pool, "default", 2, false)
	waitFor(t, "2 items in flight", time.Minute, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.cur == 2
	})
	await.Recv(t, "the session to check the tables' statistics", held)
	before := r.w.Stats()
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 3}})
	waitFor(t, "lease extensions and the lowered limit read while the statistics check is held", time.Minute, func() bool {
		st := r.w.Stats()
		return st.LeasesExtended >= before.LeasesExtended+4 && st.Limits.Limits.Queue.MaxInFlight == 3
	})
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL AND lease_until > now()`); n != 2 {
		t.Errorf("%d items held under a live lease while their handlers run, want 2", n)
	}
	if st := r.w.Stats(); st.Limits.Stale {
		t.Errorf("limits stale while the statistics check is held: %+v", st.Limits)
	}
}
