package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// A database that goes away for longer than the session expiry, under load:
// the workers lose their sessions, keep retrying, start new sessions when it
// is back, and every item is still recorded exactly once, each by a session
// that owned its part.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	const n = 3000
	direct := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, direct, crsql.Tables{}, "default", 16); err != nil {
		t.Fatal(err)
	}
	enqueue(t, direct, "default", n, true)

	p, pu, err := faultproxy.ForURL(direct.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err := pgxpool.New(ctx, pu)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)

	sess := fastSession()
	var workers []*running
	for range 2 {
		workers = append(workers, start(t, proxied, recordHandler(2*time.Millisecond), worker.Options{
			Session: sess, Parts: 16, Concurrency: 8, RestartDelay: 200 * time.Millisecond,
			Partition: partition.Tuning{Poll: 200 * time.Millisecond},
		}))
	}
	waitFor(t, "some items to be done", time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM results`) >= n/5
	})
	p.Cut()
	outage := 3 * sess.Expiry // stretched with the sessions' intervals
	time.Sleep(outage)        // the outage itself, not a wait for a condition
	p.Restore()
	t.Logf("database unreachable for %v", outage)

	waitFor(t, "the queue to drain after the outage", 2*time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	var lost int64
	for _, r := range workers {
		r.Stop(t)
		lost += r.w.Stats().SessionsLost
	}
	assertExactlyOnce(t, direct, n)
	if bad := count(t, direct, `SELECT count(*) FROM results WHERE NOT owned`); bad != 0 {
		t.Errorf("%d results recorded by a session that did not own the item's part", bad)
	}
	if lost == 0 {
		t.Error("no session was lost: the outage did not reach the workers")
	}
	t.Logf("sessions lost: %d", lost)
}
