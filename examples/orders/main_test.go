package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestOrders runs the order pipeline of docs/migrating.md against a fresh
// database and checks its outcome: every order paid by exactly one charge,
// the card that timed out charged by its second attempt, a cleanup run
// once per item, and no charge left in its queue, nor any item dead.
func TestOrders(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
	defer cancel()
	if err := run(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var orders, paid, charges, chargedOrders, retried, cleanups, cleanupItems, left, dead int
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM orders),
		(SELECT count(*) FROM orders WHERE status = 'paid'),
		(SELECT count(*) FROM charges),
		(SELECT count(DISTINCT order_id) FROM charges),
		(SELECT count(*) FROM charges c JOIN orders o ON o.id = c.order_id WHERE o.card = 'tok_timeout_once' AND c.attempt = 2),
		(SELECT count(*) FROM cleanups),
		(SELECT count(DISTINCT item_id) FROM cleanups),
		(SELECT count(*) FROM crdbwork_items WHERE queue = 'orders'),
		(SELECT count(*) FROM crdbwork_dead_items)`).Scan(
		&orders, &paid, &charges, &chargedOrders, &retried, &cleanups, &cleanupItems, &left, &dead); err != nil {
		t.Fatal(err)
	}
	if orders != 3 || paid != 3 {
		t.Errorf("%d of %d orders paid, want 3 of 3", paid, orders)
	}
	if charges != 3 || chargedOrders != 3 {
		t.Errorf("%d charges of %d orders, want one charge for each of 3", charges, chargedOrders)
	}
	if retried != 1 {
		t.Errorf("%d charges of the card that timed out once were made by attempt 2, want 1", retried)
	}
	if cleanups < 1 || cleanups != cleanupItems {
		t.Errorf("%d cleanups by %d items, want at least one, one per item", cleanups, cleanupItems)
	}
	if left != 0 || dead != 0 {
		t.Errorf("%d charges left in the queue and %d items dead, want none", left, dead)
	}
}
