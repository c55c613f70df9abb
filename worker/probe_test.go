package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/worker"
)

// The idle probe (worker.WakeProbe) is what wakes idle workers on
// CockroachDB, which has no LISTEN; the same code runs here, on PostgreSQL,
// with LISTEN off. The producer process enqueues with NoNotify ("quiet"),
// and the workers poll every ten minutes: only the probe can make them
// claim within the tests' deadlines.

// probeText is the start of the probe's statement (store.Store.Probe), as
// pg_stat_activity and the fault proxy see it.
const probeText = `SELECT id, part FROM "crdbwork_items"`

// probePids returns the backend pids of the connections whose last
// statement was the probe.
func probePids(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE $1 ORDER BY pid`, probeText+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// awaitProbing waits until the process's probe has run (one connection,
// whatever the number of workers), and returns its backend pid. On
// CockroachDB, whose pg_stat_activity is an empty table kept for
// compatibility (cockroachdb/docs#18264), it cannot see the probe's
// connection and returns 0 at once: the claims that follow show the probe
// at work there.
func awaitProbing(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	if testdb.Kind(t) != "postgres" {
		t.Log("CockroachDB: the probe's connection is not looked for (pg_stat_activity is empty there)")
		return 0
	}
	var pids []int
	waitFor(t, "the idle probe's first statement", wakeDeadline, func() bool { pids = probePids(t, pool); return len(pids) > 0 })
	if len(pids) != 1 {
		t.Fatalf("%d probe connections %v, want one per process", len(pids), pids)
	}
	return pids[0]
}

// An idle worker claims at once an item that another process enqueued
// without a notification, with and without parts, woken by the probe: its
// poll interval (and the longer one it uses while the probe answers) is ten
// minutes, and LISTEN is off.
func TestProbeClaimsItemEnqueuedByAnotherProcess(t *testing.T) {
	t.Parallel()
	// With parts, the probe names the items' parts and each worker claims
	// only in those it owns: with two workers, each item is claimed at
	// once by the owner of its part, whichever it is.
	for _, c := range []struct{ parts, workers, items int }{{0, 1, 3}, {4, 1, 3}, {8, 2, 8}} {
		t.Run(fmt.Sprintf("parts=%d,workers=%d", c.parts, c.workers), func(t *testing.T) {
			t.Parallel()
			url, pool := wakeSetup(t)
			h, started := startedHandler()
			var rs []*running
			for range c.workers {
				rs = append(rs, start(t, pool, h, worker.Options{Poll: sleepyPoll, Wake: worker.WakeProbe, Parts: c.parts,
					Partition: partition.Tuning{Poll: 50 * time.Millisecond}}))
			}
			if c.parts > 0 {
				waitFor(t, "the workers to share every part", wakeDeadline, func() bool {
					owned := 0
					for _, r := range rs {
						st := r.w.Stats().Parts
						if st.Acquired == st.Released {
							return false // one owns none yet
						}
						owned += int(st.Acquired - st.Released)
					}
					return owned == c.parts
				})
			}
			awaitProbing(t, pool)
			wakeups := func() (n int64) {
				for _, r := range rs {
					n += r.w.Stats().Wakeups
				}
				return n
			}
			for i := range c.items {
				before := wakeups()
				produce(t, url, "quiet::default")
				awaitItem(t, started, fmt.Sprintf("item %d", i))
				// The probe's wake-up for the item is counted when the
				// claim loop next waits: a claim that was already under
				// way when it came (a wake-up that came during the claim
				// before is kept for the next wait) may have taken the
				// item first, and the loop counts it after that claim.
				// Without a wake-up at all the item would wait for the
				// ten-minute poll.
				await.Until(t, fmt.Sprintf("item %d's wake-up to be counted", i), func() (bool, string) {
					w := wakeups()
					return w > before, fmt.Sprintf("wake-ups %d, before the item %d", w, before)
				}, await.Within(wakeDeadline))
			}
			if testdb.Kind(t) != "postgres" {
				return // the connections are counted in pg_stat_activity, empty on CockroachDB
			}
			if pid := listenerPid(t, pool); pid != 0 {
				t.Errorf("a listener connection (backend %d) with WakeProbe", pid)
			}
			if pids := probePids(t, pool); len(pids) != 1 {
				t.Errorf("%d probe connections %v, want one per process", len(pids), pids)
			}
		})
	}
}

// When the probe's connection is cut (the fault proxy drops every
// connection that sends the probe's statement), an idle worker that was
// waiting on the probe goes back to its poll at once and claims what
// another process enqueued; once the connection works again, the probe
// reconnects and wakes the worker again.
func TestProbeConnectionCutFallsBackToPoll(t *testing.T) {
	t.Parallel()
	url, _ := wakeSetup(t)
	p, pu, err := faultproxy.ForURL(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err := pgxpool.New(context.Background(), pu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	h, started := startedHandler()
	// Poll 100 ms, but ten minutes while the probe answers: only the
	// probe, or the fall-back to Poll when it fails, claims within the
	// deadlines.
	// The proxy sees each probe statement the worker's process sends, on
	// either engine.
	probed := func(what string) {
		t.Helper()
		await.Recv(t, "a probe statement "+what, p.Arm(faultproxy.Rule{Match: faultproxy.Contains(probeText), Action: faultproxy.Pass}), await.Within(wakeDeadline))
	}
	r := startOn(t, newQueue(t, proxied, claim.Options{}), h, worker.Options{Poll: 100 * time.Millisecond, ProbePoll: sleepyPoll,
		Wake: worker.WakeProbe})
	probed("after the worker started")
	produce(t, url, "quiet::default")
	awaitItem(t, started, "the item found by the probe")
	// The worker now idles on the probe's long interval. Every connection
	// that sends the probe's statement is dropped from now on (the
	// statement never reaches the server); the worker's own statements go
	// through.
	fired := p.Arm(faultproxy.Rule{Match: faultproxy.Contains(probeText), Action: faultproxy.DropStatement, Times: 1 << 30})
	await.Recv(t, "a probe statement after its item was claimed", fired, await.Within(wakeDeadline))
	produce(t, url, "quiet::default")
	awaitItem(t, started, "the item enqueued while the probe's connection is cut (found by the poll)")
	claimed := r.w.Stats().Claimed
	p.Disarm()
	// The probe's statement reaches the server again: on a new connection,
	// since the proxy closed every one that sent it.
	probed("after the connection was restored")
	produce(t, url, "quiet::default")
	awaitItem(t, started, "the item enqueued after the probe reconnected")
	if got := r.w.Stats().Claimed; got != claimed+1 {
		t.Errorf("claimed %d items after the probe reconnected, want 1", got-claimed)
	}
}
