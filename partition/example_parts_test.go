package partition_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Divide a queue into four parts. An enqueued item's part comes from its
// key, so items with the same key share a part.
func ExampleSetParts() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}

	n, err := partition.Parts(ctx, pool, crsql.Tables{}, "orders")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("parts before:", n)
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "orders", 4); err != nil {
		log.Fatal(err)
	}
	if n, err = partition.Parts(ctx, pool, crsql.Tables{}, "orders"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("parts after:", n)

	q, err := claim.New(pool, claim.Options{Queue: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := q.Enqueue(ctx,
		claim.NewItem{Key: "customer-42", Payload: []byte("order 1")},
		claim.NewItem{Key: "customer-42", Payload: []byte("order 2")},
	)
	if err != nil {
		log.Fatal(err)
	}
	var parts int
	err = pool.QueryRow(ctx, `SELECT count(DISTINCT part) FROM crdbwork_items WHERE id = ANY($1)`, res.IDs).Scan(&parts)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("parts holding customer-42's orders:", parts)
	// Output:
	// parts before: 1
	// parts after: 4
	// parts holding customer-42's orders: 1
}
