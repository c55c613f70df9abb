package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// Give items ids of your own, derived from the application's data, to make
// an enqueue safe to repeat: after an unknown outcome (the connection died
// while the enqueue was committing) or a crash of the producer, enqueue the
// same items again; those already in the queue are not added twice.
func ExampleQueue_Enqueue() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}

	// One welcome email per address, whoever asks and however often.
	welcome := func(addresses ...string) []claim.NewItem {
		items := make([]claim.NewItem, len(addresses))
		for i, a := range addresses {
			items[i] = claim.NewItem{
				ID:      uuid.NewSHA1(uuid.NameSpaceURL, []byte("mailto:"+a+"#welcome")),
				Payload: []byte(a),
			}
		}
		return items
	}
	enqueue := func(items []claim.NewItem) claim.Enqueued {
		for {
			res, err := q.Enqueue(ctx, items...)
			if errors.Is(err, claim.ErrOutcomeUnknown) {
				continue // the same ids again: no duplicates whatever happened
			}
			if err != nil {
				log.Fatal(err)
			}
			return res
		}
	}

	res := enqueue(welcome("ada@example.com", "bob@example.com"))
	fmt.Println("added:", res.Added(), res.New)
	res = enqueue(welcome("bob@example.com", "eve@example.com"))
	fmt.Println("added:", res.Added(), res.New)
	fmt.Println("items:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Output:
	// added: 2 [true true]
	// added: 1 [false true]
	// items: 3
}
