package workertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

// exampleT stands in for the *testing.T of a test, so that the examples
// run: it prints failures, and runs its cleanups when the example calls
// end, as the testing package does when a test ends.
type exampleT struct {
	testing.TB
	cleanups []func()
	hide     string // printed as <schema>
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Name() string                      { return "TestExample" }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)               {}
func (t *exampleT) Errorf(format string, args ...any) { t.fail(format, args...) }
func (t *exampleT) Fatalf(format string, args ...any) { t.fail(format, args...) }

func (t *exampleT) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if t.hide != "" {
		msg = strings.ReplaceAll(msg, t.hide, "<schema>")
	}
	fmt.Println("FAIL: " + msg)
}

func (t *exampleT) end() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// examplePool opens a pool on a fresh database; close it with the returned
// function.
func examplePool(ctx context.Context) (*pgxpool.Pool, func()) {
	url, drop := testdb.ExampleURL()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); drop() }
}

// welcome is the payload of the items signUp enqueues.
type welcome struct {
	To   string `json:"to"`
	Lang string `json:"lang"`
}

// signUp is the producer under test: it stores a user and enqueues their
// welcome email in the same transaction, keyed by the address so that one
// user's emails are sent in order.
func signUp(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue, address, lang string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO users (address) VALUES ($1)`, address); err != nil {
			return err
		}
		payload, err := json.Marshal(welcome{To: address, Lang: lang})
		if err != nil {
			return err
		}
		_, err = q.EnqueueTx(ctx, tx, claim.NewItem{Payload: payload, Key: address})
		return err
	})
}

// A test gets crdbwork tables of its own with Tables: everything it
// enqueues and works stays in its schema, which is dropped when the test
// ends, so tests may run in parallel on one database. In a test, t is the
// test's *testing.T and pool comes from the test's database.
func ExampleTables() {
	ctx := context.Background()
	pool, closePool := examplePool(ctx)
	defer closePool()
	t := &exampleT{}

	tables := workertest.Tables(t, pool) // in a test: t.Parallel() is fine
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (item_id UUID PRIMARY KEY, greeting TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	res, err := workertest.Work(ctx, nil, greet, claim.NewItem{Payload: []byte("Ada")}, workertest.Options{DB: pool, Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Outcome)
	// Nothing was written outside the test's schema.
	fmt.Println("default tables missing:", errors.Is(crsql.Check(ctx, pool, crsql.Tables{}), crsql.ErrSchemaMissing))

	t.end() // in a test, the testing package runs the cleanups
	fmt.Println("after the test, its tables missing:", errors.Is(crsql.Check(ctx, pool, tables), crsql.ErrSchemaMissing))
	// Output:
	// acked
	// default tables missing: true
	// after the test, its tables missing: true
}

// Test a producer: RequireEnqueued finds the one item the code under test
// enqueued, matching its JSON payload and key, and returns it for further
// checks; RequireNotEnqueued checks what must not be there.
func ExampleRequireEnqueued() {
	ctx := context.Background()
	pool, closePool := examplePool(ctx)
	defer closePool()
	t := &exampleT{}
	defer t.end()

	tables := workertest.Tables(t, pool)
	if _, err := pool.Exec(ctx, `CREATE TABLE users (address TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "emails", Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	if err := signUp(ctx, pool, q, "ada@example.com", "en"); err != nil {
		log.Fatal(err)
	}

	it := workertest.RequireEnqueued(t, pool, tables, "emails",
		workertest.HasJSON(welcome{To: "ada@example.com", Lang: "en"}),
		workertest.HasKey("ada@example.com"))
	fmt.Println(it.Key, it.Priority, it.Attempt)
	workertest.RequireNotEnqueued(t, pool, tables, "emails", workertest.HasKey("bob@example.com"))
	// Output:
	// ada@example.com 0 0
}

// RequireEnqueuedN checks a number of matching items and returns them.
// A wrong expectation fails the test with what was wanted and, for each
// item of the queue, what differs. (exampleT prints the failure, with the
// test schema's random name hidden; a *testing.T would fail the test.)
func ExampleRequireEnqueuedN() {
	ctx := context.Background()
	pool, closePool := examplePool(ctx)
	defer closePool()
	t := &exampleT{}
	defer t.end()

	tables := workertest.Tables(t, pool)
	t.hide = tables.Schema
	q, err := claim.New(pool, claim.Options{Queue: "emails", Tables: tables})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx,
		claim.NewItem{ID: uuid.MustParse("00000000-0000-4000-8000-00000000000a"), Payload: []byte(`{"to":"ada@example.com"}`), Tenant: "acme", Priority: 1},
		claim.NewItem{ID: uuid.MustParse("00000000-0000-4000-8000-00000000000b"), Payload: []byte(`{"to":"bob@example.com"}`), Tenant: "acme", Priority: 2},
	); err != nil {
		log.Fatal(err)
	}
	items := workertest.RequireEnqueuedN(t, pool, tables, "emails", 2, workertest.HasTenant("acme"))
	fmt.Println(len(items), "items, first", string(items[0].Payload))

	// A mistake: only one of them has priority 2.
	workertest.RequireEnqueuedN(t, pool, tables, "emails", 2, workertest.HasTenant("acme"), workertest.HasPriority(2))
	// Output:
	// 2 items, first {"to":"ada@example.com"}
	// FAIL: workertest.RequireEnqueuedN: want 2 items of queue "emails" (schema <schema>) with tenant "acme", priority 2; found 1 among the queue's 2 items:
	//   00000000-0000-4000-8000-00000000000a waiting: key "", tenant "acme", priority 1, attempts 0, payload {"to":"ada@example.com"}
	//       differs: priority 1 (want priority 2)
	//   00000000-0000-4000-8000-00000000000b waiting: key "", tenant "acme", priority 2, attempts 0, payload {"to":"bob@example.com"}
	//       matches
}
