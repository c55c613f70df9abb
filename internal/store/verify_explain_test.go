package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestDemoPlans: the demo's statements (internal/store/verify.go) read one queue's
// rows through an index, on a database where other queues hold most rows:
// none scans the items, dead items or ended table whole. The part owners
// and memberships (workedQueues) are small tables, read whole.
func TestDemoPlans(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	name := `CASE WHEN g % 2 = 0 THEN 'big' ELSE 'q' || (g % 39)::TEXT END`
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, payload, claim, claimed_at, lease_until)
		 SELECT gen_random_uuid(), ` + name + `, g % 16, '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN now() END,
		        CASE WHEN g % 10 = 1 THEN now() + INTERVAL '1 minute' END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), ` + name + `, 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed' FROM generate_series(1, 20000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, outcome)
		 SELECT ` + name + `, gen_random_uuid(), 'acked' FROM generate_series(1, 50000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_dead_items`, `ANALYZE crdbwork_ended`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	texts := store.DemoStatementsForTest(store.New(crsql.Tables{}))
	ids := make([]uuid.UUID, 50)
	queues := make([]string, 50)
	for i := range ids {
		ids[i], queues[i] = uuid.New(), "q7"
	}
	cases := []struct {
		name  string
		scans bool // may read small tables whole
		args  []any
	}{
		{"countItems", false, []any{"q7"}},
		{"itemFates", false, []any{queues, ids}},
		{"workedQueues", true, nil},
		{"deleteItems", false, []any{"q7", 5000}},
		{"deleteDeadItems", false, []any{"q7", 5000}},
		{"deleteEnded", false, []any{"q7", 5000}},
	}
	pcs := make([]planCase, len(cases))
	for i, c := range cases {
		text, ok := texts[c.name]
		if !ok {
			t.Fatalf("no statement %s", c.name)
		}
		pcs[i] = planCase{c.name, text, c.args}
	}
	if len(pcs) != len(texts) {
		t.Fatalf("%d statements, %d cases: every demo statement needs a case", len(texts), len(pcs))
	}
	explainEach(t, pool, "demo_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		switch {
		case !c.scans && (strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "Seq Scan on crdbwork_dead_items") ||
			strings.Contains(text, "Seq Scan on crdbwork_ended") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan")):
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}
