package store_test

import (
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestFleetKindsPlanInALivedDatabase checks the plan of the items by kind
// (FleetKinds: crdbwork status --by-kind, and package metrics' gauges by
// kind, read at every scrape not served from the cache) in a database that
// has lived, after the burst of TestHotPlansInALivedDatabase: queue "q",
// 40k of the items table's 160k rows and 2k of its 22k dead items, which
// the statistics believe holds next to nothing. The read counts every row
// of the queue (no index holds the kind), but only the queue's: the plan
// for the arguments goes through its indexes (the unclaimed by turn, the
// claimed by lease, the dead by queue), never a sequential scan of the
// items or the dead items.
//
// The generic plan is logged, not checked: it takes a queue's share of
// each table to be one over the number of queues the statistics know (a
// quarter or more here), and for that share a sequential scan is as cheap
// as the index, as it is for a queue that does hold half of the table
// (TestExplainFleetStatements, "big"). PostgreSQL keeps the custom plan of
// a small queue, which costs a fraction of the generic one.
func TestFleetKindsPlanInALivedDatabase(t *testing.T) {
	t.Parallel()
	for _, state := range []string{"tiny", "empty"} {
		t.Run("q "+state+" when analyzed", func(t *testing.T) {
			t.Parallel()
			pool := livedBurst(t, livedOptions[state])
			st := store.FleetStatementsForTest(crsql.Tables{})
			cases := []planCase{{"FleetKinds", st["FleetKinds"], []any{"q", 21}}}
			indexes := []string{"crdbwork_items_part_turn|crdbwork_items_turn_next", "crdbwork_items_lease", "crdbwork_dead_items_by_queue"}
			explainEach(t, pool, "lived_kinds_", cases, nil, func(i int, mode, text string) {
				if mode == "generic" {
					t.Logf("FleetKinds (generic, not checked):\n%s", text)
					return
				}
				for _, table := range []string{"crdbwork_items", "crdbwork_dead_items"} {
					if strings.Contains(text, "Seq Scan on "+table+" ") || strings.Contains(text, "Seq Scan on "+table+"\n") ||
						strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan") {
						t.Errorf("FleetKinds (%s) scans %s:\n%s", mode, table, text)
					}
				}
				if testdb.Kind(t) == "postgres" {
					for _, ix := range indexes {
						if !containsAny(text, strings.Split(ix, "|")) {
							t.Errorf("FleetKinds (%s) does not read %s:\n%s", mode, ix, text)
						}
					}
				}
				t.Logf("FleetKinds (%s):\n%s", mode, text)
			})
		})
	}
}
