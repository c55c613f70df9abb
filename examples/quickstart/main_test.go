package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestQuickstart runs the quick start against a fresh database and checks
// its outcome: three receipts, no item left, run twice without harm.
func TestQuickstart(t *testing.T) {
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for range 2 {
		if err := run(ctx, url); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var sent, left, parts int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM sent), (SELECT count(*) FROM crdbwork_items),
		(SELECT num_parts FROM crdbwork_queues WHERE name = 'emails')`).Scan(&sent, &left, &parts); err != nil {
		t.Fatal(err)
	}
	if sent != 6 || left != 0 || parts != 16 {
		t.Errorf("after two runs: %d receipts, %d items left, %d parts; want 6, 0, 16", sent, left, parts)
	}
}
