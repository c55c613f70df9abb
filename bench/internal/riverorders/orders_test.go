package riverorders

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// TestOrders runs the River version of docs/migrating.md's order pipeline
// on a throwaway PostgreSQL server and checks the outcome examples/orders'
// test checks: every order paid by one charge, the card that timed out
// charged by its second attempt, a cleanup run.
func TestOrders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(3*time.Minute))
	defer cancel()
	s, err := dbserver.Start(ctx, dbserver.Options{Prefer: dbserver.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	}()
	pool, err := pgxpool.New(ctx, s.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	gw := NewGateway()
	client, err := NewClient(pool, gw)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	for _, o := range []ChargeArgs{
		{OrderID: uuid.New(), Card: "tok_visa", Cents: 1250},
		{OrderID: uuid.New(), Card: "tok_timeout_once", Cents: 4999},
		{OrderID: uuid.New(), Card: "tok_mastercard", Cents: 300},
	} {
		if err := PlaceOrder(ctx, pool, client, o); err != nil {
			t.Fatal(err)
		}
	}
	await.Until(t, "3 orders paid and a cleanup run", func() (bool, string) {
		var paid, cleanups int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE status = 'paid'),
			(SELECT count(*) FROM cleanups)`).Scan(&paid, &cleanups); err != nil {
			return false, err.Error()
		}
		return paid == 3 && cleanups > 0, fmt.Sprintf("%d paid, %d cleanups", paid, cleanups)
	})
	var charges, chargedOrders, retried int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id),
		count(*) FILTER (WHERE attempt = 2 AND order_id IN (SELECT id FROM orders WHERE card = 'tok_timeout_once'))
		FROM charges`).Scan(&charges, &chargedOrders, &retried); err != nil {
		t.Fatal(err)
	}
	if charges != 3 || chargedOrders != 3 || retried != 1 {
		t.Errorf("%d charges of %d orders, %d by attempt 2 of the card that timed out; want 3, 3, 1", charges, chargedOrders, retried)
	}
	if calls := gw.Calls(); calls != 4 {
		t.Errorf("%d gateway calls, want 4 (one retry)", calls)
	}
}
