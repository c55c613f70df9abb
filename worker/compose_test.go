package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// A worker claims in its queue, with the queue's lease when set, else its
// own default (min(ItemTimeout, 2 min) + HangGrace + 30 s), not claim's
// DefaultLease.
func TestWorkerTakesTheQueuesLease(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	for _, c := range []struct {
		lease time.Duration // the queue's
		opts  worker.Options
		want  time.Duration
	}{
		{0, worker.Options{}, 2*time.Minute + worker.DefaultHangGrace + 30*time.Second},
		{0, worker.Options{ItemTimeout: 10 * time.Second, HangGrace: time.Second}, 41 * time.Second},
		{7 * time.Minute, worker.Options{}, 7 * time.Minute},
	} {
		queue := "lease-" + c.want.String()
		enqueue(t, pool, queue, 1, false)
		got := make(chan claim.Item, 1)
		h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
			select {
			case got <- it:
			default:
			}
			return recordHandler(0)(ctx, it)
		}
		r := startOn(t, newQueue(t, pool, claim.Options{Queue: queue, Lease: c.lease}), h, c.opts)
		it := await.Recv(t, fmt.Sprintf("queue lease %v: an item to be handled", c.lease), got)
		r.Stop(t)
		if it.Queue != queue {
			t.Errorf("handled an item of %q, want %q", it.Queue, queue)
		}
		// LeaseUntil is by the database clock, taken at the claim: allow for
		// the time since and a clock offset.
		if d := time.Until(it.LeaseUntil); d > c.want+5*time.Second || d < c.want-20*time.Second {
			t.Errorf("queue lease %v, ItemTimeout %v: the claim's lease ends in %v, want about %v", c.lease, c.opts.ItemTimeout, d, c.want)
		}
	}
}

// The worker's sessions carry Options.Name, on the queue's tables.
func TestWorkerSessionName(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	r := start(t, pool, recordHandler(0), worker.Options{Name: "named-worker"})
	waitFor(t, "the worker's session", time.Minute, func() bool {
		infos, err := session.List(context.Background(), pool, crsql.Tables{})
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range infos {
			if in.Name == "named-worker" && in.ID.String() == r.w.Stats().Session {
				return true
			}
		}
		return false
	})
}
