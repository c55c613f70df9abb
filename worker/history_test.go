package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
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
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// historyChildURL is the database of TestItemHistoryProcess, the worker
// process TestItemHistoryInADeployment starts (this test binary, run
// again) and kills.
const historyChildURL = "CRDBWORK_HISTORY_CHILD_URL"

// historyHandler is the handler of TestItemHistoryInADeployment's
// workers, by payload and attempt: "flaky" fails, then panics, then
// succeeds; "hang" records its first attempt's start in history_started
// and never returns (its process is killed), then succeeds; "doomed"
// fails every time (two attempts: it dies).
func historyHandler(pool *pgxpool.Pool) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		switch p := string(it.Payload); {
		case p == "flaky" && it.Attempt == 1:
			return nil, errors.New("the billing service refused: 503 Service Unavailable")
		case p == "flaky" && it.Attempt == 2:
			var invoices map[string]int
			invoices["INV-7"]++ // a nil map: the handler panics
		case p == "hang" && it.Attempt == 1:
			if _, err := pool.Exec(ctx, `INSERT INTO history_started (id, attempt) VALUES ($1, $2)`, it.ID, it.Attempt); err != nil {
				return nil, err
			}
			<-ctx.Done()
			select {} // killed before it returns
		case p == "doomed":
			return nil, fmt.Errorf("bad input on attempt %d", it.Attempt)
		}
		return func(ctx context.Context, tx pgx.Tx) error { return nil }, nil
	}
}

// historySession is the workers' session: short enough that a peer reaps
// the killed process's session (releasing its claim) within seconds.
func historySession() session.Tuning {
	hb := await.Stretch(100 * time.Millisecond)
	return session.Tuning{Heartbeat: hb, Expiry: 20 * hb}
}

// historyQueue is the queue of TestItemHistoryInADeployment: a lease far
// longer than the session's expiry (the killed attempt ends with its
// session, not its lease) and a short backoff.
func historyQueue(t testing.TB, pool *pgxpool.Pool) *claim.Queue {
	return newQueue(t, pool, claim.Options{Queue: "history", Lease: 10 * time.Minute, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
}

// TestItemHistoryProcess is the worker process of
// TestItemHistoryInADeployment (skipped otherwise).
func TestItemHistoryProcess(t *testing.T) {
	url := os.Getenv(historyChildURL)
	if url == "" {
		t.Skip("a process of TestItemHistoryInADeployment")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w, err := worker.New(historyQueue(t, pool), historyHandler(pool), worker.Options{Concurrency: 2, Session: historySession(), Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// An item's attempts, in the shape of a deployment: a worker process
// starts the item "hang" and is killed (SIGKILL) while it runs; a second
// worker (this process) reaps the dead session, runs "hang" again, and
// works "flaky" (fails, panics, succeeds) and "doomed" (fails twice and
// dies). Queue.Item then shows: "flaky" acked with its three attempts,
// both errors (the panic's with its stack trace) and the success, each
// with its session; "hang" acked with its first attempt lost (no end
// recorded, its session gone) and the second succeeded on the second
// worker's session; "doomed" dead with both failures. On today's main
// Queue.Item found only live items and no attempt history existed.
func TestItemHistoryInADeployment(t *testing.T) {
	t.Parallel()
	if os.Getenv(historyChildURL) != "" {
		t.Skip("in a child process")
	}
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE history_started (id UUID NOT NULL, attempt INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := historyQueue(t, pool)
	cmd := exec.Command(os.Args[0], "-test.run=^TestItemHistoryProcess$", "-test.count=1")
	cmd.Env = testdb.Environ([]string{historyChildURL + "="}, historyChildURL+"="+url)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	hang, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("hang")})
	if err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the worker process to start the item hang", func() bool {
		return count(t, pool, `SELECT count(*) FROM history_started`) == 1
	})
	var killed uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT claim FROM crdbwork_items WHERE id = $1`, hang.IDs[0]).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if it, err := q.Item(ctx, hang.IDs[0]); err != nil || it.State != claim.StateRunning || len(it.History) != 1 ||
		it.History[0].Outcome != claim.AttemptRunning || it.History[0].Session != killed {
		t.Fatalf("the running item: %+v, %v", it, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("flaky")}, claim.NewItem{Payload: []byte("doomed"), MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	flaky, doomed := res.IDs[0], res.IDs[1]
	r := startOn(t, q, historyHandler(pool), worker.Options{Concurrency: 4, Session: historySession(), Poll: 20 * time.Millisecond})
	await.Until(t, "every item to end", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return n == 0, fmt.Sprintf("%d items left", n)
	})
	r.Stop(t)

	it, err := q.Item(ctx, flaky)
	if err != nil {
		t.Fatal(err)
	}
	show := func(it claim.ItemInfo) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%s, %d attempts, recorded %v:", it.State, it.Attempts, it.HistoryRecorded)
		for _, a := range it.History {
			fmt.Fprintf(&b, "\n  #%d %s session %s started %v ended %v error %.80q", a.Number, a.Outcome, a.Session, !a.StartedAt.IsZero(), !a.EndedAt.IsZero(), a.Error)
		}
		return b.String()
	}
	h := it.History
	if it.State != claim.StateAcked || it.Attempts != 3 || !it.HistoryRecorded || len(h) != 3 {
		t.Fatalf("flaky: %s", show(it))
	}
	for i, want := range []claim.AttemptOutcome{claim.AttemptFailed, claim.AttemptFailed, claim.AttemptSucceeded} {
		a := h[i]
		if a.Number != int64(i+1) || a.Outcome != want || a.Session == uuid.Nil || a.StartedAt.IsZero() || a.EndedAt.IsZero() || a.EndedAt.Before(a.StartedAt) {
			t.Errorf("flaky attempt %d: %+v; want %s with its session, start and end", i+1, a, want)
		}
		if i > 0 && a.StartedAt.Before(h[i-1].EndedAt) {
			t.Errorf("flaky attempt %d started %v, before attempt %d ended %v", i+1, a.StartedAt, i, h[i-1].EndedAt)
		}
	}
	if !strings.Contains(h[0].Error, "503 Service Unavailable") {
		t.Errorf("flaky attempt 1's error: %q", h[0].Error)
	}
	if !strings.Contains(h[1].Error, "assignment to entry in nil map") || !strings.Contains(h[1].Error, "goroutine ") ||
		!strings.Contains(h[1].Error, "history_test.go:") {
		t.Errorf("flaky attempt 2's error has no panic with its stack trace: %q", h[1].Error)
	}
	if h[2].Error != "" {
		t.Errorf("the successful attempt has an error: %q", h[2].Error)
	}

	it, err = q.Item(ctx, hang.IDs[0])
	if err != nil {
		t.Fatal(err)
	}
	if h := it.History; it.State != claim.StateAcked || len(h) != 2 ||
		h[0].Number != 1 || h[0].Outcome != claim.AttemptLost || h[0].Error != "" ||
		h[1].Number != 2 || h[1].Outcome != claim.AttemptSucceeded || h[1].Session == uuid.Nil || h[1].Session == killed {
		t.Fatalf("hang (session %s killed): %s", killed, show(it))
	}

	it, err = q.Item(ctx, doomed)
	if err != nil {
		t.Fatal(err)
	}
	if h := it.History; it.State != claim.StateDead || len(h) != 2 ||
		h[0].Outcome != claim.AttemptFailed || h[0].Error != "bad input on attempt 1" ||
		h[1].Outcome != claim.AttemptDead || h[1].Error != "bad input on attempt 2" || h[1].Session == uuid.Nil {
		t.Fatalf("doomed: %s", show(it))
	}
}
