package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

// greet is the handler under test: it greets the name in the payload, and
// refuses an empty name for good.
func greet(ctx context.Context, it claim.Item) (worker.Record, error) {
	name := string(it.Payload)
	if name == "" {
		return nil, claim.Permanent(errors.New("no name"))
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO greetings (item_id, greeting) VALUES ($1, $2)`, it.ID, "Hello, "+name+"!")
		return err
	}, nil
}

// Test a handler on one item at a time: Work runs it as a worker would and
// reports the outcome; the handler's result is then in the database. In a
// test, pool comes from the test's own database and failures call t.Fatal.
func ExampleWork() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// Work applies the crdbwork schema itself; the handler's table is ours.
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (item_id UUID PRIMARY KEY, greeting TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	res, err := workertest.Work(ctx, pool, greet, claim.NewItem{Payload: []byte("Ada")}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	var greeting string
	if err := pool.QueryRow(ctx, `SELECT greeting FROM greetings WHERE item_id = $1`, res.Item.ID).Scan(&greeting); err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, greeting)

	res, err = workertest.Work(ctx, pool, greet, claim.NewItem{Payload: nil}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, res.Err)
	// Output:
	// acked Hello, Ada!
	// dead no name
}
