package store_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// burstDeps gives queue, in a database that has lived (internal/lived:
// other queues' items, ended ids, dead and waiting items and edges,
// analyzed before queue existed, then a third of them ended, unvacuumed),
// 100 fan-ins as the dependencies benchmark drains them: 100 roots (items), 98 children
// waiting for each root, a join waiting for each root's children; 5,000
// acked ids and 500 dead items. It returns the roots and the children.
func burstDeps(t *testing.T, pool *pgxpool.Pool, queue string) (roots, kids []uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{
		`INSERT INTO crdbwork_items (id, queue, payload) SELECT gen_random_uuid(), $1, '\x00'::BYTEA FROM generate_series(1, 100)`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining)
		 SELECT gen_random_uuid(), $1, r.n * 1000 + k, '\x00'::BYTEA, 1
		 FROM (SELECT row_number() OVER (ORDER BY id) AS n FROM crdbwork_items WHERE queue = $1) AS r, generate_series(1, 98) AS k`,
		`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
		 SELECT $1, r.id, w.id FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM crdbwork_items WHERE queue = $1) AS r
		 JOIN crdbwork_waiting AS w ON w.queue = $1 AND w.hash / 1000 = r.n`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining)
		 SELECT gen_random_uuid(), $1, 1000000 + r.n, '\x00'::BYTEA, 98 FROM (SELECT row_number() OVER (ORDER BY id) AS n FROM crdbwork_items WHERE queue = $1) AS r`,
		`INSERT INTO crdbwork_waits_for (queue, prereq, dependent)
		 SELECT $1, k.id, j.id FROM crdbwork_waiting AS k JOIN crdbwork_waiting AS j
		 ON j.queue = $1 AND k.queue = $1 AND j.hash = 1000000 + k.hash / 1000 AND k.hash < 1000000`,
		`INSERT INTO crdbwork_ended (queue, id, outcome) SELECT $1, gen_random_uuid(), 'acked' FROM generate_series(1, 5000)`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), $1, 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed' FROM generate_series(1, 500)`,
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s, queue); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	ids := func(q string) []uuid.UUID {
		rows, err := pool.Query(ctx, q, queue)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	return ids(`SELECT id FROM crdbwork_items WHERE queue = $1 ORDER BY id`),
		ids(`SELECT id FROM crdbwork_waiting WHERE queue = $1 AND hash < 1000000 ORDER BY id`)
}

// byQueue are the statements that read a queue's rows by the queue, by
// design.
var byQueue = map[string]bool{"WaitingCount": true, "PickWaiting": true, "HasEdges": true, "PickOrphans": true}

// livedDependsAccepted are plans that read more than a seek would, and why
// that is right, by statement and mode.
var livedDependsAccepted = map[string]string{
	// The count of a queue's waiting items (crdbwork status) reads them all
	// whichever way; its generic plan takes the queue for the average of
	// the few queues with waiting items, most of the table.
	"WaitingCount (generic)": "a count of the queue's waiting items; the generic plan believes they are most of the table",
}

// queueOnly matches an index condition on the queue alone: a read of all
// of a queue's rows in that index.
var queueOnly = regexp.MustCompile(`Index Cond: \(queue = [^()]*\)\s*$`)

// removed matches the rows a plan node read and threw away.
var removed = regexp.MustCompile(`Rows Removed by (?:Join )?Filter: (\d+)`)

// TestDependsPlansLived runs every dependency statement, EXPLAIN ANALYZE in
// a transaction rolled back, on a database that has lived (internal/lived)
// after a burst of 100 fan-ins on a queue the statistics never saw, with
// the plan for the arguments and (PostgreSQL) the generic plan. No plan may
// scan a table, read a queue's rows through an index by the queue alone
// (where the statistics believe the queue holds a row), or throw away more
// rows than its arguments can explain: the 14-second release of issue 29
// read the queue's 16,000 edges to find 3,332 and joined 9,802 waiting
// rows to each of them (32 million rows thrown away).
func TestDependsPlansLived(t *testing.T) {
	t.Parallel()
	pool := testdb.NewLived(t, applySchema, lived.Options{})
	ctx := context.Background()
	postgres := testdb.Kind(t) == "postgres"
	const q = "burst"
	roots, kids := burstDeps(t, pool, q)
	d := store.Cockroach
	if postgres {
		d = store.Postgres
	}
	cases := dependsCases(t, pool, d, q, roots[:36], kids[:1000])
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	modes := []string{"custom"}
	if postgres {
		modes = append(modes, "generic")
	}
	for _, mode := range modes {
		for i, c := range cases {
			plan := explainAnalyze(t, conn.Conn(), mode, fmt.Sprintf("lived_%s_%d", mode, i), c)
			if why, ok := livedDependsAccepted[c.name+" ("+mode+")"]; ok {
				t.Logf("accepted (%s): %s (%s):\n%s", why, c.name, mode, plan)
				continue
			}
			switch {
			case regexp.MustCompile(`Seq Scan on crdbwork_(items|waiting|waits_for|ended|dead_items)\b|FULL SCAN|full scan`).MatchString(plan):
				t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, plan)
				continue
			case !byQueue[c.name] && queueOnlyIn(plan):
				t.Errorf("%s (%s) reads the queue's rows through an index by the queue alone:\n%s", c.name, mode, plan)
				continue
			case postgres && (hashesTable(plan, "crdbwork_waiting") || hashesTable(plan, "crdbwork_waits_for")):
				t.Errorf("%s (%s) hashes a table it should look up by key:\n%s", c.name, mode, plan)
				continue
			}
			if n := maxRemoved(plan); n > 2000 && !byQueue[c.name] {
				t.Errorf("%s (%s) threw away %d rows:\n%s", c.name, mode, n, plan)
				continue
			}
			t.Logf("%s (%s):\n%s", c.name, mode, plan)
		}
	}
}

func queueOnlyIn(plan string) bool {
	for _, line := range strings.Split(plan, "\n") {
		if queueOnly.MatchString(line) {
			return true
		}
	}
	return false
}

func maxRemoved(plan string) int {
	most := 0
	for _, m := range removed.FindAllStringSubmatch(plan, -1) {
		if n, _ := strconv.Atoi(m[1]); n > most {
			most = n
		}
	}
	return most
}

// explainAnalyze runs c under EXPLAIN (ANALYZE, BUFFERS) in a transaction
// it rolls back, with its plan for the arguments ("custom") or, on
// PostgreSQL, the generic plan of a prepared statement ("generic").
func explainAnalyze(t *testing.T, conn *pgx.Conn, mode, name string, c planCase) string {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	query, args := "EXPLAIN (ANALYZE, BUFFERS) "+c.stmt, c.args
	if testdb.Kind(t) != "postgres" {
		query = "EXPLAIN ANALYZE " + c.stmt
	}
	if mode == "generic" {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+c.stmt); err != nil {
			t.Fatalf("%s: PREPARE: %v", c.name, err)
		}
		query, args = "EXPLAIN (ANALYZE, BUFFERS) EXECUTE "+name, nil
		if len(c.args) > 0 {
			query += "(" + literals(c.args) + ")"
		}
	}
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		t.Fatalf("%s (%s): EXPLAIN: %v", c.name, mode, err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s (%s): EXPLAIN: %v", c.name, mode, err)
	}
	return strings.Join(plan, "\n")
}
