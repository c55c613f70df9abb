package worker_test

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Write each item's result with worker.Exec: the worker queues the
// statement and sends the statements of all the items of an ack
// transaction with its COMMIT, in one round trip. A handler that needs to
// read in the ack's transaction returns a function instead: it runs at
// once, and sees the writes of the Exec records acked before it.
func ExampleExec() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE squares (n INT PRIMARY KEY, square INT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		n, err := strconv.Atoi(string(it.Payload))
		if err != nil {
			return nil, claim.Permanent(err)
		}
		if n == 0 { // a read and some logic: a function
			return func(ctx context.Context, tx pgx.Tx) error {
				var before int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM squares`).Scan(&before); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO squares (n, square) VALUES (0, 0)`)
				return err
			}, nil
		}
		return worker.Exec(`INSERT INTO squares (n, square) VALUES ($1, $2)`, n, n*n), nil
	}
	q, err := claim.New(pool, claim.Options{Queue: "squares"})
	if err != nil {
		log.Fatal(err)
	}
	w, err := worker.New(q, handle, worker.Options{
		Poll:    20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	for n := range 5 {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(strconv.Itoa(n))}); err != nil {
			log.Fatal(err)
		}
	}
	runUntil(ctx, w, pool, `SELECT count(*) FROM squares`, 5)
	var sum int
	if err := pool.QueryRow(ctx, `SELECT sum(square) FROM squares`).Scan(&sum); err != nil {
		log.Fatal(err)
	}
	fmt.Println("sum of squares:", sum)
	// Output:
	// sum of squares: 30
}
