package claim_test

import (
	"context"
	"fmt"
	"log"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// A fan-out / fan-in: one item fetches a file, three resize it in
// parallel once it is done, and one publishes once all three are done.
// Prerequisites come first, in the same call or enqueued before; an item
// with prerequisites not yet acked waits (Enqueued.Waiting) outside the
// queue until the ack of the last one releases it.
func ExampleNewItem_after() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "images"})
	if err != nil {
		log.Fatal(err)
	}

	// README:begin depends
	fetch := uuid.New()
	items := []claim.NewItem{{ID: fetch, Payload: []byte("fetch photo.jpg")}}
	var sizes []uuid.UUID
	for _, size := range []string{"small", "medium", "large"} {
		id := uuid.New()
		sizes = append(sizes, id)
		items = append(items, claim.NewItem{ID: id, Payload: []byte("resize " + size), After: []uuid.UUID{fetch}})
	}
	items = append(items, claim.NewItem{Payload: []byte("publish"), After: sizes})
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting:", res.Waiting)
	// README:end depends

	info, err := q.Inspect(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting items:", info.Waiting)
	// Output:
	// waiting: [false true true true true]
	// waiting items: 4
}

// Dependencies shows what a waiting item still waits for, with each
// prerequisite's state, and which items wait for a given one.
func ExampleQueue_Dependencies() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	extract, report := uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx,
		claim.NewItem{ID: extract, Payload: []byte("extract")},
		claim.NewItem{ID: report, Payload: []byte("report"), After: []uuid.UUID{extract}}); err != nil {
		log.Fatal(err)
	}
	d, err := q.Dependencies(ctx, report, 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting:", d.Waiting, "remaining:", d.Remaining)
	for _, p := range d.Prereqs {
		fmt.Println("after the extract:", p.ID == extract, p.State)
	}
	d, err = q.Dependencies(ctx, extract, 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the report waits for the extract:", len(d.Dependents) == 1 && d.Dependents[0] == report)
	// Output:
	// waiting: true remaining: 1
	// after the extract: true queued
	// the report waits for the extract: true
}
