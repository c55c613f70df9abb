package worker_test

import (
	"context"
	"errors"
	"io"
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
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// The worker process of the cancel tests: TestCancelWorkerProcess runs a
// worker in a child process (the test binary run again) whose handler logs
// its start, waits for its context to end, logs why, and then returns a
// result for the ack to write — which must never commit for a cancelled
// item.
const (
	cancelProcURL  = "CRDBWORK_CANCEL_URL"
	cancelProcMode = "CRDBWORK_CANCEL_MODE" // "notify": 20 s heartbeats, wake-ups on; "heartbeat": 300 ms heartbeats, NoWake
)

// cancelTables creates the tables the cancel tests' handlers write.
func cancelTables(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, s := range []string{
		`CREATE TABLE cancel_log (item_id UUID NOT NULL, event TEXT NOT NULL, cancelled BOOL NOT NULL DEFAULT false,
			by_whom TEXT NOT NULL DEFAULT '', cause TEXT NOT NULL DEFAULT '', pid BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())`,
		`CREATE TABLE cancel_results (item_id UUID NOT NULL)`,
	} {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// blockingHandler logs each start, blocks until ctx ends, logs how, and
// returns a record that writes the item's result.
func blockingHandler(pool *pgxpool.Pool) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		bg := context.Background()
		if _, err := pool.Exec(bg, `INSERT INTO cancel_log (item_id, event, pid) VALUES ($1, 'started', $2)`, it.ID, os.Getpid()); err != nil {
			return nil, err
		}
		<-ctx.Done()
		ce, ok := worker.Cancelled(ctx)
		by := ""
		if ok {
			by = ce.By
		}
		if _, err := pool.Exec(bg, `INSERT INTO cancel_log (item_id, event, cancelled, by_whom, cause, pid) VALUES ($1, 'stopped', $2, $3, $4, $5)`,
			it.ID, ok && errors.Is(context.Cause(ctx), claim.ErrCancelled), by, context.Cause(ctx).Error(), os.Getpid()); err != nil {
			return nil, err
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO cancel_results (item_id) VALUES ($1)`, it.ID)
			return err
		}, nil
	}
}

// TestCancelWorkerProcess is the worker process of the cancel tests; by
// itself it skips. It works until its standard input closes.
func TestCancelWorkerProcess(t *testing.T) {
	url := os.Getenv(cancelProcURL)
	if url == "" {
		t.Skip("the worker process of TestCancelReachesHandlerInAnotherProcess; not a test by itself")
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The other item's handler blocks until a shutdown cancels it.
	opts := worker.Options{Concurrency: 2, Poll: 50 * time.Millisecond, ShutdownTimeout: 500 * time.Millisecond}
	switch os.Getenv(cancelProcMode) {
	case "notify":
		// Heartbeats (and so the heartbeat's cancel check) ten minutes
		// apart: a cancel seen sooner — the test's wait is 10 s, stretched
		// with the machine's load — came through the notification.
		opts.Session = session.Tuning{Heartbeat: 10 * time.Minute, Expiry: 30 * time.Minute}
		opts.Limits.Refresh = 30 * time.Minute
	default:
		opts.Session = session.Tuning{Heartbeat: 300 * time.Millisecond, Expiry: 1500 * time.Millisecond}
		opts.NoWake = true
	}
	w, err := worker.New(q, blockingHandler(pool), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// startCancelWorker starts the worker process in mode on the database at
// url; closing the returned writer stops it gracefully.
func startCancelWorker(t *testing.T, url, mode string) (*exec.Cmd, io.WriteCloser, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCancelWorkerProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), cancelProcURL+"="+url, cancelProcMode+"="+mode)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, stdin, out
}

func countRows(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A cancel asked in this process reaches the handler running in another
// (the worker process), whose context's cause says it was cancelled and by
// whom, within the bound: at once through the notification (the worker's
// heartbeats are ten minutes apart, so the heartbeat cannot be what told it), or
// within a heartbeat without notifications. The handler's attempted ack
// commits nothing, and the item ends as cancelled with who and why.
func TestCancelReachesHandlerInAnotherProcess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mode  string
		bound time.Duration // the stated bound plus slack (the wait stretches it with the load)
	}{
		{"notify", 10 * time.Second},                         // notification; the heartbeat would take ten minutes
		{"heartbeat", 300*time.Millisecond + 10*time.Second}, // one heartbeat
	} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			url, pool := wakeSetup(t)
			cancelTables(t, pool)
			ctx := context.Background()
			q, err := claim.New(pool, claim.Options{})
			if err != nil {
				t.Fatal(err)
			}
			enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("long")}, claim.NewItem{Payload: []byte("other")})
			if err != nil {
				t.Fatal(err)
			}
			id := enq.IDs[0]
			cmd, stdin, out := startCancelWorker(t, url, c.mode)
			await.Until(t, "both handlers to start in the worker process", func() bool {
				return countRows(t, pool, `SELECT count(*) FROM cancel_log WHERE event = 'started' AND pid = $1`, cmd.Process.Pid) == 2
			})
			asked := time.Now()
			res, err := q.CancelItem(ctx, id, claim.CancelOptions{By: "tester@here", Reason: "not needed"})
			if err != nil || !res.Running {
				t.Fatalf("cancel: %+v %v", res, err)
			}
			await.Until(t, "the handler's context to be cancelled", func() bool {
				return countRows(t, pool, `SELECT count(*) FROM cancel_log WHERE item_id = $1 AND event = 'stopped'`, id) == 1
			}, await.Within(c.bound))
			t.Logf("the handler saw the cancel %v after it was asked", time.Since(asked).Round(time.Millisecond))
			var cancelled bool
			var by, cause string
			if err := pool.QueryRow(ctx, `SELECT cancelled, by_whom, cause FROM cancel_log WHERE item_id = $1 AND event = 'stopped'`, id).
				Scan(&cancelled, &by, &cause); err != nil {
				t.Fatal(err)
			}
			if !cancelled || by != "tester@here" || !strings.Contains(cause, "not needed") {
				t.Fatalf("the handler's cause: cancelled %v, by %q, %q", cancelled, by, cause)
			}
			outcome, err := q.WaitEnded(ctx, id, 20*time.Millisecond)
			if err != nil || outcome != "cancelled" {
				t.Fatalf("the item ended %q, %v; want cancelled", outcome, err)
			}
			if n := countRows(t, pool, `SELECT count(*) FROM cancel_results`); n != 0 {
				t.Fatalf("%d results committed for a cancelled item", n)
			}
			page, err := q.CancelledItems(ctx, claim.CancelledQuery{})
			list := page.Items
			if err != nil || len(list) != 1 || list[0].ID != id || list[0].By != "tester@here" || list[0].Reason != "not needed" || !list[0].WasRunning {
				t.Fatalf("cancelled list: %+v %v", list, err)
			}
			// The other item was not touched: it still runs.
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL`, enq.IDs[1]); n != 1 {
				t.Fatal("the other item is no longer held")
			}
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Fatalf("worker process: %v\n%s", err, out)
			}
		})
	}
}

// A worker process frozen (SIGSTOP) while its item's cancel is asked for,
// then killed (SIGKILL), never saw the request: the item still ends as
// cancelled — by another worker's reaper once the dead session expires —
// and is never run again.
func TestCancelOfKilledWorkersItem(t *testing.T) {
	t.Parallel()
	url, pool := wakeSetup(t)
	cancelTables(t, pool)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("long")})
	if err != nil {
		t.Fatal(err)
	}
	id := enq.IDs[0]
	cmd, _, _ := startCancelWorker(t, url, "heartbeat")
	await.Until(t, "the handler to start in the worker process", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM cancel_log WHERE event = 'started'`) == 1
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	res, err := q.CancelItem(ctx, id, claim.CancelOptions{By: "ops", Reason: "worker stuck"})
	if err != nil || !res.Running {
		t.Fatalf("cancel: %+v %v", res, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// Another worker, in this process: its reaper ends the item once the
	// killed session expired (1.5 s); its handler must never see it.
	ran := make(chan uuid.UUID, 10)
	w, err := worker.New(q, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		ran <- it.ID
		return nil, nil
	}, worker.Options{NoWake: true, Poll: 50 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 200 * time.Millisecond, Expiry: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	outcome, err := q.WaitEnded(ctxWithin(t, 45*time.Second), id, 20*time.Millisecond)
	stop()
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil || outcome != "cancelled" {
		t.Fatalf("the killed worker's item ended %q, %v; want cancelled", outcome, err)
	}
	select {
	case got := <-ran:
		t.Fatalf("item %s ran again after its cancel", got)
	default:
	}
	if n := countRows(t, pool, `SELECT count(*) FROM cancel_log WHERE event = 'started'`); n != 1 {
		t.Fatalf("the item started %d times", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM cancel_results`); n != 0 {
		t.Fatalf("%d results", n)
	}
	if st := w.Stats(); st.CancelledRunning != 1 {
		t.Fatalf("the reaping worker's CancelledRunning is %d, want 1", st.CancelledRunning)
	}
}

// ctxWithin returns a context that ends after d (and with the test).
func ctxWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A handler that snoozes its item hands it back without spending
// attempts: an item with one attempt is snoozed three times and then
// acked on its fourth run, each run seeing attempt 1; a handler that
// snoozes for ever ends its item dead ("snoozed too often") after the
// queue's MaxSnoozes.
func TestWorkerSnooze(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{MaxSnoozes: 5})
	if err != nil {
		t.Fatal(err)
	}
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("thrice"), MaxAttempts: 1}, claim.NewItem{Payload: []byte("forever"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string][]int{}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		p := string(it.Payload)
		runs[p] = append(runs[p], it.Attempt) // one handler at a time (Concurrency 1)
		if p == "forever" || len(runs[p]) <= 3 {
			return nil, worker.Snooze(10 * time.Millisecond)
		}
		return nil, nil
	}
	w, err := worker.New(q, h, worker.Options{Concurrency: 1, NoWake: true, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 200 * time.Millisecond, Expiry: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	err = q.WaitDrained(ctxWithin(t, time.Minute), 20*time.Millisecond)
	stop()
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := runs["thrice"]; len(got) != 4 || got[0] != 1 || got[3] != 1 {
		t.Fatalf("runs of the item snoozed three times: attempts %v, want four runs of attempt 1", got)
	}
	if got := runs["forever"]; len(got) != 6 {
		t.Fatalf("the item snoozed for ever ran %d times, want 6 (5 snoozes, then dead)", len(got))
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != enq.IDs[1] || dead[0].Reason != claim.ReasonSnoozedTooOften {
		t.Fatalf("dead items: %+v %v", dead, err)
	}
	if st := w.Stats(); st.Snoozed != 8 || st.Acked != 1 || st.Dead != 1 {
		t.Fatalf("stats: snoozed %d, acked %d, dead %d; want 8, 1, 1", st.Snoozed, st.Acked, st.Dead)
	}
}

// A handler that snoozes with worker.SnoozeUnlimited is not bounded by the
// queue's MaxSnoozes: on a queue of MaxSnoozes 2, its item is snoozed six
// times and then acked, never moved to the dead items.
func TestWorkerSnoozeUnlimited(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{MaxSnoozes: 2})
	if err != nil {
		t.Fatal(err)
	}
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("poll"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	var runs []int
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		runs = append(runs, it.Attempt) // one handler at a time (Concurrency 1)
		if len(runs) <= 6 {
			return nil, worker.SnoozeUnlimited(0)
		}
		return nil, nil
	}
	w, err := worker.New(q, h, worker.Options{Concurrency: 1, NoWake: true, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 200 * time.Millisecond, Expiry: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	err = q.WaitDrained(ctxWithin(t, await.Stretch(time.Minute)), 20*time.Millisecond)
	stop()
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 7 || runs[6] != 1 {
		t.Fatalf("runs: attempts %v, want seven runs of attempt 1", runs)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 0 {
		t.Fatalf("dead items: %+v %v", dead, err)
	}
	if acked, err := q.WaitEnded(ctxWithin(t, await.Stretch(time.Minute)), enq.IDs[0], 20*time.Millisecond); err != nil || acked != "acked" {
		t.Fatalf("ended: %v %v, want acked", acked, err)
	}
	if st := w.Stats(); st.Snoozed != 6 || st.Acked != 1 || st.Dead != 0 {
		t.Fatalf("stats: snoozed %d, acked %d, dead %d; want 6, 1, 0", st.Snoozed, st.Acked, st.Dead)
	}
}
