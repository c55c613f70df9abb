package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainAdminStatements checks the plans of the operator statements
// (dead items filtered, paged and counted; a queue's rows counted and
// purged in batches) as TestInspectPlans does: 40 queues, one
// of them ("big") holding half of 100k items, 200k deaths and 100k ended
// ids (dashboardSeed's state, shared with the dashboard's plan tests), and
// a small one ("q7") the statements run on; the deletes by key of
// a purge's batch run on "big" (a batch of 1,000 keys). None may scan the items, dead
// items, ended ids or schedules sequentially (they must read only q7's
// entries), and each must use the index named. PostgreSQL checks both the
// plan for the given parameters and the generic plan.
func TestExplainAdminStatements(t *testing.T) {
	t.Parallel()
	pool := dashboardSeed(t)
	ctx := context.Background()
	var diedAt time.Time
	var id, death uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT died_at, id, death FROM crdbwork_dead_items WHERE queue = 'q7' ORDER BY died_at DESC LIMIT 1 OFFSET 20`).Scan(&diedAt, &id, &death); err != nil {
		t.Fatal(err)
	}
	ids := map[string][]uuid.UUID{}
	for _, tb := range []string{"items", "dead_items", "ended"} {
		rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_`+tb+` WHERE queue = 'big' LIMIT 1000`)
		if err != nil {
			t.Fatal(err)
		}
		if ids[tb], err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil || len(ids[tb]) < 100 {
			t.Fatalf("%d ids of big in %s: %v", len(ids[tb]), tb, err)
		}
	}
	st := store.AdminStatementsForTest(crsql.Tables{})
	cases := []struct {
		name, index string
		args        []any
	}{
		{"DeadFirst", "crdbwork_dead_items_by_queue", []any{"q7", "", "", "", "", 100}},
		{"DeadFirst", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "permanent", "error 1", "kind-a", 100}},
		{"DeadAfter", "crdbwork_dead_items_by_queue", []any{"q7", "", "", "", "", diedAt, id, death, 100}},
		{"DeadAfter", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "", "error", "kind-a", diedAt, id, death, 100}},
		{"DeadCount", "crdbwork_dead_items_by_queue", []any{"q7", "", "", "", ""}},
		{"DeadCount", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "failed", "error 1", "kind-a"}},
		{"EndedCount", "crdbwork_ended", []any{"q7"}},
		{"ScheduleCount", "crdbwork_schedules", []any{"q7"}},
		{"OwnerCount", "crdbwork_session_parts", []any{"q7"}},
		{"PickUnclaimed", "crdbwork_items_", []any{"q7", 1000}},
		{"PickClaimed", "crdbwork_items_lease", []any{"q7", 1000}},
		{"PickDead", "crdbwork_dead_items_by_queue", []any{"q7", 1000}},
		{"PickEnded", "crdbwork_ended_", []any{"q7", 1000}},
		// A batch of the purge of a large queue deletes its rows by key,
		// not by reading the queue's index entries (which would make the
		// purge grow with the square of the queue).
		{"PurgeItems", "crdbwork_items_pkey", []any{"big", ids["items"]}},
		{"PurgeItems (one)", "crdbwork_items_pkey", []any{"big", ids["items"][:1]}},
		{"PurgeDead", "crdbwork_dead_items_pkey", []any{"big", ids["dead_items"]}},
		{"PurgeEnded", "crdbwork_ended_pkey", []any{"big", ids["ended"]}},
		{"PurgeOwnedParts", "crdbwork_session_parts", []any{"q7"}},
		{"PurgeTenantLimits", "crdbwork_tenant_limits", []any{"q7"}},
		{"PurgeSchedules", "crdbwork_schedules", []any{"q7"}},
		{"PurgeQueueRow", "crdbwork_queues", []any{"q7"}},
	}
	pcs := make([]planCase, len(cases))
	covered := map[string]bool{}
	for i, c := range cases {
		stmt, _, _ := strings.Cut(c.name, " (")
		if st[stmt] == "" {
			t.Fatalf("no admin statement %q", stmt)
		}
		pcs[i] = planCase{c.name, st[stmt], c.args}
		covered[stmt] = true
	}
	for name := range st {
		if !covered[name] {
			t.Errorf("the admin statement %s has no plan case", name)
		}
	}
	explainEach(t, pool, "admin_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		switch {
		case strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
			strings.Contains(text, "Seq Scan on crdbwork_ended") || strings.Contains(text, "Seq Scan on crdbwork_schedules") ||
			strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
		case testdb.Kind(t) == "postgres" && !strings.Contains(text, c.index):
			t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, c.index, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}
