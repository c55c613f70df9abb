package testdb

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/dbserver"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func applySchema(ctx context.Context, pool *pgxpool.Pool) error {
	return crsql.Apply(ctx, pool, crsql.Tables{})
}

// A template's copies are databases of their own, each starting as the
// build left the template; spare copies are made ahead, and the tests take
// them.
func TestTemplateCopiesAndSpares(t *testing.T) {
	t.Parallel()
	if Kind(t) == dbserver.Cockroach {
		t.Skip("CockroachDB has no template databases: each test's database is built (see NewFromTemplate)")
	}
	const key = "template test"
	builds := 0
	build := func(ctx context.Context, pool *pgxpool.Pool) error {
		builds++
		_, err := pool.Exec(ctx, `CREATE TABLE seeded (v INT); INSERT INTO seeded VALUES (1), (2)`)
		return err
	}
	var names []string
	for i := range 5 {
		pool := NewFromTemplate(t, key, build)
		ctx := ctxFor(t)
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM seeded`).Scan(&n); err != nil || n != 2 {
			t.Fatalf("copy %d holds %d rows (err %v), want the template's 2 (the earlier copies' rows are theirs)", i, n, err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO seeded VALUES (3)`); err != nil {
			t.Fatal(err)
		}
		names = append(names, currentDatabase(t, pool))
	}
	if builds != 1 {
		t.Fatalf("the template was built %d times, want once", builds)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Fatalf("database %s handed out twice: %v", n, names)
		}
		seen[n] = true
	}
	templatesMu.Lock()
	tpl := templates[key]
	templatesMu.Unlock()
	await.Until(t, "the spare copies to be made", func() (bool, string) {
		tpl.mu.Lock()
		defer tpl.mu.Unlock()
		return len(tpl.spares) == spareCopies, fmt.Sprintf("%d spares after %d copies taken", len(tpl.spares), tpl.taken)
	})
}

// A series of steps: each step's template is a copy of the step before,
// changed by its Build, built once per series of keys; a test's copy starts
// as the last step left its template, statistics included; series that
// share their first steps share those steps' templates.
func TestStepsBuildOnEachOther(t *testing.T) {
	t.Parallel()
	builds := map[string]int{}
	var mu sync.Mutex
	step := func(key, stmt string) Step {
		return Step{Key: key, Build: func(ctx context.Context, pool *pgxpool.Pool) error {
			mu.Lock()
			builds[key]++
			mu.Unlock()
			_, err := pool.Exec(ctx, stmt)
			return err
		}}
	}
	create := step("steps test: table", `CREATE TABLE seeded (v INT) WITH (autovacuum_enabled = false)`) // no ANALYZE but the steps'
	fill := step("fill", `INSERT INTO seeded SELECT g FROM generate_series(1, 1000) AS g; ANALYZE seeded`)
	grow := step("grow", `INSERT INTO seeded SELECT g FROM generate_series(1001, 3000) AS g`)
	for i := range 2 {
		ctx := ctxFor(t)
		var rows int
		var reltuples float64
		count := func(pool *pgxpool.Pool) {
			t.Helper()
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM seeded), (SELECT reltuples FROM pg_class WHERE relname = 'seeded')`).Scan(&rows, &reltuples); err != nil {
				t.Fatal(err)
			}
		}
		count(NewFromSteps(t, create))
		if rows != 0 {
			t.Errorf("copy %d of the first step holds %d rows, want 0", i, rows)
		}
		count(NewFromSteps(t, create, fill))
		if rows != 1000 || (Kind(t) != dbserver.Cockroach && reltuples != 1000) {
			t.Errorf("copy %d of the second step holds %d rows, statistics of %.0f; want 1000 and 1000", i, rows, reltuples)
		}
		pool := NewFromSteps(t, create, fill, grow)
		count(pool)
		if rows != 3000 || (Kind(t) != dbserver.Cockroach && reltuples != 1000) {
			t.Errorf("copy %d of the third step holds %d rows, statistics of %.0f; want 3000 and the second step's 1000", i, rows, reltuples)
		}
		if _, err := pool.Exec(ctx, `DELETE FROM seeded`); err != nil { // a copy's changes are its own
			t.Fatal(err)
		}
	}
	if Kind(t) == dbserver.Cockroach {
		return // each test's database is built: no template
	}
	for key, n := range builds {
		if n != 1 {
			t.Errorf("step %q built %d times, want once", key, n)
		}
	}
}

// What a test's database with the crdbwork schema costs, created and
// dropped: an empty database with the schema applied (each test's database
// before templates: BenchmarkDatabaseWithSchema/apply), a copy of the
// template made for the test (/copy), and a spare copy taken (/spare: what
// NewFromTemplate costs a test while the spares keep up).
//
//	go test -run '^$' -bench DatabaseWithSchema -benchtime 10x ./internal/testdb/
func BenchmarkDatabaseWithSchema(b *testing.B) {
	if Kind(b) == dbserver.Cockroach {
		b.Skip("no template databases on CockroachDB")
	}
	const key = "benchmark"
	NewFromTemplate(b, key, applySchema) // the template, built once
	templatesMu.Lock()
	tpl := templates[key]
	templatesMu.Unlock()
	e := mustSetup(b)
	b.Run("apply", func(b *testing.B) {
		for range b.N {
			name, u, err := e.create()
			if err != nil {
				b.Fatal(err)
			}
			pool, err := pgxpool.New(context.Background(), u)
			if err != nil {
				b.Fatal(err)
			}
			err = applySchema(context.Background(), pool)
			pool.Close()
			if err != nil {
				b.Fatal(err)
			}
			if err := e.drop(name); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy", func(b *testing.B) {
		for range b.N {
			name, err := e.copyOf(tpl.name)
			if err != nil {
				b.Fatal(err)
			}
			if err := e.drop(name); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("spare", func(b *testing.B) {
		for range 2 { // spares are made once a template was taken twice
			name, err := tpl.take(e)
			if err != nil {
				b.Fatal(err)
			}
			e.dropLater(name)
		}
		b.ResetTimer()
		for range b.N {
			b.StopTimer()
			tpl.refill(e)
			await.Until(b, "a spare copy", func() bool {
				tpl.mu.Lock()
				defer tpl.mu.Unlock()
				return len(tpl.spares) > 0
			})
			b.StartTimer()
			name, err := tpl.take(e)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			e.dropLater(name)
		}
	})
	load, _ := loadAvgForLog()
	b.Logf("load average %s", load)
}

// loadAvgForLog returns the machine's load averages, for logs.
func loadAvgForLog() (string, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown", false
	}
	return strings.Join(strings.Fields(string(b))[:3], " "), true
}
