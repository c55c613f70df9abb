package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// The environment of TestParityProcess, the processes that
// TestParityFeaturesInProcesses starts (this test binary, run again).
const (
	parityChildURL  = "CRDBWORK_PARITY_CHILD_URL"
	parityChildRole = "CRDBWORK_PARITY_CHILD_ROLE" // "worker" or "producer"
	parityChildN    = "CRDBWORK_PARITY_CHILD_N"    // the producer's number
)

// parityRounds is how many rounds each producer process runs.
const parityRounds = 8

// TestParityProcess is a process of TestParityFeaturesInProcesses (it is
// skipped otherwise): a worker of the queues "reports" and "orders" until
// it is killed, or a producer that runs parityRounds rounds and exits.
func TestParityProcess(t *testing.T) {
	url := os.Getenv(parityChildURL)
	if url == "" {
		t.Skip("a process of TestParityFeaturesInProcesses")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if os.Getenv(parityChildRole) == "producer" {
		n, _ := strconv.Atoi(os.Getenv(parityChildN))
		parityProducer(t, ctx, pool, n)
		return
	}
	var wg sync.WaitGroup
	for _, queue := range []string{"reports", "orders"} {
		q := newQueue(t, pool, claim.Options{Queue: queue, Lease: 20 * time.Second})
		h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
			if string(it.Payload) == "fail" {
				return nil, claim.Permanent(errors.New("the export failed"))
			}
			return func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO parity_runs (queue, id, payload) VALUES ($1, $2, $3)`, queue, it.ID, string(it.Payload))
				return err
			}, nil
		}
		w, err := worker.New(q, h, worker.Options{Concurrency: 4, Session: longSession(), Poll: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// parityProducer is producer n: each round it enqueues the unique item
// "refresh" of "reports" with UniqueLive (recording in parity_added each
// enqueue told New), then waits until that id is no longer live, so that
// the key must run again for its next round; and into "orders" a
// prerequisite that fails for good with two dependents, one with RunAfter
// (it must run) and one without (it must die), recorded in parity_orders.
func parityProducer(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) {
	reports := newQueue(t, pool, claim.Options{Queue: "reports"})
	orders := newQueue(t, pool, claim.Options{Queue: "orders"})
	for r := 0; r < parityRounds; r++ {
		res, err := reports.Enqueue(ctx, claim.NewItem{UniqueKey: "refresh", UniqueStates: claim.UniqueLive, Payload: []byte("refresh")})
		if err != nil {
			t.Fatal(err)
		}
		if res.New[0] {
			if _, err := pool.Exec(ctx, `INSERT INTO parity_added (producer, round) VALUES ($1, $2)`, n, r); err != nil {
				t.Fatal(err)
			}
		}
		p, anyway, plain := uuid.New(), uuid.New(), uuid.New()
		if _, err := orders.Enqueue(ctx,
			claim.NewItem{ID: p, Payload: []byte("fail"), MaxAttempts: 1},
			claim.NewItem{ID: anyway, Payload: []byte("anyway"), After: []uuid.UUID{p}, RunAfter: claim.PrereqDied},
			claim.NewItem{ID: plain, Payload: []byte("plain"), After: []uuid.UUID{p}}); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO parity_orders (prereq, anyway, plain) VALUES ($1, $2, $3)`, p, anyway, plain); err != nil {
			t.Fatal(err)
		}
		await.Until(t, "the refresh item to end", func() bool {
			var live bool
			if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM crdbwork_items WHERE id = $1)`, res.IDs[0]).Scan(&live); err != nil {
				t.Fatal(err)
			}
			return !live
		})
	}
}

// The parity features together, in the shape of a deployment: two worker
// processes work two queues; two producer processes enqueue, at once, the
// same unique key with UniqueLive ("one pending at a time, run again when
// done") and dependency chains whose prerequisite dies, with and without
// RunAfter; the test itself cancels a delayed item and requeues it from the
// cancelled items while the workers run. Then: every enqueue told New ran
// exactly once and the key ran again after each end (with the default
// states it would run once); every RunAfter dependent ran and every other
// dependent died, "dependency died: <prerequisite>"; the requeued
// cancelled item ran once; nothing is left.
func TestParityFeaturesInProcesses(t *testing.T) {
	t.Parallel()
	if os.Getenv(parityChildURL) != "" {
		t.Skip("in a child process")
	}
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range []string{
		`CREATE TABLE parity_runs (queue TEXT NOT NULL, id UUID NOT NULL, payload TEXT NOT NULL)`,
		`CREATE TABLE parity_added (producer INT NOT NULL, round INT NOT NULL)`,
		`CREATE TABLE parity_orders (prereq UUID NOT NULL, anyway UUID NOT NULL, plain UUID NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	start := func(role string, n int) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestParityProcess$", "-test.count=1")
		cmd.Env = testdb.Environ([]string{parityChildURL + "=", parityChildRole + "=", parityChildN + "="},
			parityChildURL+"="+url, parityChildRole+"="+role, parityChildN+"="+strconv.Itoa(n))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		})
		return cmd
	}
	start("worker", 0)
	start("worker", 1)
	waitFor(t, "both worker processes to work both queues", 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_session_queues`) >= 4
	})
	producers := []*exec.Cmd{start("producer", 0), start("producer", 1)}

	// Meanwhile: a delayed item cancelled, then requeued from the
	// cancelled items: it runs at once (a requeue has no delay).
	reports := newQueue(t, pool, claim.Options{Queue: "reports"})
	late, err := reports.Enqueue(ctx, claim.NewItem{Payload: []byte("late"), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := reports.CancelItem(ctx, late.IDs[0], claim.CancelOptions{By: "test", Reason: "by mistake"}); err != nil || !r.Found || r.Running {
		t.Fatalf("cancel of the delayed item: %+v, %v", r, err)
	}
	if r, err := reports.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: late.IDs[0]}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue of the cancelled item: %+v, %v", r, err)
	}

	for i, p := range producers {
		done := make(chan error, 1)
		go func() { done <- p.Wait() }()
		if err := await.Recv(t, fmt.Sprintf("producer %d to finish", i), done); err != nil {
			t.Fatalf("producer %d: %v", i, err)
		}
	}
	waitFor(t, "every item ended", 2*time.Minute, func() bool {
		// One statement, one snapshot: counted in two, a dependent released
		// from the waiting items between the counts was in neither.
		return count(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items) + (SELECT count(*) FROM crdbwork_waiting)`) == 0
	})

	added := count(t, pool, `SELECT count(*) FROM parity_added`)
	runs := count(t, pool, `SELECT count(*) FROM parity_runs WHERE payload = 'refresh'`)
	if added != runs {
		t.Fatalf("producers were told %d refresh items were added; %d ran", added, runs)
	}
	if runs < parityRounds {
		t.Fatalf("the unique key ran %d times; want at least %d (it runs again after each end)", runs, parityRounds)
	}
	if n := count(t, pool, `SELECT count(*) FROM parity_runs WHERE id = $1`, late.IDs[0]); n != 1 {
		t.Fatalf("the requeued cancelled item ran %d times, want 1", n)
	}
	chains := count(t, pool, `SELECT count(*) FROM parity_orders`)
	if chains != 2*parityRounds {
		t.Fatalf("%d chains recorded, want %d", chains, 2*parityRounds)
	}
	if n := count(t, pool, `SELECT count(*) FROM parity_orders o JOIN parity_runs r ON r.id = o.anyway`); n != chains {
		t.Fatalf("%d of %d RunAfter dependents ran", n, chains)
	}
	if n := count(t, pool, `SELECT count(*) FROM parity_orders o JOIN parity_runs r ON r.id = o.plain`); n != 0 {
		t.Fatalf("%d dependents without RunAfter ran after their prerequisite died", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM parity_orders o JOIN crdbwork_dead_items d ON d.id = o.plain
		WHERE d.reason = 'dependency died: ' || o.prereq::TEXT`); n != chains {
		t.Fatalf("%d of %d dependents without RunAfter died of their prerequisite", n, chains)
	}
	if n := count(t, pool, `SELECT count(*) FROM parity_runs`); n != runs+1+chains {
		t.Fatalf("%d runs in all, want %d (refresh, the requeued item, the RunAfter dependents)", n, runs+1+chains)
	}
}
