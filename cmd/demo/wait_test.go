package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// fakeGroup is a workerGroup whose counters the test sets.
type fakeGroup struct{ done atomic.Int64 }

func (g *fakeGroup) failed() <-chan error { return nil }
func (g *fakeGroup) stop(time.Duration)   {}
func (g *fakeGroup) killed() int          { return 0 }
func (g *fakeGroup) counters(*summary)    {}
func (g *fakeGroup) settled() int64       { return g.done.Load() }

// TestWaitEndsOnTheCountNotTheCounters: a run ends when the database has no
// item of its queue left, whatever the workers' counters say: counters
// saying every item is done while one is left do not end it (it times out,
// with the item counted), and an empty queue ends it even when the counters
// say nothing (the count every countEvery).
func TestWaitEndsOnTheCountNotTheCounters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t) // tables are the default ones
	q, err := claim.New(pool, claim.Options{Queue: "w", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("left")}); err != nil {
		t.Fatal(err)
	}
	run := func(timeout time.Duration, settled int64) (waitOutcome, string) {
		t.Helper()
		var stderr strings.Builder
		c := &runConfig{items: 10, timeout: timeout}
		c.queue = "w"
		r := &demoRun{c: c, out: cli.NewConsole(&strings.Builder{}, &stderr)}
		g := &fakeGroup{}
		g.done.Store(settled)
		o, err := r.wait(ctx, pool, g, time.Now())
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		return o, stderr.String()
	}
	// The counters say all 10 are done; the database has one left.
	o, msg := run(2*time.Second, 10)
	if !o.timedOut || o.finished != 0 || !strings.Contains(msg, "with 1 items left") {
		t.Errorf("counters done, one item left: outcome %+v, stderr %q; want a timeout with 1 item left", o, msg)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = 'w'`); err != nil {
		t.Fatal(err)
	}
	// The counters say nothing; the queue is empty.
	if o, msg := run(time.Minute, 0); o.timedOut || o.finished <= 0 {
		t.Errorf("empty queue, counters at 0: outcome %+v, stderr %q; want the run finished", o, msg)
	}
	// The counters say all are done and the queue is empty.
	if o, msg := run(time.Minute, 10); o.timedOut || o.finished <= 0 {
		t.Errorf("empty queue, counters done: outcome %+v, stderr %q; want the run finished", o, msg)
	}
}
