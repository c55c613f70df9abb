package claim_test

import (
	"context"
	"fmt"
	"log"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// An import loads a backlog into a new database before any worker runs: it
// has the tables analyzed at once rather than leaving the workers' first
// claims to plans made without statistics (workers do the same when their
// sessions start; on CockroachDB there is nothing to do).
func ExampleQueue_RefreshStatistics() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "imports"})
	if err != nil {
		log.Fatal(err)
	}
	items := make([]claim.NewItem, 20000)
	for i := range items {
		items[i].Payload = fmt.Appendf(nil, "row %d", i)
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		log.Fatal(err)
	}
	analyzed, err := queuemaint.For(q).RefreshStatistics(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, table := range analyzed {
		log.Printf("analyzed %s", table)
	}
	fmt.Println("items:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Output: items: 20000
}
