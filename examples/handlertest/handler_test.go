// Package handlertest is the example of testing a handler with
// worker/workertest against a real database (docs/getting-started.md).
package handlertest

import (
	"context"
	"errors"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// sendEmail is the handler under test: an empty body is a permanent error.
func sendEmail(ctx context.Context, it claim.Item) (worker.Record, error) {
	if len(it.Payload) == 0 {
		return nil, claim.Permanent(errors.New("empty body"))
	}
	return worker.Exec(`INSERT INTO sent (item_id) VALUES ($1)`, it.ID), nil
}

func TestSendEmail(t *testing.T) {
	ctx := context.Background()
	pool := testdb.New(t) // your own test database here
	if _, err := pool.Exec(ctx, `CREATE TABLE sent (item_id UUID PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	// No queue: Work makes a fresh one on DB (or pass your *claim.Queue).
	res, err := workertest.Work(ctx, nil, sendEmail, claim.NewItem{Payload: []byte("Hello")}, workertest.Options{DB: pool})
	if err != nil {
		t.Fatal(err) // Work itself failed (database, cancelled ctx); a failing handler is not an error
	}
	if res.Outcome != claim.Acked {
		t.Fatalf("item %s: %v: %v", res.Item.ID, res.Outcome, res.Err) // Err: the handler's error, panic or timeout
	}
	// The handler's Record has committed: its row is there.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sent WHERE item_id = $1`, res.Item.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows for the item (%v), want 1", n, err)
	}

	res, err = workertest.Work(ctx, nil, sendEmail, claim.NewItem{}, workertest.Options{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != claim.Dead { // a permanent error: straight to the dead items
		t.Fatalf("empty item: %v, want Dead", res.Outcome)
	}
}
