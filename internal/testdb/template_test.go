package testdb

import (
	"context"
	"fmt"
	"os"
	"strings"
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
