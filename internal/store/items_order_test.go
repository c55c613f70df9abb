package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestOrderCountPlan: on a 50,000-item backlog (two queues, a thousand
// priorities) the count of Store.ItemsOrderCountsBefore reads the unclaimed
// items through the claim-order index (crdbwork_items_turn_next), never by
// a sequential scan of the items table, in the plan for its arguments and,
// on PostgreSQL, in the generic plan. Its counts are the items strictly
// before each position, checked against a count by hand.
func TestOrderCountPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newSchemaDB(t)
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
	stmts := store.New(crsql.Tables{})
	now := time.Now().UTC().Truncate(time.Microsecond)
	cases := []planCase{{"OrderCountsBefore", store.OrderCountsBeforeText(stmts), []any{"q", []int64{3, 700}, []time.Time{now, now}}}}
	explainEach(t, pool, "order_", cases, nil, func(i int, mode, plan string) {
		if strings.Contains(plan, "Seq Scan on crdbwork_items") || strings.Contains(strings.ToLower(plan), "full scan") ||
			!strings.Contains(plan, "crdbwork_items_turn_next") {
			t.Errorf("the count (%s) does not read the claim-order index:\n%s", mode, plan)
			return
		}
		t.Logf("%s plan (%s):\n%s", testdb.Kind(t), mode, plan)
	})

	// The counts, in the order of the positions given.
	positions := []store.OrderPosition{{Priority: 700, TurnAt: now}, {Priority: 3, TurnAt: now.Add(-time.Hour)}, {Priority: 3, TurnAt: now}}
	got, err := stmts.ItemsOrderCountsBefore(ctx, pool, "q", positions)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range positions {
		var want int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items
			WHERE queue = 'q' AND claim IS NULL AND (priority < $1 OR (priority = $1 AND turn_at < $2))`, p.Priority, p.TurnAt).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got[i] != want {
			t.Errorf("position %d (priority %d, turn %v): count %d, want %d", i, p.Priority, p.TurnAt, got[i], want)
		}
	}
	if !(0 < got[1] && got[1] < got[2] && got[2] < got[0]) {
		t.Errorf("counts %v: want fewer items before the hour-old position of priority 3 than before the current one, and most before priority 700", got)
	}
	if none, err := stmts.ItemsOrderCountsBefore(ctx, pool, "q", nil); err != nil || none != nil {
		t.Errorf("no positions: %v, %v; want nil, nil", none, err)
	}
}
