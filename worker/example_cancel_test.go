package worker_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// A long-running handler stops when its item is cancelled from outside
// (here by this process; crdbwork cancel does the same from any other):
// its context's cause says who cancelled it and why, and its result is not
// written. The item ends as cancelled.
func ExampleCancelled() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	started, stopped := make(chan struct{}), make(chan string, 1)

	// README:begin cancel
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		close(started)
		for step := 0; ; step++ { // a long computation, in steps
			if ce, ok := worker.Cancelled(ctx); ok {
				stopped <- fmt.Sprintf("stopped: cancelled by %s (%s)", ce.By, ce.Reason)
				return nil, context.Cause(ctx) // nothing is written, whatever is returned
			}
			if ctx.Err() != nil {
				return nil, ctx.Err() // timed out, or shutting down: retried later
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// README:end cancel

	w, err := worker.New(q, handle, worker.Options{Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("yearly report")})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	<-started

	// README:begin cancel-call
	res, err := q.CancelItem(ctx, enq.IDs[0], claim.CancelOptions{By: "ada@ops", Reason: "wrong year"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("was running:", res.Running)
	outcome, err := q.WaitEnded(ctx, enq.IDs[0], 20*time.Millisecond) // until its handler stopped
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ended:", outcome)
	// README:end cancel-call

	fmt.Println(<-stopped)
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	fmt.Println("cancelled while running:", w.Stats().CancelledRunning)
	// Output:
	// was running: true
	// ended: cancelled
	// stopped: cancelled by ada@ops (wrong year)
	// cancelled while running: 1
}

// A handler hands its item back for a while, without spending an attempt,
// while what it needs is not ready; the queue bounds how often
// (claim.Options.MaxSnoozes, default 100).
func ExampleSnooze() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE exports (name TEXT PRIMARY KEY, ready BOOL NOT NULL); CREATE TABLE shipped (name TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO exports VALUES ('q3', false)`); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "shipping", MaxSnoozes: 50})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0

	// README:begin snooze
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		runs++
		var ready bool
		if err := pool.QueryRow(ctx, `SELECT ready FROM exports WHERE name = $1`, string(it.Payload)).Scan(&ready); err != nil {
			return nil, err
		}
		if !ready {
			return nil, worker.Snooze(50 * time.Millisecond) // look again later; no attempt spent
		}
		return worker.Exec(`INSERT INTO shipped (name) VALUES ($1)`, string(it.Payload)), nil
	}
	// README:end snooze

	w, err := worker.New(q, handle, worker.Options{Concurrency: 1, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("q3"), MaxAttempts: 1}); err != nil {
		log.Fatal(err)
	}
	go func() { // the export becomes ready once the item was snoozed twice
		for w.Stats().Snoozed < 2 {
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := pool.Exec(ctx, `UPDATE exports SET ready = true`); err != nil {
			log.Fatal(err)
		}
	}()
	runUntil(ctx, w, pool, `SELECT count(*) FROM shipped`, 1)
	st := w.Stats()
	fmt.Println("shipped after snoozes:", st.Snoozed >= 2, "acked:", st.Acked, "dead:", st.Dead)
	fmt.Println("runs beyond its one attempt:", runs > 1)
	// Output:
	// shipped after snoozes: true acked: 1 dead: 0
	// runs beyond its one attempt: true
}

// A handler that waits for an outside condition for as long as it takes
// snoozes without the queue's bound: here the queue allows 2 snoozes, and
// the item is snoozed 5 times and then acked, never dead.
func ExampleSnoozeUnlimited() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "polling", MaxSnoozes: 2})
	if err != nil {
		log.Fatal(err)
	}
	runs := 0

	// README:begin snooze-unlimited
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		runs++
		if runs <= 5 { // not there yet: look again, however long it takes
			return nil, worker.SnoozeUnlimited(10 * time.Millisecond)
		}
		return nil, nil
	}
	// README:end snooze-unlimited

	w, err := worker.New(q, handle, worker.Options{Concurrency: 1, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("poll"), MaxAttempts: 1}); err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM crdbwork_ended WHERE outcome = 'acked'`, 1)
	st := w.Stats()
	fmt.Println("snoozed:", st.Snoozed, "acked:", st.Acked, "dead:", st.Dead)
	// Output:
	// snoozed: 5 acked: 1 dead: 0
}
