package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// One pending at a time, run again when done (River's unique states,
// pg-boss's singleton): with UniqueStates set to UniqueLive, an enqueue of
// the key is a duplicate while an item of it is queued, waiting or running,
// and adds a new run once it ended. The default (every state) would also
// keep it out for the queue's dedup window after its ack.
func ExampleNewItem_uniqueStates() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "search-index"})
	if err != nil {
		log.Fatal(err)
	}
	// README:begin uniquestates
	refresh := claim.NewItem{UniqueKey: "refresh:catalog", UniqueStates: claim.UniqueLive, Payload: []byte("refresh")}
	// README:end uniquestates
	for i := 0; i < 2; i++ {
		res, err := q.Enqueue(ctx, refresh)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("while pending, added:", res.New[0])
	}

	s, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.AckBatch(ctx, items, nil); err != nil {
		log.Fatal(err)
	}

	res, err := q.Enqueue(ctx, refresh)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("once done, added:", res.New[0], "done:", res.Done[0])
	// Output:
	// while pending, added: true
	// while pending, added: false
	// once done, added: true done: false
}

// A clean-up that runs whatever happened to the work it follows (Oban's
// ignore_cancelled and ignore_discarded): with RunAfter, a prerequisite
// that died or was cancelled satisfies the dependent as an ack would.
// Without it, the dependent ends dead (here, at the enqueue, the
// prerequisite being cancelled already: ErrPrerequisiteDied).
func ExampleNewItem_runAfter() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "exports"})
	if err != nil {
		log.Fatal(err)
	}
	export := uuid.New()
	// README:begin runafter
	cleanup := claim.NewItem{Payload: []byte("delete temp files"), After: []uuid.UUID{export},
		RunAfter: claim.PrereqDied | claim.PrereqCancelled}
	// README:end runafter
	res, err := q.Enqueue(ctx, claim.NewItem{ID: export, Payload: []byte("export")}, cleanup)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the clean-up waits:", res.Waiting[1])

	if _, err := q.CancelItem(ctx, export, claim.CancelOptions{By: "ops", Reason: "customer left"}); err != nil {
		log.Fatal(err)
	}
	// The reaper (every worker runs it) releases the waiting clean-up; an
	// enqueue after the cancel finds the prerequisite ended.
	res, err = q.Enqueue(ctx, cleanup)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued after the cancel, waits:", res.Waiting[0])
	_, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("notify"), After: []uuid.UUID{export}})
	fmt.Println("without RunAfter:", errors.Is(err, claim.ErrPrerequisiteDied))
	// Output:
	// the clean-up waits: true
	// enqueued after the cancel, waits: false
	// without RunAfter: true
}

// A cancelled item is kept for the queue's dedup window: an operator who
// cancelled it by mistake puts it back, whole, with RequeueOptions.Cancelled
// (River's JobRetry, pg-boss's resume; crdbwork requeue --cancelled).
func ExampleRequeueOptions_cancelled() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "invoices"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("invoice 1042"), Key: "customer-7"})
	if err != nil {
		log.Fatal(err)
	}
	id := res.IDs[0]
	if _, err := q.CancelItem(ctx, id, claim.CancelOptions{By: "ops", Reason: "wrong customer?"}); err != nil {
		log.Fatal(err)
	}
	r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: id})
	if err != nil {
		log.Fatal(err)
	}
	it, err := q.Item(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", r.Requeued, "back:", it.State == claim.StateQueued, string(it.Payload), it.Key)
	_, err = q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: id})
	fmt.Println("again:", errors.Is(err, claim.ErrItemLive))
	// Output:
	// requeued: 1 back: true invoice 1042 customer-7
	// again: true
}

// An item of one queue that waits for items of another (NewItem.AfterIn):
// a report of queue "reports" runs once the exports it needs, items of
// queue "exports" worked by other workers, are acked; the ack in "exports"
// releases it.
func ExampleNewItem_afterIn() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	exports, err := claim.New(pool, claim.Options{Queue: "exports"})
	if err != nil {
		log.Fatal(err)
	}
	reports, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := exports.Enqueue(ctx, claim.NewItem{Payload: []byte("export orders")}, claim.NewItem{Payload: []byte("export refunds")})
	if err != nil {
		log.Fatal(err)
	}
	// README:begin afterin
	report := claim.NewItem{Payload: []byte("monthly report"), AfterIn: []claim.Prereq{
		{Queue: "exports", ID: res.IDs[0]},
		{Queue: "exports", ID: res.IDs[1]},
	}}
	// README:end afterin
	r, err := reports.Enqueue(ctx, report)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the report waits:", r.Waiting[0])
	d, err := reports.Dependencies(ctx, r.IDs[0], 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("for", len(d.Prereqs), "items of queue", d.Prereqs[0].Queue)
	// Output:
	// the report waits: true
	// for 2 items of queue exports
}
