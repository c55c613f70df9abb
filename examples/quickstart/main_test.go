package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestQuickstart runs the quick start against a fresh database and checks
// its outcome: three receipts, no item left, run twice without harm.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
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

// TestQuickstartItemsLandInTheirKeysParts enqueues the quick start's items
// into a fresh database and checks that each is in its key's part of 16:
// the queue's parts are set before the first item is enqueued (an item's
// part is fixed at enqueue; before, all three landed in part 0).
func TestQuickstartItemsLandInTheirKeysParts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
	defer cancel()
	pool, err := connect(ctx, testdb.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := produce(ctx, pool, q)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT item_key, part FROM crdbwork_items WHERE id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	type keyPart struct {
		Key  string
		Part int
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[keyPart])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d items enqueued, want 3", len(got))
	}
	parts := map[int]bool{}
	for _, kp := range got {
		if want := claim.PartOf(kp.Key, "", 16); kp.Part != want {
			t.Errorf("item with key %q is in part %d, want %d (its key's part of 16)", kp.Key, kp.Part, want)
		}
		parts[kp.Part] = true
	}
	if len(parts) < 2 {
		t.Errorf("the three items share part %v: the keys should spread them", got)
	}
}
