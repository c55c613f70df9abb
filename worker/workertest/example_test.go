package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

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

// Work reports every outcome a worker can give an attempt, and where the
// item is afterwards (Result.State): here a handler that snoozes, one whose
// item is cancelled while it runs (its context is cancelled with the
// cancel's cause, as in a worker), and an at-most-once item whose handler
// fails (dropped: its claim took it).
func ExampleWork_outcomes() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}

	// Not ready yet: come back in an hour, without spending an attempt.
	notYet := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, worker.Snooze(time.Hour)
	}
	res, err := workertest.Work(ctx, q, notYet, claim.NewItem{Payload: []byte("report 1")}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v: queued %v, attempts %d, snoozes %d\n", res.Outcome, res.State.Queued, res.State.Attempts, res.State.Snoozes)

	// Cancelled while it runs (here by the handler itself; in a test, by
	// anything that calls CancelItem): the handler sees why and stops.
	// The snoozed item is cancelled first, so that the queue holds none.
	if _, err := q.CancelItem(ctx, res.Item.ID, claim.CancelOptions{}); err != nil {
		log.Fatal(err)
	}
	long := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if _, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "ada", Reason: "duplicate"}); err != nil {
			return nil, err
		}
		<-ctx.Done()
		if c, ok := worker.Cancelled(ctx); ok {
			fmt.Println("handler stopped:", c)
		}
		return nil, ctx.Err()
	}
	res, err = workertest.Work(ctx, q, long, claim.NewItem{Payload: []byte("report 2")}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v: ended %q\n", res.Outcome, res.State.Ended)

	// At most once: a failure drops the item; nothing retries it.
	failing := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, errors.New("printer on fire")
	}
	res, err = workertest.Work(ctx, q, failing, claim.NewItem{Payload: []byte("report 3"), AtMostOnce: true}, workertest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%v: %v; queued %v, ended %q\n", res.Outcome, res.Err, res.State.Queued, res.State.Ended)
	// Output:
	// snoozed: queued true, attempts 0, snoozes 1
	// handler stopped: the item was cancelled by ada: duplicate
	// cancelled: ended "cancelled"
	// dropped: printer on fire; queued false, ended "taken"
}
