package sql_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainDashboardStatements checks the plans of the dashboard's reads
// and writes as TestExplainAdminStatements does: 40 queues, one of them
// ("big") holding half of 100k items, 200k deaths, 100k ended ids and 20k
// audit entries; the statements run on a small queue ("q7") or on "big"
// (the per-queue summaries and pages, which must read a bounded window of
// big's index entries, not its whole backlog). None may scan a table
// sequentially, and each must read the index named.
func TestExplainDashboardStatements(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	session := uuid.New()
	name := `CASE WHEN g % 2 = 0 THEN 'big' ELSE 'q' || (g % 39)::TEXT END`
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, tenant, item_key, payload, claim, lease_until)
		 SELECT gen_random_uuid(), ` + name + `, g % 16, now(), now() + g * INTERVAL '1 millisecond',
		        CASE WHEN g % 3 = 0 THEN 'tenant-' || (g % 500)::TEXT END, 'key-' || g::TEXT, '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN now() + g * INTERVAL '1 millisecond' END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at, reason, tenant, last_error)
		 SELECT gen_random_uuid(), ` + name + `, 0, 0, 1, 1, '\x00'::BYTEA, now(), now() - g * INTERVAL '1 second',
		        'failed', 'tenant-' || (g % 50)::TEXT, 'error ' || g::TEXT
		 FROM generate_series(1, 200000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT ` + name + `, gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_audit (actor, source, action, queue, detail, at)
		 SELECT 'op', 'cli', 'pause', 'q1', '', now() - g * INTERVAL '1 second' FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_queues (name, num_parts) SELECT 'q' || g::TEXT, 16 FROM generate_series(0, 38) AS g`,
		`UPDATE crdbwork_items SET snoozes = 1 WHERE claim IS NULL AND right(item_key, 2) = '07'`,
		`UPDATE crdbwork_items SET cancel_requested_at = now() WHERE claim IS NOT NULL AND right(item_key, 2) = '11'`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining, enqueued_at)
		 SELECT gen_random_uuid(), ` + name + `, 0, '\x00'::BYTEA, 1, now() - g * INTERVAL '1 millisecond' FROM generate_series(1, 20000) AS g`,
		`ANALYZE crdbwork_waiting`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_audit`, `ANALYZE crdbwork_queues`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	now := time.Now()
	id, death := uuid.New(), uuid.New()
	st := crsql.DashboardStatementsForTest(crsql.Tables{})
	cases := []struct {
		name    string
		indexes []string
		args    []any
	}{
		{"Summaries", []string{"crdbwork_items_turn_next", "crdbwork_items_lease", "crdbwork_dead_items_by_queue", "crdbwork_ended_by_age"}, []any{"big", 1000, now.Add(-time.Minute)}},
		{"Summaries", nil, []any{"q7", 1000, now.Add(-time.Minute)}},
		{"PartBacklog", []string{"crdbwork_items_part_turn"}, []any{"big", 16, 1000}},
		{"UnclaimedFirst", []string{"crdbwork_items_turn_next"}, []any{"big", 100}},
		{"UnclaimedAfter", []string{"crdbwork_items_turn_next"}, []any{"big", int64(0), now, 3, id, 100}},
		{"TenantFirst", []string{"crdbwork_items_tenant_turn"}, []any{"big", "tenant-6", 100}},
		{"TenantAfter", []string{"crdbwork_items_tenant_turn"}, []any{"big", "tenant-6", int64(0), now, 3, id, 100}},
		{"ClaimedFirst", []string{"crdbwork_items_lease"}, []any{"big", 100}},
		{"ClaimedAfter", []string{"crdbwork_items_lease"}, []any{"big", now, id, 100}},
		{"DeadFirst", []string{"crdbwork_dead_items_by_queue"}, []any{"big", 100}},
		{"DeadAfter", []string{"crdbwork_dead_items_by_queue"}, []any{"big", now.Add(-time.Hour), id, death, 100}},
		{"Item", []string{"crdbwork_items_pkey"}, []any{id}},
		{"Deaths", []string{"crdbwork_dead_items_pkey"}, []any{id, 20}},
		{"DeleteDead", []string{"crdbwork_dead_items_pkey"}, []any{id, death, "q7"}},
		{"TenantHeads", []string{"crdbwork_items_tenant_turn"}, []any{"big", []string{"tenant-3", "tenant-6"}}},
		{"QueueState", []string{"crdbwork_waiting_by_queue", "crdbwork_items_snoozed", "crdbwork_items_cancel_requested"}, []any{"big", 1000}},
		{"QueueState", nil, []any{"q7", 1000}},
		{"WaitingQueue", []string{"crdbwork_waiting_pkey"}, []any{id}},
		{"AuditInsert", []string{"crdbwork_audit"}, []any{"op", "dashboard", "pause", "q7", "paused"}},
		{"AuditFirst", []string{"crdbwork_audit_by_time"}, []any{50}},
		{"AuditAfter", []string{"crdbwork_audit_by_time"}, []any{now.Add(-time.Hour), id, 50}},
	}
	pcs := make([]planCase, len(cases))
	covered := map[string]bool{}
	for i, c := range cases {
		if st[c.name] == "" {
			t.Fatalf("no dashboard statement %q", c.name)
		}
		pcs[i] = planCase{c.name, st[c.name], c.args}
		covered[c.name] = true
	}
	for name := range st {
		if !covered[name] {
			t.Errorf("the dashboard statement %s has no plan case", name)
		}
	}
	explainEach(t, pool, "dashboard_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		if strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
			strings.Contains(text, "Seq Scan on crdbwork_ended") || strings.Contains(text, "Seq Scan on crdbwork_audit") ||
			strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan") {
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
			return
		}
		if testdb.Kind(t) == "postgres" {
			for _, ix := range c.indexes {
				if !strings.Contains(text, ix) {
					t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, ix, text)
				}
			}
		}
		t.Logf("%s (%s):\n%s", c.name, mode, text)
	})
}
