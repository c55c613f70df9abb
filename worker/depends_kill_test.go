package worker_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// depsWorkerEnv names the database a dependency worker process works on
// (TestDependsWorkerProcess).
const depsWorkerEnv = "CRDBWORK_DEPS_WORKER_URL"

// TestDependsWorkerProcess is not a test: it is the worker process that
// TestDependsKillMidChain starts (this test binary, run again with
// -test.run set to it and the database in depsWorkerEnv). It works queue
// "deps" until it is killed: each handler records when it started (by the
// database clock), works 200 ms, and writes its result row in the ack's
// transaction.
func TestDependsWorkerProcess(t *testing.T) {
	url := os.Getenv(depsWorkerEnv)
	if url == "" {
		t.Skip("the worker process of TestDependsKillMidChain")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	tm := faultTimings()
	q, err := claim.New(pool, claim.Options{Queue: "deps", Lease: tm.lease, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		var started time.Time
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
			return nil, err
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO dep_results (item_id, started_at) VALUES ($1, $2)`, it.ID, started)
			return err
		}, nil
	}
	w, err := worker.New(q, h, worker.Options{Concurrency: 8, Session: tm.session, RestartDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// A fan-out / fan-in worked by two worker processes, one of which is
// SIGKILLed while it holds prerequisites (children of the root), then
// replaced: nothing is lost, every item ends acked with exactly one result
// row, the join runs exactly once, and its handler starts (database clock)
// after every child's ack. A second join waits for the first and for a
// child, so the chain goes two levels past the fan-in.
func TestDependsKillMidChain(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	ctx := context.Background()
	direct, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	if _, err := direct.Exec(ctx, `CREATE TABLE dep_results (
		row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
		item_id UUID NOT NULL, started_at TIMESTAMPTZ NOT NULL, acked_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(direct, claim.Options{Queue: "deps"})
	if err != nil {
		t.Fatal(err)
	}
	const children = 80
	root, join, join2 := uuid.New(), uuid.New(), uuid.New()
	items := []claim.NewItem{{ID: root, Payload: []byte("root")}}
	var kids []uuid.UUID
	for range children {
		id := uuid.New()
		kids = append(kids, id)
		items = append(items, claim.NewItem{ID: id, Payload: []byte("child"), After: []uuid.UUID{root}})
	}
	items = append(items, claim.NewItem{ID: join, Payload: []byte("join"), After: kids},
		claim.NewItem{ID: join2, Payload: []byte("join2"), After: []uuid.UUID{join, kids[0]}})
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDependsWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), depsWorkerEnv+"="+url)
		if testing.Verbose() {
			cmd.Stderr = os.Stderr
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd
	}
	victim := start()
	start()
	// Wait until the victim holds children, then kill it.
	waitFor(t, "the victim holding prerequisites", time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_items AS i JOIN crdbwork_sessions AS s ON s.id = i.claim
			WHERE s.pid = $1 AND i.id = ANY($2)`, int64(victim.Process.Pid), kids) >= 2
	})
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	killedAt := time.Now()
	start() // a replacement, as a supervisor would start
	all := append([]uuid.UUID{root, join, join2}, kids...)
	waitFor(t, "every item to end", 2*time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'deps' AND outcome = 'acked' AND id = ANY($1)`, all) == len(all)
	})
	t.Logf("every item ended %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	if n := count(t, direct, `SELECT count(*) FROM dep_results`); n != len(all) {
		t.Fatalf("%d result rows, want one per item (%d)", n, len(all))
	}
	if n := count(t, direct, `SELECT count(DISTINCT item_id) FROM dep_results WHERE item_id = ANY($1)`, all); n != len(all) {
		t.Fatalf("%d items have a result, want %d", n, len(all))
	}
	if n := count(t, direct, `SELECT count(*) FROM crdbwork_dead_items`) + count(t, direct, `SELECT count(*) FROM crdbwork_items`) +
		count(t, direct, `SELECT count(*) FROM crdbwork_waiting`) + count(t, direct, `SELECT count(*) FROM crdbwork_waits_for`); n != 0 {
		t.Fatalf("%d dead, queued, waiting or edge rows left", n)
	}
	for _, c := range []struct {
		id      uuid.UUID
		prereqs []uuid.UUID
	}{{join, kids}, {join2, []uuid.UUID{join, kids[0]}}} {
		if n := count(t, direct, `SELECT count(*) FROM dep_results AS j, crdbwork_ended AS e
			WHERE j.item_id = $1 AND e.queue = 'deps' AND e.id = ANY($2) AND e.outcome = 'acked' AND j.started_at > e.ended_at`, c.id, c.prereqs); n != len(c.prereqs) {
			t.Fatalf("join %s started after %d of its %d prerequisites' acks", c.id, n, len(c.prereqs))
		}
	}
	if n := count(t, direct, `SELECT count(*) FROM dep_results AS c, dep_results AS r WHERE r.item_id = $1 AND c.item_id = ANY($2) AND c.started_at > r.acked_at`, root, kids); n != children {
		t.Fatalf("%d of %d children started after the root's ack", n, children)
	}
}
