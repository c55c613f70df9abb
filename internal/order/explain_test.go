package order_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/order"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestCountUsesTheClaimOrderIndex: on a 50,000-item backlog the count reads
// the unclaimed items through the claim-order index (crdbwork_items_turn_next),
// never by a sequential scan of the items table.
func TestCountUsesTheClaimOrderIndex(t *testing.T) {
	ctx := context.Background()
	pool := setup(t)
	for _, s := range []string{
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
		 SELECT gen_random_uuid(), CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END, g % 16, g % 1000,
		        now() - g * INTERVAL '1 millisecond', now() - g * INTERVAL '1 millisecond', '\x00'::BYTEA
		 FROM generate_series(1, 50000) AS g`,
		`ANALYZE crdbwork_items`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	m, err := order.NewMeter(pool, crsql.Tables{}, "q")
	if err != nil {
		t.Fatal(err)
	}
	stmt, args := m.Statement([]claim.Item{{Priority: 3, TurnAt: time.Now()}, {Priority: 700, TurnAt: time.Now()}})
	rows, err := pool.Query(ctx, "EXPLAIN "+stmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if strings.Contains(plan, "Seq Scan on crdbwork_items") || strings.Contains(strings.ToLower(plan), "full scan") ||
		!strings.Contains(plan, "crdbwork_items_turn_next") {
		t.Errorf("the count does not read the claim-order index:\n%s", plan)
	}
	t.Logf("%s plan:\n%s", testdb.Kind(t), plan)
}
