package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Items with their own timeout (claim.NewItem.Timeout) on a worker whose
// ItemTimeout is an hour: a handler that waits for its context ends with
// its item's deadline, and one that hangs for real (it ignores its
// context) is abandoned HangGrace after it; each timed-out attempt is a
// failed attempt, retried, and the last ends the item dead with the
// timeout as its error. An item without a timeout beside them is acked.
func TestItemTimeoutEndsHungHandlers(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "timeouts", BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 100 * time.Millisecond
	enq, err := q.Enqueue(ctx,
		claim.NewItem{Payload: []byte("waits"), Timeout: timeout, MaxAttempts: 2},
		claim.NewItem{Payload: []byte("hangs"), Timeout: timeout, MaxAttempts: 2},
		claim.NewItem{Payload: []byte("quick"), MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	hung := make(chan struct{}) // the hanging handlers' goroutines end with the test
	defer close(hung)
	var mu sync.Mutex
	deadlines := map[string][]time.Duration{} // per payload: each run's deadline from its start
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		start := time.Now()
		d, ok := ctx.Deadline()
		mu.Lock()
		if ok {
			deadlines[string(it.Payload)] = append(deadlines[string(it.Payload)], d.Sub(start))
		}
		mu.Unlock()
		switch string(it.Payload) {
		case "waits":
			<-ctx.Done()
			return nil, ctx.Err()
		case "hangs":
			<-hung // ignores its context
			return nil, nil
		}
		return nil, nil
	}
	hb := await.Stretch(100 * time.Millisecond)
	w, err := worker.New(q, h, worker.Options{Concurrency: 4, NoWake: true, Poll: 20 * time.Millisecond,
		ItemTimeout: time.Hour, HangGrace: 200 * time.Millisecond,
		Session: session.Tuning{Heartbeat: hb, Expiry: 50 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Until(t, "both items with a timeout dead, the other acked", func() (bool, string) {
		var dead, left int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_dead_items), (SELECT count(*) FROM crdbwork_items)`).Scan(&dead, &left); err != nil {
			return false, err.Error()
		}
		return dead == 2 && left == 0, fmt.Sprintf("%d dead, %d left", dead, left)
	})
	stop()
	await.Recv(t, "Run to return", done)

	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 2 {
		t.Fatalf("dead items: %+v %v", dead, err)
	}
	byID := map[uuid.UUID]claim.DeadItem{}
	for _, d := range dead {
		byID[d.ID] = d
	}
	waits, hangs := byID[enq.IDs[0]], byID[enq.IDs[1]]
	if waits.Attempts != 2 || waits.Reason != claim.ReasonFailed || !strings.Contains(waits.LastError, "item timed out after 100ms (its own Timeout)") {
		t.Errorf("the item whose handler waits for its context: attempts %d, reason %q, error %q", waits.Attempts, waits.Reason, waits.LastError)
	}
	if hangs.Attempts != 2 || hangs.Reason != claim.ReasonFailed || !strings.Contains(hangs.LastError, "abandoned") ||
		!strings.Contains(hangs.LastError, "deadline exceeded") {
		t.Errorf("the item whose handler hangs: attempts %d, reason %q, error %q", hangs.Attempts, hangs.Reason, hangs.LastError)
	}
	if outcome, err := q.WaitEnded(ctx, enq.IDs[2], 20*time.Millisecond); err != nil || outcome != "acked" {
		t.Errorf("the item without a timeout: %q %v, want acked", outcome, err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []string{"waits", "hangs"} {
		if len(deadlines[p]) != 2 {
			t.Errorf("%s: %d runs, want 2", p, len(deadlines[p]))
		}
		for _, d := range deadlines[p] {
			if d > timeout {
				t.Errorf("%s: the handler's deadline was %v after its start, want at most its timeout %v", p, d, timeout)
			}
		}
	}
	if d := deadlines["quick"]; len(d) != 1 || d[0] < 59*time.Minute {
		t.Errorf("quick: deadlines %v after the start, want one of about the worker's ItemTimeout (1h)", d)
	}
	if st := w.Stats(); st.Timeouts < 2 || st.Abandoned < 2 || st.Dead != 2 || st.Acked != 1 {
		t.Errorf("stats: timeouts %d, abandoned %d, dead %d, acked %d; want ≥2, ≥2, 2, 1", st.Timeouts, st.Abandoned, st.Dead, st.Acked)
	}
}

// An item whose own timeout is longer than the worker's ItemTimeout and
// than its queue's lease keeps running: the worker extends its lease past
// the lease's end, several times (the item is never released nor claimed
// again), and its handler's context stays live until it returns; the item
// is acked on its first attempt.
func TestItemTimeoutLongerThanTheLease(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	hb := await.Stretch(50 * time.Millisecond)
	lease := 4 * hb
	q, err := claim.New(pool, claim.Options{Queue: "long", Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("long"), Timeout: time.Hour, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := enq.IDs[0]
	started, finish := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	var ctxErr atomic.Value
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if runs.Add(1) == 1 {
			close(started)
		}
		select {
		case <-finish:
			return nil, nil
		case <-ctx.Done():
			ctxErr.Store(context.Cause(ctx).Error())
			return nil, ctx.Err()
		}
	}
	w, err := worker.New(q, h, worker.Options{Concurrency: 1, NoWake: true, Poll: 20 * time.Millisecond,
		ItemTimeout: 50 * time.Millisecond, Session: session.Tuning{Heartbeat: hb, Expiry: 50 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Recv(t, "the handler to start", started)
	// Three leases past the claim, the item is still held by its first claim.
	await.Until(t, "the item's lease extended three leases past its claim", func() (bool, string) {
		var extended bool
		var attempts int
		err := pool.QueryRow(ctx, `SELECT lease_until > claimed_at + $2::BIGINT * INTERVAL '1 microsecond', attempts
FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL`, id, (3*lease).Microseconds()).Scan(&extended, &attempts)
		if err != nil {
			return false, err.Error()
		}
		if e := ctxErr.Load(); e != nil {
			return true, "" // reported below
		}
		return extended && attempts == 1, fmt.Sprintf("extended %v, attempts %d", extended, attempts)
	})
	if e := ctxErr.Load(); e != nil {
		t.Fatalf("the handler's context ended before its own timeout: %v", e)
	}
	close(finish)
	if outcome, err := q.WaitEnded(ctxWithin(t, await.Stretch(time.Minute)), id, 20*time.Millisecond); err != nil || outcome != "acked" {
		t.Fatalf("the item: %q %v, want acked", outcome, err)
	}
	stop()
	await.Recv(t, "Run to return", done)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once", n)
	}
	if st := w.Stats(); st.Timeouts != 0 || st.Acked != 1 {
		t.Fatalf("stats: timeouts %d, acked %d; want 0, 1", st.Timeouts, st.Acked)
	}
}
