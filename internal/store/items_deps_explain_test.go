package store_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestDependsPlans EXPLAINs every dependency statement, first on empty,
// never analyzed tables (the plans a fresh database caches), then on
// tables seeded with 100,000 items, 50,000 waiting items of 40 queues,
// 200,000 edges, 100,000 ended ids and 20,000 dead items, analyzed. No plan
// may read a whole table of items, waiting items, edges, ended ids or dead
// items: each statement's cost follows its arguments (the ids given, the
// limit), not the tables' sizes. Release runs after every ack of queues
// that use dependencies, so its plan matters as much as the ack's. The
// statements are those of the server's engine (the PostgreSQL forms here);
// TestDependsPlansLived runs them all in a database that has lived.
func TestDependsPlans(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	d := store.Cockroach
	if testdb.Kind(t) == "postgres" {
		d = store.Postgres
	}
	arr := func(n int) []uuid.UUID {
		out := make([]uuid.UUID, n)
		for i := range out {
			out[i] = uuid.New()
		}
		return out
	}
	cases := dependsCases(t, pool, d, "q7", arr(36), arr(50))
	scan := regexp.MustCompile(`Seq Scan on crdbwork_(items|waiting|waits_for|ended|dead_items)\b|FULL SCAN|full scan`)
	check := func(state string) {
		explainEach(t, pool, "deps_"+state+"_", cases, nil, func(i int, mode, plan string) {
			c := cases[i]
			if scan.MatchString(plan) {
				t.Errorf("%s (%s, %s) scans a table:\n%s", c.name, state, mode, plan)
				return
			}
			if !byQueue[c.name] && queueOnlyIn(plan) {
				t.Errorf("%s (%s, %s) reads the queue's rows through an index by the queue alone:\n%s", c.name, state, mode, plan)
				return
			}
			if c.name != "WaitingCount" && c.name != "PickWaiting" && c.name != "PickOrphans" && strings.Contains(plan, "crdbwork_waiting_by_queue") {
				t.Errorf("%s (%s, %s) reads the queue's waiting items:\n%s", c.name, state, mode, plan)
				return
			}
			if hashesTable(plan, "crdbwork_waiting") {
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

// dependsCases are the dependency statements of engine d with arguments
// for queue: prereqs as the prerequisites (their edges, read from the
// table, or made up where they have none, as the edges' pairs), ids as
// the ids looked up.
func dependsCases(t *testing.T, pool *pgxpool.Pool, d store.Dialect, queue string, prereqs, ids []uuid.UUID) []planCase {
	t.Helper()
	ctx := context.Background()
	ds := store.NewDependsStatements(crsql.Tables{}, d)
	xs := store.NewAcrossStatements(crsql.Tables{}, d)
	rows, err := pool.Query(ctx, `SELECT prereq, dependent FROM crdbwork_waits_for WHERE queue = $1 AND prereq = ANY($2) ORDER BY 1, 2 LIMIT 1000`, queue, prereqs)
	if err != nil {
		t.Fatal(err)
	}
	var ps, deps []uuid.UUID
	for rows.Next() {
		var p, dep uuid.UUID
		if err := rows.Scan(&p, &dep); err != nil {
			t.Fatal(err)
		}
		ps, deps = append(ps, p), append(deps, dep)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ps) == 0 {
		for i, id := range ids {
			ps, deps = append(ps, prereqs[i%len(prereqs)]), append(deps, id)
		}
	}
	n := len(ids)
	texts, ints, bytes, bools, jsons := make([]string, n), make([]int64, n), make([][]byte, n), make([]bool, n), make([]string, n)
	for i := range bytes {
		bytes[i], texts[i], jsons[i] = []byte("x"), "k", `{"k": "v"}`
		ints[i] = 1
	}
	some := prereqs[:3]
	outcomes := []string{"dead", "cancelled", "unknown"}
	return []planCase{
		{"Classify", ds.Classify, []any{queue, ids}},
		{"InsertWaiting", ds.InsertWaiting, []any{queue, ids, ints, texts, ints, ints, ints, bytes, bytes, texts, ints, bools, ints, jsons, ints, ints, ints, texts}},
		{"InsertWaitingUnique", ds.InsertWaitingUnique, []any{queue, ids, ints, texts, ints, ints, ints, bytes, bytes, texts, ints, bools, ints, jsons, ints, ints, ints, texts, ints}},
		{"InsertEdges", ds.InsertEdges, []any{queue, ids, ids}},
		{"EdgesFrom", ds.EdgesFrom, []any{queue, prereqs, 1000}},
		{"Release", ds.Release, []any{queue, ps, deps}},
		{"SweepRelease", ds.SweepRelease, []any{queue, ps, deps}},
		{"ReleaseAnyway", ds.ReleaseAnyway, []any{queue, ps, deps, int64(1)}},
		{"MoveReady", ds.MoveReady, []any{queue, deps}},
		{"SweepPrereqs", ds.SweepPrereqs, []any{queue, some[0], 1000}},
		{"KillDependents", ds.KillDependents, []any{queue, ps, deps, prereqs, repeat(outcomes, len(prereqs)), int64(1)}},
		{"DeleteEdgesTo", ds.DeleteEdgesTo, []any{queue, deps}},
		{"DeleteEdgesGone", ds.DeleteEdgesGone, []any{queue, ps, deps}},
		{"Prereqs", ds.Prereqs, []any{queue, deps[0]}},
		{"Dependents", ds.Dependents, []any{queue, some[0], 100}},
		{"Waiting", ds.Waiting, []any{queue, deps[0]}},
		// A waiting row the database refused to move (items_refused.go).
		{"KillRefusedWaiting", store.NewRefusedStatements(crsql.Tables{}).KillWaiting, []any{queue, deps[0], "refused by the database (dependencies): boom"}},
		{"WaitingCount", ds.WaitingCount, []any{queue}},
		{"HasEdges", ds.HasEdges, []any{queue}},
		{"WaitedFor", ds.WaitedFor, []any{queue, ids}},
		{"PickWaiting", ds.PickWaiting, []any{queue, 1000}},
		{"PurgeWaiting", ds.PurgeWaiting, []any{queue, deps}},
		{"PickOrphans", ds.PickOrphans, []any{queue, 1000}},
		{"CancelWaiting", ds.CancelWaiting, []any{deps[0], queue}},
		// Edges from items of other queues (items_deps_across.go): the
		// release after an ack locks the dependents and deletes the hints
		// of crdbwork_waits_for by key; the sweep walks them by dependent.
		{"AcrossInsert", xs.Insert, []any{queue, texts, ps, deps}},
		{"AcrossFrom", xs.From, []any{queue, prereqs, 1000}},
		{"AcrossInto", xs.Into, []any{queue, some[0], 1000}},
		{"AcrossRelease", xs.Release, []any{queue, ps, deps, "other"}},
		{"AcrossSweepRelease", xs.SweepRelease, []any{queue, ps, deps, "other"}},
		{"AcrossReleaseAnyway", xs.ReleaseAnyway, []any{queue, ps, deps, "other", int64(1)}},
		{"AcrossDeleteTo", xs.DeleteTo, []any{queue, deps}},
		{"AcrossDeleteGone", xs.DeleteGone, []any{queue, ps, deps}},
		{"AcrossPrereqs", xs.Prereqs, []any{queue, deps[0]}},
		{"AcrossDependents", xs.Dependents, []any{queue, some[0], 100}},
	}
}

// repeat returns n elements of vals, round and round.
func repeat(vals []string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = vals[i%len(vals)]
	}
	return out
}

// hashesTable reports whether a hash join of plan (PostgreSQL's EXPLAIN
// text) reads table: a hash over a read of the table, where each row
// should be looked up by key.
func hashesTable(plan, table string) bool {
	lines := strings.Split(plan, "\n")
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ->")) }
	for i, l := range lines {
		if !strings.Contains(l, "Hash Join") && !strings.Contains(l, "Hash Semi Join") && !strings.Contains(l, "Hash Anti Join") {
			continue
		}
		for _, sub := range lines[i+1:] {
			if indent(sub) <= indent(l) {
				break
			}
			if strings.Contains(sub, " on "+table+" ") || strings.Contains(sub, " using "+table+"_") {
				return true
			}
		}
	}
	return false
}
