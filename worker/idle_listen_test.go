package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// TestNoClaimPollWhileListening: while the process's listener listens on
// the queue's channel, an idle worker runs no claim through heartbeat after
// heartbeat although its Poll is 20 ms (ListenPoll an hour: only a
// wake-up, an item that ends or a known vesting makes it claim); and yet
// it claims an item another process enqueues (the notification), an item
// that vests later (the idle look after its wake-up's empty claim gave its
// vesting) and the retry of an item nacked with a backoff (the look after
// the item ended) — each within the test's deadline, far below the hour.
func TestNoClaimPollWhileListening(t *testing.T) {
	t.Parallel()
	listenOnly(t)
	url, pool := wakeSetup(t)
	idle, beats := await.NewRounds("idle claims"), await.NewRounds("heartbeats")
	looks := await.NewRounds("idle looks")
	var exact atomic.Int64
	started := make(chan uuid.UUID, 16)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "fails once" && it.Attempt == 1 {
			return nil, errors.New("the first attempt fails")
		}
		started <- it.ID
		return nil, nil
	}
	backoff := await.Stretch(300 * time.Millisecond)
	q := newQueue(t, pool, claim.Options{BackoffBase: backoff, BackoffMax: backoff})
	opts := worker.Options{Concurrency: 1, Poll: 20 * time.Millisecond, ListenPoll: time.Hour, Session: fastSession(),
		Testing: worker.TestingOptions{
			AfterIdleClaim: func(error) { idle.Tick() },
			AfterIdleLook: func(ok bool, err error) {
				if ok && err == nil {
					exact.Add(1)
				}
				looks.Tick()
			},
			Session: session.TestingOptions{AfterHeartbeat: func(bool, error) { beats.Tick() }},
		}}
	r := startOn(t, q, h, opts)
	awaitListening(t, r)
	idle.WaitFor(t, 1) // idle: a claim found nothing (and the look after it nothing either)
	// A few heartbeats for the start to settle: under a heavy load an idle
	// claim came right after the first wake-up (the listener's first
	// signals, the session's first change marker).
	beats.Wait(t, 3)

	// Quiet: no claim poll through heartbeats although Poll is 20 ms. A
	// poll claims at least once every 30 ms (Poll is drawn between half
	// and one and a half of it): 31 claims in 5 heartbeats were seen with
	// ListenPoll -1. A claim woken by something the session saw (its first
	// change marker; under load, about one per heartbeat was seen) is not a
	// poll: fewer than half the claims a poll would make are let pass.
	n, from := idle.Count(), time.Now()
	beats.Wait(t, 6)
	polls := int64(time.Since(from) / (30 * time.Millisecond))
	if got := idle.Count() - n; got > polls/2 {
		t.Fatalf("%d idle claims in 5 heartbeats (%v; a poll would claim at least %d times) while the listener listens (%d idle claims before): the worker polls",
			got, time.Since(from).Round(time.Millisecond), polls, n)
	}

	// Another process enqueues: the notification wakes the worker.
	produce(t, url, "enqueue::default")
	awaitItem(t, started, "an item enqueued by another process")

	// An item that vests later: its enqueue wakes the worker, which claims
	// nothing, looks, and claims when it vests.
	later, err := q.Enqueue(context.Background(), claim.NewItem{Payload: []byte("later"), Delay: await.Stretch(500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if got := awaitItem(t, started, "an item due in half a second"); got != later.IDs[0] {
		t.Fatalf("started %v, want the delayed item %v", got, later.IDs[0])
	}

	// An item nacked with a backoff: it ends, the look finds when its
	// retry vests.
	retried, err := q.Enqueue(context.Background(), claim.NewItem{Payload: []byte("fails once")})
	if err != nil {
		t.Fatal(err)
	}
	if got := awaitItem(t, started, "the retry of a nacked item"); got != retried.IDs[0] {
		t.Fatalf("started %v, want the retried item %v", got, retried.IDs[0])
	}
	if exact.Load() == 0 {
		t.Error("no idle look found when the next item vests")
	}
}
