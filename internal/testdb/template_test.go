package testdb

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

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

// What a test's database with the crdbwork schema costs: an empty
// database with the schema applied (each test's database, before
// templates), a copy of the template made for the test, and a spare copy
// taken (logged, not asserted: speed is measured, never asserted in tests).
func TestCostOfADatabaseWithTheSchema(t *testing.T) {
	if Kind(t) == dbserver.Cockroach {
		t.Skip("no template databases on CockroachDB")
	}
	const key, n = "cost", 5
	for range 2 { // the template, built once; then the spares are wanted
		t.Run("build", func(t *testing.T) { NewFromTemplate(t, key, applySchema) })
	}
	templatesMu.Lock()
	tpl := templates[key]
	templatesMu.Unlock()
	e := mustSetup(t)
	var applied, copied, spare time.Duration
	for range n {
		start := time.Now()
		t.Run("apply", func(t *testing.T) {
			if err := applySchema(context.Background(), New(t)); err != nil {
				t.Fatal(err)
			}
		})
		applied += time.Since(start)
		start = time.Now()
		name, err := e.copyOf(tpl.name)
		if err != nil {
			t.Fatal(err)
		}
		copied += time.Since(start)
		if err := e.drop(name); err != nil {
			t.Fatal(err)
		}
		await.Until(t, "a spare copy", func() bool {
			tpl.mu.Lock()
			defer tpl.mu.Unlock()
			return len(tpl.spares) > 0
		})
		start = time.Now()
		t.Run("spare", func(t *testing.T) { NewFromTemplate(t, key, applySchema) })
		spare += time.Since(start)
	}
	load, _ := loadAvgForLog()
	t.Logf("a test's database with the schema, created and dropped (mean of %d, load %s): schema applied %v, template copied %v, spare taken %v",
		n, load, applied/n, copied/n, spare/n)
}

// loadAvgForLog returns the machine's load averages, for logs.
func loadAvgForLog() (string, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown", false
	}
	return strings.Join(strings.Fields(string(b))[:3], " "), true
}
