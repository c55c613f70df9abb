package worker_test

// Several queues in one database (issue 16): a queue's parts and limit
// shares are divided among the sessions that work it, and only those; the
// urgent lane stays within tenant limits; limits that cannot be re-read
// fail safe.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// startQueue starts a worker with fast options on queue with parts (0: none).
func startQueue(t testing.TB, pool *pgxpool.Pool, queue string, h worker.Handler, parts int) *running {
	t.Helper()
	return startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), h, limitOpts(parts))
}

// remainingIn counts the items of queue still in the table.
func remainingIn(t testing.TB, pool *pgxpool.Pool, queue string) int {
	return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1`, queue)
}

// TestQueuesShareADatabase works two queues side by side in one database,
// each with its own workers (one worker per queue, then two): parts and
// parts (8 each), and a parts queue beside a queue without parts. Every
// item of both queues must end within the deadline, each recorded once.
// Before queues had members, each queue's parts were divided among every
// live session of the database, and the parts given to the other queue's
// sessions stayed unclaimed for ever.
func TestQueuesShareADatabase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		alpha, beta int // parts (0: none)
		perQueue    int
	}{
		{"parts+parts", 8, 8, 1},
		{"parts+parts/two-workers-each", 8, 8, 2},
		{"parts+none", 8, 0, 1},
		{"parts+none/two-workers-each", 8, 0, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const n = 200
			pool := setup(t)
			ctx := context.Background()
			for q, parts := range map[string]int{"alpha": c.alpha, "beta": c.beta} {
				if parts > 0 {
					if err := partition.SetParts(ctx, pool, crsql.Tables{}, q, parts); err != nil {
						t.Fatal(err)
					}
				}
				enqueue(t, pool, q, n, true)
			}
			for range c.perQueue {
				startQueue(t, pool, "alpha", recordHandler(0), c.alpha)
				startQueue(t, pool, "beta", recordHandler(0), c.beta)
			}
			waitFor(t, "every item of both queues to end", 30*time.Second, func() bool {
				return remainingIn(t, pool, "alpha") == 0 && remainingIn(t, pool, "beta") == 0
			})
			assertExactlyOnce(t, pool, 2*n)
			if c.alpha > 0 {
				// Only alpha's sessions own alpha's parts.
				if bad := count(t, pool, `SELECT count(*) FROM crdbwork_session_parts AS p
					WHERE p.queue = 'alpha' AND NOT EXISTS (SELECT 1 FROM crdbwork_session_queues AS m
						WHERE m.queue = 'alpha' AND m.session_id = p.session_id)`); bad != 0 {
					t.Errorf("%d parts of alpha owned by sessions that do not work alpha", bad)
				}
			}
		})
	}
}

// TestOneProcessManyQueues runs, in one process on one pool, a worker per
// queue for three queues (8 parts, 4 parts, none) and checks that every
// item of every queue ends.
func TestOneProcessManyQueues(t *testing.T) {
	t.Parallel()
	const n = 150
	pool := setup(t)
	ctx := context.Background()
	queues := map[string]int{"q8": 8, "q4": 4, "q0": 0}
	for q, parts := range queues {
		if parts > 0 {
			if err := partition.SetParts(ctx, pool, crsql.Tables{}, q, parts); err != nil {
				t.Fatal(err)
			}
		}
		enqueue(t, pool, q, n, true)
		startQueue(t, pool, q, recordHandler(0), parts)
	}
	waitFor(t, "every item of every queue to end", 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	assertExactlyOnce(t, pool, 3*n)
}

// TestLimitHoldsBesideOtherQueues sets an in-flight limit of 4 on queue
// alpha, worked by two workers, while two workers of queue beta are live
// in the same database. The shares of alpha's workers must add up to the
// limit (not diluted by beta's sessions, as when shares were divided among
// every live session: 2 of 4), alpha must reach its limit, and never go
// past it.
func TestLimitHoldsBesideOtherQueues(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{0, 8} {
		t.Run(fmt.Sprintf("parts=%d", parts), func(t *testing.T) {
			t.Parallel()
			const n, limit = 120, 4
			pool := setup(t)
			ctx := context.Background()
			for _, q := range []string{"alpha", "beta"} {
				if parts > 0 {
					if err := partition.SetParts(ctx, pool, crsql.Tables{}, q, parts); err != nil {
						t.Fatal(err)
					}
				}
			}
			setLimits(t, pool, "alpha", worker.Limits{Queue: claim.Limit{MaxInFlight: limit}})
			m := &meter{}
			var alpha []*running
			for range 2 {
				alpha = append(alpha, startQueue(t, pool, "alpha", m.handler(100*time.Millisecond, 150*time.Millisecond), parts))
				startQueue(t, pool, "beta", recordHandler(0), parts)
			}
			waitFor(t, "alpha's workers' shares to add up to its limit", 30*time.Second, func() bool {
				var share int64
				for _, r := range alpha {
					share += r.w.Stats().Limits.Share
				}
				return share == limit
			})
			enqueue(t, pool, "alpha", n, false)
			enqueue(t, pool, "beta", n, false)
			waitFor(t, "every item to end", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
			most, mean, _ := m.figures(time.Second)
			t.Logf("limit %d: at most %d at once, mean %.2f", limit, most, mean)
			if most > limit {
				t.Errorf("%d items of alpha ran at once; its limit is %d", most, limit)
			}
			if most < limit {
				t.Errorf("at most %d items of alpha ran at once; its limit %d was never reached (shares diluted)", most, limit)
			}
		})
	}
}

// tenantMeter counts the items of each tenant running at once.
type tenantMeter struct {
	mu       sync.Mutex
	cur, max map[string]int
	done     int
}

func (m *tenantMeter) handler(d time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		m.mu.Lock()
		m.cur[it.Tenant]++
		m.max[it.Tenant] = max(m.max[it.Tenant], m.cur[it.Tenant])
		m.mu.Unlock()
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		m.mu.Lock()
		m.cur[it.Tenant]--
		m.done++
		m.mu.Unlock()
		return nil, ctx.Err()
	}
}

// TestUrgentLaneKeepsTenantLimits: three workers with the urgent lane on,
// a tenant limited to 2 items in flight, and every item of the tenant
// urgent. In parts mode each session enforces a tenant's whole limit for
// the tenant's part it owns; lane claims used to take the tenant's items
// from any part, so each of the three sessions ran up to 2 (6 at once).
// Never more than 2 may run at once; another tenant's items, unlimited,
// still go through the lane.
func TestUrgentLaneKeepsTenantLimits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		lims worker.Limits
	}{
		{"tenant-limit", worker.Limits{Tenants: map[string]claim.Limit{"slow": {MaxInFlight: 2}}}},
		{"default-tenant-limit", worker.Limits{Tenant: claim.Limit{MaxInFlight: 2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const parts, n = 6, 60
			pool := setup(t)
			ctx := context.Background()
			if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
				t.Fatal(err)
			}
			setLimits(t, pool, "default", c.lims)
			m := &tenantMeter{cur: map[string]int{}, max: map[string]int{}}
			opts := limitOpts(parts)
			opts.UrgentLane, opts.UrgentPriority = true, 0
			var ws []*running
			for range 3 {
				ws = append(ws, start(t, pool, m.handler(100*time.Millisecond), opts))
			}
			waitFor(t, "every worker to own two parts and have read the limits", 30*time.Second, func() bool {
				for _, r := range ws {
					st := r.w.Stats()
					if st.Session == "" || st.Limits.Limits.Tenant != c.lims.Tenant || len(st.Limits.Limits.Tenants) != len(c.lims.Tenants) {
						return false
					}
				}
				// Settled: each owns two of the six parts.
				return count(t, pool, `SELECT count(*) FROM (SELECT session_id FROM crdbwork_session_parts
					GROUP BY session_id HAVING count(*) = 2) AS settled`) == 3
			})
			q, err := claim.New(pool, claim.Options{})
			if err != nil {
				t.Fatal(err)
			}
			items := make([]claim.NewItem, n)
			for i := range items {
				items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i)), Tenant: "slow", Priority: 0}
			}
			if _, err := q.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "every item to end", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
			m.mu.Lock()
			most := m.max["slow"]
			m.mu.Unlock()
			t.Logf("tenant limited to 2: at most %d at once", most)
			if most > 2 {
				t.Errorf("%d items of the tenant ran at once; its limit is 2", most)
			}
		})
	}
}

// TestLimitsFailSafe lowers a queue's limit from 4 to 1 while the worker
// cannot re-read its limits (the tenant limits table is renamed away, so
// every re-read fails; claims do not read that table). Keeping the last
// values read, the worker would run 4 items at once for as long as the
// reads fail. After LimitOptions.StaleAfter without a successful read it
// claims nothing the limits govern: its items in flight drop to none
// while the backlog waits, and Stats says the limits are stale. Once the
// table is back, the new limit of 1 applies and every item ends.
//
// The handlers hold their items until the test lets them go, so no claim
// can run (the share of 4 is used up) from before the limits are stale
// until after: every claim the test sees afterwards was planned with stale
// or new limits. (It used to let items run for 100 ms and take a moment
// with nothing in flight for the fail-safe; under CPU load such a moment
// also came between two claims while the last good read was younger than
// StaleAfter, and the test failed a third of its runs, on code that did
// what it should.)
func TestLimitsFailSafe(t *testing.T) {
	t.Parallel()
	const n = 200
	pool := setup(t)
	ctx := context.Background()
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 4}})
	m := &meter{}
	hold := make(chan struct{})
	opts := limitOpts(0)
	// A session lost on a busy machine would start again without limits
	// (claiming nothing, never stale): not what this test is about. The
	// heartbeat and StaleAfter stretch with the machine's load (one
	// reading), so that slow reads alone do not make the limits stale.
	hb := await.Stretch(100 * time.Millisecond)
	opts.Limits.StaleAfter = 10 * hb
	opts.Session = session.Tuning{Heartbeat: hb, Expiry: 100 * hb}
	r := start(t, pool, m.held(hold), opts)
	enqueue(t, pool, "default", n, false)
	waitFor(t, "4 items in flight", 30*time.Second, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.cur == 4
	})
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_tenant_limits RENAME TO crdbwork_tenant_limits_away`); err != nil {
		t.Fatal(err)
	}
	renamed := true
	t.Cleanup(func() {
		if renamed {
			pool.Exec(ctx, `ALTER TABLE crdbwork_tenant_limits_away RENAME TO crdbwork_tenant_limits`)
		}
	})
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 1}})
	await.Until(t, "the limits to be stale after failed reads", func() (bool, string) {
		st := r.w.Stats().Limits
		return st.Stale && st.FailedReads > 0, fmt.Sprintf("%+v", st)
	})
	st := r.w.Stats().Limits
	if st.FailedReads == 0 || st.Limits.Queue.MaxInFlight != 4 {
		t.Errorf("limit stats %+v: want the last limit read (4) kept and the failed reads counted", st)
	}
	m.mu.Lock()
	started := len(m.starts)
	m.mu.Unlock()
	if started != 4 {
		t.Fatalf("%d handlers started before the limits were stale; the limit was 4 and the first 4 hold", started)
	}
	close(hold) // the 4 end; the items run later end at once
	waitFor(t, "the worker to run nothing while the backlog waits", 30*time.Second, func() bool {
		m.mu.Lock()
		cur := m.cur
		m.mu.Unlock()
		return cur == 0 && r.w.Stats().InFlight == 0
	})
	// It stays that way while the reads fail: a few more failed reads, no
	// new handler.
	fails := r.w.Stats().Limits.FailedReads
	waitFor(t, "three more failed reads", 30*time.Second, func() bool { return r.w.Stats().Limits.FailedReads >= fails+3 })
	m.mu.Lock()
	later := len(m.starts)
	m.mu.Unlock()
	if later != started {
		t.Errorf("%d handlers started while the limits were stale", later-started)
	}
	if st := r.w.Stats(); !st.Limits.Stale || st.SessionsLost != 0 {
		t.Errorf("stats %+v while the reads fail: want the limits stale, no session lost", st)
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL`); left != n-started {
		t.Errorf("%d items unclaimed, want %d: the backlog waits", left, n-started)
	}
	// Nothing runs now: every item from here on was claimed with the new
	// limit, read once the table is back.
	m.mu.Lock()
	m.max = 0
	m.mu.Unlock()
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_tenant_limits_away RENAME TO crdbwork_tenant_limits`); err != nil {
		t.Fatal(err)
	}
	renamed = false
	waitFor(t, "every item to end", 2*time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	if st := r.w.Stats().Limits; st.Stale || st.Limits.Queue.MaxInFlight != 1 {
		t.Errorf("limit stats %+v after a successful read: want the new limit (1), not stale", st)
	}
	m.mu.Lock()
	most := m.max
	m.mu.Unlock()
	if most > 1 {
		t.Errorf("%d items ran at once after the reads came back; the lowered limit is 1", most)
	}
}

// TestLimitReadsBehindALock holds a lock on the tenant limits table for
// longer than StaleAfter, as a migration's ALTER TABLE does while it waits
// for its own lock, while two items of a limited queue run with a lease of
// a second. Each re-read of the limits waits behind the lock. It used to
// wait for as long as the lock was held, and so did the chores that share
// its loop: no lease was extended (the running items' leases ran out), no
// cancel was looked for, no reap ran, and no failed read was counted. A
// read is bounded by StaleAfter: while the table is locked the reads fail,
// the limits go stale, the running items keep their claims and their
// leases are extended.
func TestLimitReadsBehindALock(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 2}})
	m := &meter{}
	hold := make(chan struct{})
	opts := limitOpts(0)
	opts.Limits.StaleAfter = time.Second
	opts.Session = longSession()
	r := startOn(t, newQueue(t, pool, claim.Options{Lease: time.Second}), m.held(hold), opts)
	enqueue(t, pool, "default", 10, false)
	waitFor(t, "2 items in flight", 30*time.Second, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.cur == 2
	})
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	lock := `LOCK TABLE crdbwork_tenant_limits IN ACCESS EXCLUSIVE MODE`
	if testdb.Kind(t) != "postgres" {
		// CockroachDB has no table locks; a reader waits for a
		// conflicting write of an open transaction.
		lock = `INSERT INTO crdbwork_tenant_limits (queue, tenant, max_in_flight) VALUES ('default', 'locker', 1)`
	}
	if _, err := tx.Exec(ctx, lock); err != nil {
		t.Fatal(err)
	}
	before := r.w.Stats()
	waitFor(t, "failed reads and lease extensions while the table is locked", 30*time.Second, func() bool {
		st := r.w.Stats()
		return st.Limits.FailedReads >= before.Limits.FailedReads+2 && st.LeasesExtended >= before.LeasesExtended+4
	})
	if st := r.w.Stats().Limits; !st.Stale {
		t.Errorf("limit stats %+v after reads failed for longer than StaleAfter: want stale", st)
	}
	if held := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`); held != 2 {
		t.Errorf("%d items claimed while the table is locked, want the 2 running", held)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	close(hold)
	waitFor(t, "every item to end and the limits to be read again", time.Minute, func() bool {
		return !r.w.Stats().Limits.Stale && count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	m.mu.Lock()
	most := m.max
	m.mu.Unlock()
	if most > 2 {
		t.Errorf("%d items ran at once; the limit is 2", most)
	}
}
