package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainCancelStatements checks the plans of the cancel and snooze
// statements as TestExplainAdminStatements does: 40 queues, one of them
// ("big") holding half of 100k items (a tenth claimed, some
// cancel-requested, some snoozed) and half of 100k ended ids (some
// cancelled), the statements run on a small queue ("q7"). None may scan a
// table sequentially, and each must read the index named (PostgreSQL,
// the plan for the given parameters and the generic plan): the per
// heartbeat read of a session's cancel requests, the reaper's step and the
// counts read only the (normally few) cancel-requested or snoozed items
// of their queue, the list only its cancelled ids, and the single-item
// statements one row by primary key.
func TestExplainCancelStatements(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	name := `CASE WHEN g % 2 = 0 THEN 'big' ELSE 'q' || (g % 39)::TEXT END`
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, claim, lease_until, cancel_requested_at, snoozes)
		 SELECT gen_random_uuid(), ` + name + `, g % 16, now(), now(), '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN now() + INTERVAL '1 minute' END,
		        CASE WHEN g % 1000 = 1 THEN now() END,
		        CASE WHEN g % 500 = 2 THEN 3 ELSE 0 END
		 FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome, cancel_by)
		 SELECT ` + name + `, gen_random_uuid(), now() - g * INTERVAL '1 second',
		        CASE WHEN g % 100 = 1 THEN 'cancelled' ELSE 'acked' END, CASE WHEN g % 100 = 1 THEN 'ops' END
		 FROM generate_series(1, 100000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_ended`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var id uuid.UUID
	var endedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT id FROM crdbwork_items WHERE queue = 'q7' LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT ended_at FROM crdbwork_ended WHERE queue = 'q7' AND outcome = 'cancelled' ORDER BY ended_at DESC LIMIT 1 OFFSET 3`).Scan(&endedAt); err != nil {
		t.Fatal(err)
	}
	st := store.CancelStatementsForTest(crsql.Tables{})
	cases := []struct {
		name, index string
		args        []any
	}{
		{"CancelUnclaimed", "crdbwork_items_pkey", []any{id, "q7", "ops", "why"}},
		{"Request", "crdbwork_items_pkey", []any{id, "q7", "ops", "why"}},
		{"State", "crdbwork_items_pkey", []any{id, "q7"}},
		{"SessionCancels", "crdbwork_items_cancel_requested", []any{"q7", session, 1000}},
		{"EndCancelled", "crdbwork_items_pkey", []any{id, session, int64(2)}},
		{"ReapCancelled", "crdbwork_items_cancel_requested", []any{"q7", 1000}},
		{"ListCancelled", "crdbwork_ended_cancelled", []any{"q7", 100, ""}},
		{"ListCancelled", "crdbwork_ended_cancelled", []any{"q7", 100, "refund"}},
		{"ListCancelledBefore", "crdbwork_ended_cancelled", []any{"q7", endedAt, id, 100, ""}},
		{"ItemEnded", "crdbwork_ended_pkey", []any{"q7", id}},
		{"Snooze", "crdbwork_items_pkey", []any{id, session, int64(1), int64(1e6), int64(100)}},
		{"Counts", "crdbwork_items_snoozed", []any{"q7"}},
		{"RequeueCancelled", "crdbwork_cancelled_items_pkey", []any{id, "q7"}},
		{"RequeueCancelledState", "crdbwork_cancelled_items_pkey", []any{id, "q7"}},
		{"ListKeptCancelled", "crdbwork_cancelled_items_by_age", []any{"q7", endedAt, id, 100, ""}},
		{"ListKeptCancelled", "crdbwork_cancelled_items_by_age", []any{"q7", endedAt, id, 100, "refund"}},
		{"PruneKeptCancelled", "crdbwork_cancelled_items_by_age", []any{"q7", 1000}},
	}
	pcs := make([]planCase, len(cases))
	covered := map[string]bool{}
	for i, c := range cases {
		if st[c.name] == "" {
			t.Fatalf("no cancel statement %q", c.name)
		}
		pcs[i] = planCase{c.name, st[c.name], c.args}
		covered[c.name] = true
	}
	for name := range st {
		if !covered[name] {
			t.Errorf("the cancel statement %s has no plan case", name)
		}
	}
	explainEach(t, pool, "cancel_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		switch {
		case strings.Contains(text, "Seq Scan") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan"):
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
		case testdb.Kind(t) == "postgres" && !strings.Contains(text, c.index):
			t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, c.index, text)
		case strings.HasPrefix(c.name, "ListCancelled") && strings.Contains(text, "crdbwork_cancelled_items_by_age"):
			t.Errorf("%s (%s) looks the kind up through crdbwork_cancelled_items_by_age (every kept row of the queue, for each row):\n%s", c.name, mode, text)
		case c.name == "Counts" && !strings.Contains(text, "crdbwork_items_cancel_requested"):
			t.Errorf("%s (%s) does not read crdbwork_items_cancel_requested:\n%s", c.name, mode, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}
