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

// Test a handler on one item at a time: Work runs it as a worker on the
// queue would (or on a fresh queue when given none) and reports the
// outcome; the handler's result is then in the database. In a
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

	// No queue: Work makes a fresh one on Options.DB.
	res, err := workertest.Work(ctx, nil, greet, claim.NewItem{Payload: []byte("Ada")}, workertest.Options{DB: pool})
	if err != nil {
		log.Fatal(err)
	}
	var greeting string
	if err := pool.QueryRow(ctx, `SELECT greeting FROM greetings WHERE item_id = $1`, res.Item.ID).Scan(&greeting); err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, greeting)

	// On the handler's own queue: its name, tables and retry policy.
	q, err := claim.New(pool, claim.Options{Queue: "greetings", MaxAttempts: 3})
	if err != nil {
		log.Fatal(err)
	}
	res, err = workertest.Work(ctx, q, greet, claim.NewItem{Payload: nil}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome, res.Err)
	// Output:
	// acked Hello, Ada!
	// dead no name
}
