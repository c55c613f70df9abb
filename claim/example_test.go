package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// examplePool opens a pool on a fresh database with the crdbwork schema and
// an application table, emails. Call the returned function when done.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	url, drop := testdb.ExampleURL()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE emails (address TEXT PRIMARY KEY, sent BOOL NOT NULL DEFAULT false)`); err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); drop() }
}

// exampleCount runs a count query.
func exampleCount(ctx context.Context, pool *pgxpool.Pool, query string) int {
	var n int
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}

// addEmails inserts unsent emails and enqueues one item for each.
func addEmails(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue, addresses ...string) {
	for _, a := range addresses {
		if _, err := pool.Exec(ctx, `INSERT INTO emails (address) VALUES ($1)`, a); err != nil {
			log.Fatal(err)
		}
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(a)}); err != nil {
			log.Fatal(err)
		}
	}
}

// claimEmails starts a session, adds emails with addEmails on queue "emails"
// and claims their items. Call closeSession when done.
func claimEmails(ctx context.Context, pool *pgxpool.Pool, addresses ...string) (q *claim.Queue, items []claim.Item, closeSession func()) {
	return claimEmailsWith(ctx, pool, claim.Options{Queue: "emails"}, addresses...)
}

// claimEmailsWith is claimEmails with the queue's options.
func claimEmailsWith(ctx context.Context, pool *pgxpool.Pool, opts claim.Options, addresses ...string) (q *claim.Queue, items []claim.Item, closeSession func()) {
	sess, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	if q, err = claim.New(pool, opts); err != nil {
		log.Fatal(err)
	}
	addEmails(ctx, pool, q, addresses...)
	if items, err = q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: len(addresses)}); err != nil {
		log.Fatal(err)
	}
	return q, items, func() { sess.Close(ctx) }
}

// Enqueue an item in the same transaction as the application's own write:
// the item exists if and only if that transaction commits. On CockroachDB
// any transaction may have to run again (SQLSTATE 40001, at any statement
// or at COMMIT): cockroach-go's crdb.ExecuteCtx runs it again, whole, while
// it fails so.
func ExampleQueue_EnqueueTx() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()

	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	signUp := func(address string, commit bool) {
		err := crdb.ExecuteCtx(ctx, func(ctx context.Context, _ ...any) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO emails (address) VALUES ($1)`, address); err != nil {
				return err
			}
			if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Payload: []byte(address)}); err != nil {
				return err
			}
			if !commit {
				return nil // rolled back
			}
			return tx.Commit(ctx)
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	signUp("ada@example.com", true)
	signUp("bob@example.com", false) // rolled back: no row, no item

	fmt.Println("emails:", exampleCount(ctx, pool, `SELECT count(*) FROM emails`))
	fmt.Println("items:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Output:
	// emails: 1
	// items: 1
}

// Claim items for a session and acknowledge each one together with its
// result: the item's delete and the result's write commit in one
// transaction. A second ack of the same claim is refused.
func ExampleQueue_Ack() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()

	sess, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	addEmails(ctx, pool, q, "ada@example.com", "bob@example.com", "eve@example.com")

	items, err := q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed:", len(items))
	for _, it := range items {
		// Send the email here, outside any transaction; then record it.
		err := q.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE emails SET sent = true WHERE address = $1`, string(it.Payload))
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("sent:", exampleCount(ctx, pool, `SELECT count(*) FROM emails WHERE sent`))
	fmt.Println("items left:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))

	err = q.Ack(ctx, items[0], nil)
	fmt.Println("second ack lost its claim:", errors.Is(err, claim.ErrClaimLost))
	// Output:
	// claimed: 3
	// sent: 3
	// items left: 0
	// second ack lost its claim: true
}

// Ack several items, each with its own result, in one transaction when all
// of them succeed; an item whose record fails is reported alone and the
// others are still acked.
func ExampleQueue_AckMany() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()

	// As in the Ack example: a session claims three emails' items.
	q, items, closeSession := claimEmails(ctx, pool, "ada@example.com", "bob@example.com", "eve@example.com")
	defer closeSession()

	errFull := errors.New("mailbox full")
	var reqs []claim.AckRequest
	for _, it := range items {
		address := string(it.Payload)
		reqs = append(reqs, claim.AckRequest{Item: it, Record: func(ctx context.Context, tx pgx.Tx) error {
			if address == "eve@example.com" {
				return errFull
			}
			_, err := tx.Exec(ctx, `UPDATE emails SET sent = true WHERE address = $1`, address)
			return err
		}})
	}
	for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
		switch {
		case err == nil:
			fmt.Printf("%s: acked\n", items[i].Payload)
		case errors.Is(err, errFull):
			fmt.Printf("%s: not acked, mailbox full\n", items[i].Payload)
		default:
			log.Fatal(err)
		}
	}
	fmt.Println("sent:", exampleCount(ctx, pool, `SELECT count(*) FROM emails WHERE sent`))
	fmt.Println("items left:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Unordered output:
	// ada@example.com: acked
	// bob@example.com: acked
	// eve@example.com: not acked, mailbox full
	// sent: 2
	// items left: 1
}

// Nack a failed item: an ordinary error retries it (here at once, with
// RetryAfter, instead of after a backoff), a Permanent one moves it to the
// dead-items table.
func ExampleQueue_Nack() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()

	sess, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close(ctx)

	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("not an address")}); err != nil {
		log.Fatal(err)
	}

	claimOne := func() claim.Item {
		items, err := q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(items) != 1 {
			log.Fatalf("claimed %d items: %v", len(items), err)
		}
		return items[0]
	}

	it := claimOne()
	outcome, err := q.Nack(ctx, it, claim.RetryAfter(0, errors.New("mail server busy")))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("attempt", it.Attempt, "retried:", outcome == claim.Retried)

	it = claimOne()
	fmt.Printf("attempt %d, last error %q\n", it.Attempt, it.LastError)
	outcome, err = q.Nack(ctx, it, claim.Permanent(errors.New("invalid address")))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("attempt", it.Attempt, "dead:", outcome == claim.Dead)

	var lastError string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM crdbwork_dead_items`).Scan(&lastError); err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead item's error:", lastError)
	fmt.Println("items left:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Output:
	// attempt 1 retried: true
	// attempt 2, last error "mail server busy"
	// attempt 2 dead: true
	// dead item's error: invalid address
	// items left: 0
}

// Record the results of a whole batch with one statement: AckMany calls
// the batch hook once per transaction with the requests whose claims held,
// each carrying the Value its handler handed on.
func ExampleQueue_AckMany_batch() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE deliveries (address TEXT PRIMARY KEY, message_id TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	q, items, closeSession := claimEmails(ctx, pool, "ada@example.com", "bob@example.com", "eve@example.com")
	defer closeSession()

	// Each handler sent its email and hands on the mail server's message id.
	var reqs []claim.AckRequest
	for i, it := range items {
		reqs = append(reqs, claim.AckRequest{Item: it, Value: fmt.Sprintf("msg-%d", i)})
	}
	batch := func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		addresses := make([]string, len(acked))
		ids := make([]string, len(acked))
		for i, r := range acked {
			addresses[i], ids[i] = string(r.Item.Payload), r.Value.(string)
		}
		_, err := tx.Exec(ctx, `INSERT INTO deliveries (address, message_id) SELECT * FROM unnest($1::TEXT[], $2::TEXT[])`, addresses, ids)
		return err
	}
	for _, err := range q.AckMany(ctx, reqs, claim.AckOptions{Batch: batch}) {
		if err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("deliveries:", exampleCount(ctx, pool, `SELECT count(*) FROM deliveries`))
	fmt.Println("items left:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	// Output:
	// deliveries: 3
	// items left: 0
}

// A claim holds its item for a lease (Options.Lease, by the database
// clock). A long handler extends it; an item whose lease ran out — its
// handler hung, or its process lost track of it — is released by any
// session's Reap, and the late ack of the old claim is refused.
func ExampleQueue_Reap() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()

	// A session claims two emails' items, with leases of 100 ms.
	q, items, closeSession := claimEmailsWith(ctx, pool, claim.Options{Queue: "emails", Lease: 100 * time.Millisecond},
		"ada@example.com", "bob@example.com")
	defer closeSession()

	// ada's handler is slow but alive: it extends its lease.
	extended, err := q.Claimer(items[0].Session).Extend(ctx, items[:1], time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("extended:", len(extended))

	// bob's handler hangs. Once its lease is over, Reap releases the item.
	released := 0
	for released == 0 {
		st, err := queuemaint.For(q).Reap(ctx)
		if err != nil {
			log.Fatal(err)
		}
		released = st.Released
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("released by Reap:", released)
	err = q.Ack(ctx, items[1], nil)
	fmt.Println("the hung handler's late ack lost its claim:", errors.Is(err, claim.ErrClaimLost))
	again, err := q.Claimer(items[0].Session).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed again:", len(again), "attempt", again[0].Attempt)
	// Output:
	// extended: 1
	// released by Reap: 1
	// the hung handler's late ack lost its claim: true
	// claimed again: 1 attempt 2
}
