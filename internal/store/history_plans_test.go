package store_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainHistoryStatements checks the plans of the item list
// (claim.Queue.Items with a State) on the operator statements' state
// (dashboardSeed: "big" holds half of 100k items, 200k deaths, 100k ended
// records and 20k waiting items): each page, first or later, with and
// without a key or tenant filter, reads the index of its state's order on
// the queue, never a whole table.
func TestExplainHistoryStatements(t *testing.T) {
	t.Parallel()
	pool := dashboardSeed(t)
	st := store.HistoryStatementsForTest(crsql.Tables{})
	now := time.Now()
	id, death := uuid.New(), uuid.New()
	start := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	end := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name, stmt string
		index      string
		args       []any
	}{
		{"ListUnclaimed", "ListUnclaimed", "crdbwork_items_turn_next", []any{"big", "", "", int64(math.MinInt64), start, int64(math.MinInt64), uuid.Nil, 101, ""}},
		{"ListUnclaimed (after, key)", "ListUnclaimed", "crdbwork_items_turn_next", []any{"big", "key-4", "", int64(0), now, int64(3), id, 101, ""}},
		{"ListUnclaimed (kind)", "ListUnclaimed", "crdbwork_items_turn_next", []any{"big", "", "", int64(math.MinInt64), start, int64(math.MinInt64), uuid.Nil, 101, "email"}},
		{"ListUnclaimed (tenant)", "ListUnclaimed", "crdbwork_items_turn_next|crdbwork_items_tenant_turn", []any{"big", "", "tenant-6", int64(math.MinInt64), start, int64(math.MinInt64), uuid.Nil, 101, ""}},
		{"ListClaimed", "ListClaimed", "crdbwork_items_lease", []any{"big", "", "", start, uuid.Nil, 101, ""}},
		{"ListClaimed (after)", "ListClaimed", "crdbwork_items_lease", []any{"big", "", "", now, id, 101, ""}},
		{"ListWaiting", "ListWaiting", "crdbwork_waiting_by_queue", []any{"big", "", "", start, uuid.Nil, 101, ""}},
		{"ListWaiting (after)", "ListWaiting", "crdbwork_waiting_by_queue", []any{"big", "", "", now.Add(-time.Second), id, 101, ""}},
		{"ListDead", "ListDead", "crdbwork_dead_items_by_queue", []any{"big", "", "", end, uuid.Max, uuid.Max, 101, ""}},
		{"ListDead (after, tenant)", "ListDead", "crdbwork_dead_items_by_queue", []any{"big", "", "tenant-6", now.Add(-time.Hour), id, death, 101, ""}},
		{"ListEnded", "ListEnded", "crdbwork_ended_by_age", []any{"big", []string{"acked", "taken"}, end, uuid.Max, 101, ""}},
		{"ListEnded (after)", "ListEnded", "crdbwork_ended_by_age", []any{"big", []string{"acked", "taken"}, now.Add(-time.Hour), id, 101, ""}},
		{"ListEnded (kind)", "ListEnded", "crdbwork_ended_by_age", []any{"big", []string{"acked", "taken"}, end, uuid.Max, 101, "email"}},
		{"ListCancelled", "ListCancelled", "crdbwork_ended_cancelled", []any{"big", end, uuid.Max, 101, ""}},
		{"ListCancelled (kind)", "ListCancelled", "crdbwork_ended_cancelled", []any{"big", end, uuid.Max, 101, "email"}},
	}
	pcs := make([]planCase, len(cases))
	covered := map[string]bool{}
	for i, c := range cases {
		if st[c.stmt] == "" {
			t.Fatalf("no history statement %q", c.stmt)
		}
		pcs[i] = planCase{c.name, st[c.stmt], c.args}
		covered[c.stmt] = true
	}
	for name := range st {
		if !covered[name] {
			t.Errorf("the history statement %s has no plan case", name)
		}
	}
	explainEach(t, pool, "history_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		if strings.Contains(text, "Seq Scan on crdbwork_") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan") {
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
			return
		}
		if testdb.Kind(t) == "postgres" && !containsAny(text, strings.Split(c.index, "|")) {
			t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, c.index, text)
		}
		t.Logf("%s (%s):\n%s", c.name, mode, text)
	})
}
