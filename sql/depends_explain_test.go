package sql_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestDependsPlans EXPLAINs every dependency statement, first on empty,
// never analyzed tables (the plans a fresh database caches), then on
// tables seeded with 100,000 items, 50,000 waiting items of 40 queues,
// 200,000 edges, 100,000 ended ids and 20,000 dead items, analyzed. No plan
// may read a whole table of items, waiting items, edges, ended ids or dead
// items: each statement's cost follows its arguments (the ids given, the
// limit), not the tables' sizes. Release runs in the ack's transaction of
// queues that use dependencies, so its plan matters as much as the ack's.
func TestDependsPlans(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	ds := crsql.NewDependsStatements(crsql.Tables{})
	some := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	arr := func(n int) []uuid.UUID {
		out := make([]uuid.UUID, n)
		for i := range out {
			out[i] = uuid.New()
		}
		return out
	}
	ids := arr(50)
	n := len(ids)
	texts, ints, bytes, bools, jsons := make([]string, n), make([]int64, n), make([][]byte, n), make([]bool, n), make([]string, n)
	for i := range bytes {
		bytes[i], texts[i], jsons[i] = []byte("x"), "k", `{"k": "v"}`
		ints[i] = 1
	}
	cases := []planCase{
		{"Classify", ds.Classify, []any{"q7", ids}},
		{"InsertWaiting", ds.InsertWaiting, []any{"q7", ids, ints, texts, ints, ints, ints, bytes, bytes, texts, ints, bools, ints, jsons, ints}},
		{"InsertEdges", ds.InsertEdges, []any{"q7", ids, arr(50)}},
		{"Release", ds.Release, []any{"q7", ids}},
		{"PostgresRelease", ds.PostgresRelease, []any{"q7", ids}},
		{"MoveReady", ds.MoveReady, []any{"q7", ids}},
		{"PostgresMoveReady", ds.PostgresMoveReady, []any{"q7", ids}},
		{"SweepPrereqs", ds.SweepPrereqs, []any{"q7", some[0], 1000}},
		{"KillDependents", ds.KillDependents, []any{"q7", some, []string{"dead", "cancelled", "unknown"}}},
		{"PostgresKillDependents", ds.PostgresKillDependents, []any{"q7", some, []string{"dead", "cancelled", "unknown"}}},
		{"DeleteEdgesFrom", ds.DeleteEdgesFrom, []any{"q7", ids}},
		{"DeleteEdgesTo", ds.DeleteEdgesTo, []any{"q7", ids}},
		{"Prereqs", ds.Prereqs, []any{"q7", some[0]}},
		{"Dependents", ds.Dependents, []any{"q7", some[0], 100}},
		{"Waiting", ds.Waiting, []any{"q7", some[0]}},
		// A waiting row the database refused to move (refused.go).
		{"KillRefusedWaiting", crsql.NewRefusedStatements(crsql.Tables{}).KillWaiting, []any{"q7", some[0], "refused by the database (dependencies): boom"}},
		{"WaitingCount", ds.WaitingCount, []any{"q7"}},
		{"HasEdges", ds.HasEdges, []any{"q7"}},
		{"WaitedFor", ds.WaitedFor, []any{"q7", ids}},
		{"PurgeEdges", ds.PurgeEdges, []any{"q7", 1000}},
		{"PickWaiting", ds.PickWaiting, []any{"q7", 1000}},
		{"CancelWaiting", ds.CancelWaiting, []any{some[0], "q7"}},
		{"DeleteWaiting", ds.DeleteWaiting, []any{"q7", ids}},
		{"PostgresDeleteWaiting", ds.PostgresDeleteWaiting, []any{"q7", ids}},
	}
	twinned := map[string]bool{"Release": true, "MoveReady": true, "KillDependents": true, "DeleteWaiting": true}
	scan := regexp.MustCompile(`Seq Scan on crdbwork_(items|waiting|waits_for|ended|dead_items)\b|FULL SCAN|full scan`)
	check := func(state string) {
		explainEach(t, pool, "deps_"+state+"_", cases, nil, func(i int, mode, plan string) {
			c := cases[i]
			if testdb.Kind(t) == "postgres" && twinned[c.name] {
				return // the CockroachDB form; its Postgres twin is PostgreSQL's
			}
			if scan.MatchString(plan) {
				t.Errorf("%s (%s, %s) scans a table:\n%s", c.name, state, mode, plan)
				return
			}
			if c.name != "WaitingCount" && c.name != "PickWaiting" && strings.Contains(plan, "crdbwork_waiting_by_queue") {
				t.Errorf("%s (%s, %s) reads the queue's waiting items:\n%s", c.name, state, mode, plan)
				return
			}
			if (strings.Contains(plan, "Hash Join") || strings.Contains(plan, "Hash Semi Join")) && strings.Contains(plan, "crdbwork_waiting") {
				t.Errorf("%s (%s, %s) hashes the waiting items:\n%s", c.name, state, mode, plan)
				return
			}
			t.Logf("%s (%s, %s):\n%s", c.name, state, mode, plan)
		})
	}
	check("empty")
	name := `'q' || (g % 40)::TEXT`
	seed := []string{
		`INSERT INTO crdbwork_items (id, queue, payload) SELECT gen_random_uuid(), ` + name + `, '\x00'::BYTEA FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining) SELECT gen_random_uuid(), ` + name + `, g, '\x00'::BYTEA, 4 FROM generate_series(1, 50000) AS g`,
		`INSERT INTO crdbwork_waits_for (queue, prereq, dependent) SELECT w.queue, gen_random_uuid(), w.id FROM crdbwork_waiting AS w, generate_series(1, 4)`,
		`INSERT INTO crdbwork_ended (queue, id, outcome) SELECT ` + name + `, gen_random_uuid(), 'acked' FROM generate_series(1, 100000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), ` + name + `, 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed' FROM generate_series(1, 20000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_waiting`, `ANALYZE crdbwork_waits_for`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	check("seeded")
}
