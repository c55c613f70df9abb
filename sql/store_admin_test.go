package sql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainAdminStatements checks the plans of the operator statements
// (dead items filtered, paged and counted; a queue's rows counted and
// purged in batches) as TestInspectPlans does: 40 queues, one
// of them ("big") holding half of 100k items, 200k deaths and 100k ended
// ids, and a small one ("q7") the statements run on; the deletes by key of
// a purge's batch run on "big" (a batch of 1,000 keys). None may scan the items, dead
// items, ended ids or schedules sequentially (they must read only q7's
// entries), and each must use the index named. PostgreSQL checks both the
// plan for the given parameters and the generic plan.
func TestExplainAdminStatements(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	session := uuid.New()
	name := `CASE WHEN g % 2 = 0 THEN 'big' ELSE 'q' || (g % 39)::TEXT END`
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, tenant, payload, claim, lease_until)
		 SELECT gen_random_uuid(), ` + name + `, g % 16, now(), now(),
		        CASE WHEN g % 3 = 0 THEN 'tenant-' || (g % 500)::TEXT END, '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN now() + INTERVAL '1 minute' END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason, tenant, last_error)
		 SELECT gen_random_uuid(), ` + name + `, 0, 0, 1, 1, '\x00'::BYTEA, now(), now() - g * INTERVAL '1 second',
		        CASE WHEN g % 4 = 0 THEN 'permanent' ELSE 'failed' END, 'tenant-' || (g % 50)::TEXT, 'error ' || g::TEXT
		 FROM generate_series(1, 200000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT ` + name + `, gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_schedules (queue, name, last_period)
		 SELECT ` + name + `, 'schedule-' || g::TEXT, now() FROM generate_series(1, 10000) AS g`,
		`INSERT INTO crdbwork_queues (name, num_parts) SELECT 'q' || g::TEXT, 16 FROM generate_series(0, 38) AS g`,
		`INSERT INTO crdbwork_session_parts (session_id, queue, part) SELECT '` + session.String() + `', 'q' || (g / 16)::TEXT, g % 16 FROM generate_series(0, 623) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_schedules`,
		`ANALYZE crdbwork_queues`, `ANALYZE crdbwork_session_parts`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
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
	st := crsql.AdminStatementsForTest(crsql.Tables{})
	cases := []struct {
		name, index string
		args        []any
	}{
		{"DeadFirst", "crdbwork_dead_items_by_queue", []any{"q7", "", "", "", 100}},
		{"DeadFirst", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "permanent", "error 1", 100}},
		{"DeadAfter", "crdbwork_dead_items_by_queue", []any{"q7", "", "", "", diedAt, id, death, 100}},
		{"DeadAfter", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "", "error", diedAt, id, death, 100}},
		{"DeadCount", "crdbwork_dead_items_by_queue", []any{"q7", "", "", ""}},
		{"DeadCount", "crdbwork_dead_items_by_queue", []any{"q7", "tenant-3", "failed", "error 1"}},
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
