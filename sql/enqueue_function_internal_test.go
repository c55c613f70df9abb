package sql

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

// The CockroachDB form of the enqueue function is the PostgreSQL form
// without its lines marked "postgres only", from the CREATE on (the files'
// header comments differ); the PostgreSQL-only lines are the wake-up and
// the locking read, nothing else; and neither form uses what CockroachDB's
// PL/pgSQL refuses (its known limitations, 23.2 and later).
func TestCockroachEnqueueFunctionMatches(t *testing.T) {
	body := func(s string) string { return s[strings.Index(s, "CREATE OR REPLACE FUNCTION"):] }
	pg, crdb := EnqueueFunctionSQL(Postgres), EnqueueFunctionSQL(Cockroach)
	if got, want := body(crdb), cockroachForm(body(pg)); got != want {
		t.Fatalf("sql/cockroach_enqueue_function.sql is not sql/enqueue_function.sql without its %q lines", postgresOnly)
	}
	var only []string
	for _, line := range strings.Split(pg, "\n") {
		if strings.Contains(line, postgresOnly) {
			only = append(only, strings.TrimSpace(line))
		}
	}
	if len(only) != 4 || !strings.Contains(strings.Join(only, "\n"), "pg_notify") || !strings.Contains(strings.Join(only, "\n"), "FOR KEY SHARE") {
		t.Errorf("postgres-only lines: %q; want the wake-up (3 lines) and the locking read", only)
	}
	for _, refused := range []string{"PERFORM", "GET DIAGNOSTICS", "FOUND", " RECORD", "STRICT", "RETURN QUERY", "RETURN NEXT", "FOR v_", "pg_notify", "FOR KEY SHARE"} {
		if strings.Contains(body(crdb), refused) {
			t.Errorf("the CockroachDB form uses %q", refused)
		}
	}
	if strings.Count(body(pg), "BEGIN") != 1 || strings.Count(body(pg), "DECLARE") != 1 {
		t.Errorf("the function has nested blocks, which CockroachDB refuses")
	}
}

// The function is rendered for renamed tables: every crdbwork_ name
// renamed, the function qualified with the schema, and the wake-up's
// channel that of Store.NotifyChannel (its hash input's table part).
func TestEnqueueFunctionRenamed(t *testing.T) {
	tables := Tables{Schema: "it's", Prefix: "p_"}
	for _, d := range []Dialect{Postgres, Cockroach} {
		s, err := enqueueFunction(d, tables)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s, "crdbwork_items") || !strings.Contains(s, `FUNCTION "it's"."p_enqueue"(`) || !strings.Contains(s, `"it's"."p_items"`) {
			t.Errorf("%v: names not rewritten:\n%s", d, s)
		}
		if d == Postgres && !strings.Contains(s, `'4:it''s|2:p_|'`) {
			t.Errorf("the channel's tables are not rendered: %s", s)
		}
	}
	if _, err := enqueueFunction(Postgres, Tables{Prefix: "x$crdbwork$"}); err == nil {
		t.Error("a prefix holding the dollar quote's tag was accepted")
	}
}

// Applying the schema again leaves an unchanged enqueue function alone, so
// that processes applying it at once as they start do not fail each other
// (PostgreSQL refuses concurrent rewrites of one catalog row); a changed
// function is replaced.
func TestEnqueueFunctionAppliedOnce(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	tables := Tables{Prefix: "once_"}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	stmt, err := enqueueFunction(Postgres, tables)
	if err != nil {
		t.Fatal(err)
	}
	if body, ok := installedBody(ctx, pool, tables); !ok || body != functionBody(stmt) {
		t.Fatalf("installed body (%v) differs from the file's", ok)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Apply(ctx, pool, tables)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Apply: %v", err)
		}
	}
	// A changed function is replaced by the next Apply.
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION once_enqueue(queue TEXT, payload BYTEA, id UUID DEFAULT NULL, key TEXT DEFAULT NULL,
		priority BIGINT DEFAULT 0, delay INTERVAL DEFAULT NULL, run_at TIMESTAMPTZ DEFAULT NULL, max_attempts BIGINT DEFAULT NULL,
		tenant TEXT DEFAULT NULL, ttl INTERVAL DEFAULT NULL, metadata BYTEA DEFAULT NULL, headers JSONB DEFAULT NULL,
		at_most_once BOOL DEFAULT false, OUT item_id UUID, OUT added BOOL, OUT done BOOL)
		LANGUAGE plpgsql AS $$ BEGIN item_id := NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	if body, ok := installedBody(ctx, pool, tables); !ok || body != functionBody(stmt) {
		t.Fatal("Apply did not replace a changed function")
	}
}
