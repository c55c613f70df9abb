package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/worker"
)

// A handler's context, whose deadline its items share with the others
// claimed with it, still ends with context.DeadlineExceeded at a deadline
// no sooner than ItemTimeout from its start and at most 5 ms later; the
// contexts derived from it end the same way; and the item is counted as
// timed out and runs again.
func TestHandlerContextEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	const n, timeout = 8, 300 * time.Millisecond
	slack := min(timeout, await.Stretch(50*time.Millisecond))
	enqueue(t, pool, "default", n, false)
	var mu sync.Mutex
	var problems []string
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if it.Attempt > 1 {
			return recordHandler(0)(ctx, it)
		}
		start := time.Now()
		d, ok := ctx.Deadline()
		child, cancel := context.WithCancel(ctx)
		defer cancel()
		<-child.Done()
		var p string
		switch {
		case !ok:
			p = "no deadline"
		case d.Sub(start) > timeout+5*time.Millisecond:
			p = fmt.Sprintf("deadline %v after the handler's start, more than ItemTimeout + 5 ms", d.Sub(start))
		case time.Now().Before(d):
			p = fmt.Sprintf("context ended %v before its deadline", time.Until(d))
		case time.Since(start) < timeout-slack: // its deadline counts from just before its goroutine started, which a busy machine may start late
			p = fmt.Sprintf("context ended %v after the start, before ItemTimeout (less %v for a late start)", time.Since(start), slack)
		case !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded):
			p = fmt.Sprintf("errors %v, %v (derived); want context.DeadlineExceeded", ctx.Err(), child.Err())
		case !errors.Is(context.Cause(child), context.DeadlineExceeded):
			p = fmt.Sprintf("derived context's cause %v; want context.DeadlineExceeded", context.Cause(child))
		}
		if p != "" {
			mu.Lock()
			problems = append(problems, p)
			mu.Unlock()
		}
		return nil, child.Err()
	}
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), h,
		worker.Options{Concurrency: n, ItemTimeout: timeout, HangGrace: time.Second})
	waitFor(t, "every item acked", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	r.Stop(t)
	assertExactlyOnce(t, pool, n)
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Error(p)
	}
	if st := r.w.Stats(); st.Timeouts != n || st.Abandoned != 0 {
		t.Errorf("stats %+v: want %d timeouts, none abandoned", st, n)
	}
}
