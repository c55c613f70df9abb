package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
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
	t.Parallel()
	pool := dashboardSeed(t)
	now := time.Now()
	id, death := uuid.New(), uuid.New()
	st := store.DashboardStatementsForTest(crsql.Tables{})
	cases := []struct {
		name    string
		indexes []string
		args    []any
	}{
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
		{"WaitingQueue", []string{"crdbwork_waiting_pkey"}, []any{id}},
		{"AuditInsert", []string{"crdbwork_audit"}, []any{"op", "dashboard", "pause", "q7", "paused"}},
		{"AuditFirst", []string{"crdbwork_audit_by_time"}, []any{50}},
		{"AuditAfter", []string{"crdbwork_audit_by_time"}, []any{now.Add(-time.Hour), id, 50}},
		// The search windows, with a text that matches nothing (the window is
		// read whole) and the default scan window.
		{"SearchUnclaimed", []string{"crdbwork_items_turn_next"}, []any{"zz", []byte("zz"), "big", 2000}},
		{"SearchUnclaimedAfter", []string{"crdbwork_items_turn_next"}, []any{"zz", []byte("zz"), "big", int64(0), now, 3, id, 2000}},
		{"SearchUnclaimedAll", []string{"crdbwork_items_turn_next"}, []any{"zz", []byte("zz"), 2000}},
		{"SearchUnclaimedAllAfter", []string{"crdbwork_items_turn_next"}, []any{"zz", []byte("zz"), "big", int64(0), now, 3, id, 2000}},
		{"SearchClaimed", []string{"crdbwork_items_lease"}, []any{"zz", []byte("zz"), "big", 2000}},
		{"SearchClaimedAfter", []string{"crdbwork_items_lease"}, []any{"zz", []byte("zz"), "big", now, id, 2000}},
		{"SearchClaimedAll", []string{"crdbwork_items_lease"}, []any{"zz", []byte("zz"), 2000}},
		{"SearchClaimedAllAfter", []string{"crdbwork_items_lease|crdbwork_items_claimed"}, []any{"zz", []byte("zz"), "big", now, id, 2000}},
		{"SearchDead", []string{"crdbwork_dead_items_by_queue"}, []any{"zz", []byte("zz"), "big", 2000}},
		{"SearchDeadAfter", []string{"crdbwork_dead_items_by_queue"}, []any{"zz", []byte("zz"), "big", now.Add(-time.Hour), id, death, 2000}},
		{"SearchDeadAll", []string{"crdbwork_dead_items_by_queue"}, []any{"zz", []byte("zz"), 2000}},
		{"SearchDeadAllAfter", []string{"crdbwork_dead_items_by_queue"}, []any{"zz", []byte("zz"), "q5", now.Add(-time.Hour), id, death, 2000}},
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
				if !containsAny(text, strings.Split(ix, "|")) {
					t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, ix, text)
				}
			}
		}
		t.Logf("%s (%s):\n%s", c.name, mode, text)
	})
}

// containsAny reports whether text holds one of subs (an index named
// "a|b" in a plan case: either serves; here the claimed items of every
// queue, which the planner may read through either claimed-only index and
// sort, as they are bounded by the handlers running).
func containsAny(text string, subs []string) bool {
	for _, s := range subs {
		if strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// dashboardSeed returns a fresh database of the test in the state of the
// operator statements' plan tests (TestExplainDashboardStatements,
// TestExplainAdminStatements, TestDashboardPerPartReadsAreUncorrelatedSeeks):
// the schema and 40 queues, one of them ("big") holding half of 100k items
// (a tenth claimed, a third with a tenant, some snoozed or asked to cancel),
// 200k deaths, 100k ended ids, 20k waiting items and 10k schedules; 20k
// audit entries; 624 owned parts of the small queues; every table analyzed.
// The state is built once per test binary and copied for each test (a copy
// keeps the statistics and the dead tuples of the updates alike).
func dashboardSeed(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testdb.NewFromTemplate(t, "operator statements' plan state", func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := applySchema(ctx, pool); err != nil {
			return err
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
			        CASE WHEN g % 4 = 0 THEN 'permanent' ELSE 'failed' END, 'tenant-' || (g % 50)::TEXT, 'error ' || g::TEXT
			 FROM generate_series(1, 200000) AS g`,
			`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
			 SELECT ` + name + `, gen_random_uuid(), now() - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 100000) AS g`,
			`INSERT INTO crdbwork_audit (actor, source, action, queue, detail, at)
			 SELECT 'op', 'cli', 'pause', 'q1', '', now() - g * INTERVAL '1 second' FROM generate_series(1, 20000) AS g`,
			`INSERT INTO crdbwork_schedules (queue, name, last_period)
			 SELECT ` + name + `, 'schedule-' || g::TEXT, now() FROM generate_series(1, 10000) AS g`,
			`INSERT INTO crdbwork_queues (name, num_parts) SELECT 'q' || g::TEXT, 16 FROM generate_series(0, 38) AS g`,
			`INSERT INTO crdbwork_session_parts (session_id, queue, part) SELECT '` + session.String() + `', 'q' || (g / 16)::TEXT, g % 16 FROM generate_series(0, 623) AS g`,
			`UPDATE crdbwork_items SET snoozes = 1 WHERE claim IS NULL AND right(item_key, 2) = '07'`,
			`UPDATE crdbwork_items SET cancel_requested_at = now() WHERE claim IS NOT NULL AND right(item_key, 2) = '11'`,
			`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining, enqueued_at)
			 SELECT gen_random_uuid(), ` + name + `, 0, '\x00'::BYTEA, 1, now() - g * INTERVAL '1 millisecond' FROM generate_series(1, 20000) AS g`,
			`ANALYZE crdbwork_waiting`,
			`ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_audit`, `ANALYZE crdbwork_queues`,
			`ANALYZE crdbwork_schedules`, `ANALYZE crdbwork_session_parts`,
		}
		for _, s := range seed {
			if _, err := pool.Exec(ctx, s); err != nil {
				return fmt.Errorf("%w\n%s", err, s)
			}
		}
		return nil
	})
}

// partArgs returns the parts first to first+n-1, as arguments.
func partArgs(first, n int) []any {
	var out []any
	for p := first; p < first+n; p++ {
		out = append(out, p)
	}
	return out
}

// CockroachDB's backlog read of store.MaxBacklogParts parts and head read of
// store.MaxHeadTenants tenants, on the queue holding 50,000 items, are one
// limited seek per part or tenant, none correlated with another row. On
// CockroachDB: no apply join (one plan per part) and no window or distinct
// (the decorrelated form, which reads every matching row), and one scan of
// the index per branch. On PostgreSQL, which runs them here (its own twins,
// LATERAL subqueries, are checked by TestExplainDashboardStatements): one
// scan of the part (tenant) index per branch, each under a Limit, and no
// join, function scan or correlated subplan (the LATERAL shape is a nested
// loop over a function scan, with one index scan node run once per outer
// row: it fails this test).
func TestDashboardPerPartReadsAreUncorrelatedSeeks(t *testing.T) {
	t.Parallel()
	pool := dashboardSeed(t)
	tenants := []any{"big"}
	for i := range store.MaxHeadTenants {
		tenants = append(tenants, fmt.Sprint("tenant-", i*3))
	}
	cases := []struct {
		name, index string
		branches    int
	}{
		{"PartBacklog", "crdbwork_items_part_turn", store.MaxBacklogParts},
		{"TenantHeads", "crdbwork_items_tenant_turn", store.MaxHeadTenants},
	}
	pcs := []planCase{
		{"PartBacklog", store.DashboardPartBacklogForTest(crsql.Tables{}, store.MaxBacklogParts), append([]any{"big", 1000}, partArgs(0, store.MaxBacklogParts)...)},
		{"TenantHeads", store.DashboardTenantHeadsForTest(crsql.Tables{}, store.MaxHeadTenants), tenants},
	}
	for _, pc := range pcs {
		if strings.Contains(pc.stmt, "LATERAL") || strings.Contains(pc.stmt, "unnest") || strings.Contains(pc.stmt, "generate_series") {
			t.Errorf("%s joins its parts or tenants:\n%s", pc.name, pc.stmt)
		}
	}
	postgres := testdb.Kind(t) == "postgres"
	explainEach(t, pool, "dashboard_branches_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		bad := []string{"FULL SCAN", "full scan", "apply", "window", "row_number", "distinct"}
		scans := strings.Count(text, "@"+c.index)
		if postgres {
			bad = []string{"Seq Scan", "Nested Loop", "Function Scan", "SubPlan", "Hash Join", "Merge Join", "Bitmap"}
			scans = strings.Count(text, "using "+c.index)
		}
		for _, b := range bad {
			if strings.Contains(text, b) {
				t.Errorf("%s (%s) has %q:\n%s", c.name, mode, b, text)
			}
		}
		if scans != c.branches || strings.Count(text, "Limit")+strings.Count(text, "limit") < c.branches {
			t.Errorf("%s (%s): %d scans of %s and %d limits, want one limited scan per branch (%d):\n%s",
				c.name, mode, scans, c.index, strings.Count(text, "Limit")+strings.Count(text, "limit"), c.branches, text)
		}
		t.Logf("%s (%s):\n%s", c.name, mode, text)
	})
}

// plainDB hides a pool's SendBatch: the reads then send their statements
// one after the other.
type plainDB struct{ crsql.DB }

// PartBacklog and TenantHeads answer what the items hold, per part and
// per tenant, in both engines' forms (run here on one engine), across
// several statements on CockroachDB (more parts than store.MaxBacklogParts,
// more tenants than store.MaxHeadTenants), batched or not: a part's
// unclaimed items up to the cap, another queue's and claimed items not
// counted; a tenant's next unclaimed item in claim order (by priority,
// then turn), none for a tenant whose items are all claimed or who has
// none, in the order the tenants were given (duplicates too).
func TestDashboardBacklogAndHeadsAnswerTheItems(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	const parts, capAt = store.MaxBacklogParts + 6, 5
	for _, s := range []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		// Part p holds p % 9 unclaimed items of "r"; every fourth part one
		// claimed item more; queue "other" holds items in every part.
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, tenant, payload)
		 SELECT gen_random_uuid(), 'r', p, k % 3, now() + k * INTERVAL '1 second', now() - k * INTERVAL '1 second',
		        't' || (p % 40)::TEXT, '\x00'::BYTEA
		 FROM generate_series(0, ` + fmt.Sprint(parts-1) + `) AS p, generate_series(1, 8) AS k WHERE k <= p % 9`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, tenant, payload, claim, lease_until)
		 SELECT gen_random_uuid(), 'r', p, now() - INTERVAL '1 hour', now() - INTERVAL '1 hour', 'claimed-only',
		        '\x00'::BYTEA, '` + session.String() + `', now() + INTERVAL '1 hour'
		 FROM generate_series(0, ` + fmt.Sprint(parts-1) + `, 4) AS p`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, tenant, payload)
		 SELECT gen_random_uuid(), 'other', p, now() - INTERVAL '1 day', now() - INTERVAL '1 day', 't1', '\x00'::BYTEA
		 FROM generate_series(0, ` + fmt.Sprint(parts-1) + `) AS p`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	stmts := store.New(crsql.Tables{})
	var tenants []string
	for i := range store.MaxHeadTenants + 9 {
		tenants = append(tenants, fmt.Sprint("t", i)) // t40 and above have no items
	}
	tenants = append(tenants, "claimed-only", "t3", "")
	for _, c := range []struct {
		d  store.Dialect
		db crsql.DB
	}{{store.Postgres, pool}, {store.Cockroach, pool}, {store.Cockroach, plainDB{pool}}} {
		d, db := c.d, c.db
		for _, n := range []int{parts, store.MaxBacklogParts, 1, 0} {
			got, err := stmts.PartsBacklog(ctx, db, d, "r", n, capAt)
			if err != nil {
				t.Fatalf("%v %T, %d parts: %v", d, db, n, err)
			}
			if len(got) != n {
				t.Fatalf("%v %T: %d counts for %d parts", d, db, len(got), n)
			}
			for p, c := range got {
				if want := int64(min(p%9, capAt)); c != want {
					t.Errorf("%v %T, %d parts: part %d has %d unclaimed items, want %d", d, db, n, p, c, want)
				}
			}
		}
		heads, err := stmts.ItemsTenantHeads(ctx, db, d, "r", tenants)
		if err != nil {
			t.Fatalf("%v %T: %v", d, db, err)
		}
		if len(heads) != len(tenants) {
			t.Fatalf("%v %T: %d heads for %d tenants", d, db, len(heads), len(tenants))
		}
		for i, h := range heads {
			var want *time.Time
			if err := pool.QueryRow(ctx, `SELECT (SELECT vesting_at FROM crdbwork_items WHERE queue = 'r' AND tenant = $1 AND claim IS NULL
				ORDER BY priority, turn_at LIMIT 1)`, tenants[i]).Scan(&want); err != nil {
				t.Fatal(err)
			}
			switch {
			case h.Tenant != tenants[i]:
				t.Errorf("%v %T: head %d is tenant %q's, want %q's", d, db, i, h.Tenant, tenants[i])
			case (h.Head == nil) != (want == nil) || h.Head != nil && !h.Head.Equal(*want):
				t.Errorf("%v %T: tenant %q's head %v, want %v", d, db, tenants[i], h.Head, want)
			case h.Now.IsZero():
				t.Errorf("%v %T: tenant %q's head has no database time", d, db, tenants[i])
			}
			if tenants[i] == "claimed-only" || tenants[i] == "t45" || tenants[i] == "" {
				if h.Head != nil {
					t.Errorf("%v %T: tenant %q has a head, %v; its items are all claimed, or it has none", d, db, tenants[i], h.Head)
				}
			} else if p := tenants[i]; p == "t3" && h.Head == nil {
				t.Errorf("%v %T: tenant t3 has no head", d, db)
			}
		}
		if heads, err := stmts.ItemsTenantHeads(ctx, db, d, "r", nil); err != nil || len(heads) != 0 {
			t.Errorf("%v %T: the heads of no tenant: %v, %v", d, db, heads, err)
		}
	}
}
