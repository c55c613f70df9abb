package sql_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func tables(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func TestApplyIsIdempotentAndVersioned(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Check on an empty database = %v, want ErrSchemaMissing", err)
	}
	for range 2 {
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatalf("Check after Apply: %v", err)
	}
	want := "crdbwork_attempt_errors crdbwork_audit crdbwork_cancelled_items crdbwork_dead_items crdbwork_ended crdbwork_items crdbwork_queues crdbwork_reaps crdbwork_schedules crdbwork_schema_version crdbwork_session_parts crdbwork_session_queues crdbwork_sessions crdbwork_tenant_limits crdbwork_waiting crdbwork_waits_across crdbwork_waits_for"
	if got := strings.Join(tables(t, pool, "public"), " "); got != want {
		t.Fatalf("tables = %s, want %s", got, want)
	}

	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schema_version SET version = 0, installed = 0`); err != nil {
		t.Fatal(err)
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaOutdated) {
		t.Fatalf("Check on version 0 = %v, want ErrSchemaOutdated", err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatalf("Check after upgrading: %v", err)
	}

	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaNewer) {
		t.Fatalf("Apply over version 99 = %v, want ErrSchemaNewer", err)
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaNewer) {
		t.Fatalf("Check on version 99 = %v, want ErrSchemaNewer", err)
	}
}

func TestApplyWithSchemaAndPrefix(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tb := crsql.Tables{Schema: "Work Queue", Prefix: "app_"}
	for range 2 {
		if err := crsql.Apply(ctx, pool, tb); err != nil {
			t.Fatal(err)
		}
	}
	want := "app_attempt_errors app_audit app_cancelled_items app_dead_items app_ended app_items app_queues app_reaps app_schedules app_schema_version app_session_parts app_session_queues app_sessions app_tenant_limits app_waiting app_waits_across app_waits_for"
	if got := strings.Join(tables(t, pool, "Work Queue"), " "); got != want {
		t.Fatalf("tables = %s, want %s", got, want)
	}
	if got := tables(t, pool, "public"); len(got) != 0 {
		t.Fatalf("tables leaked into public: %v", got)
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("default names should be missing: %v", err)
	}
	if tb.Table("items") != `"Work Queue"."app_items"` {
		t.Fatalf("Table(items) = %s", tb.Table("items"))
	}
	// Every statement is valid for the renamed tables.
	st := store.New(tb)
	if _, err := st.SessionsLive(ctx, pool); err != nil {
		t.Fatalf("live sessions: %v", err)
	}
	if _, err := st.SessionsReap(ctx, pool); err != nil {
		t.Fatalf("reap sessions: %v", err)
	}
}

func TestForeignKeysReleaseClaims(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s1, s2 := "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
	exec(`INSERT INTO crdbwork_sessions (id, expiry) VALUES ($1, INTERVAL '5 seconds'), ($2, INTERVAL '5 seconds')`, s1, s2)
	exec(`INSERT INTO crdbwork_queues (name, num_parts) VALUES ('q', 4)`)
	exec(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', 0), ($2, 'q', 1)`, s1, s2)
	// A second owner of part 0 is refused by the database.
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', 0)`, s2); err == nil {
		t.Fatal("two owners of one part were accepted")
	}
	exec(`INSERT INTO crdbwork_items (id, queue, part, payload, claim, claim_queue, claim_part)
	      VALUES (gen_random_uuid(), 'q', 0, '', $1, 'q', 0), (gen_random_uuid(), 'q', 1, '', $2, 'q', 1),
	             (gen_random_uuid(), 'q', 2, '', $2, NULL, NULL)`, s1, s2)
	// A claim in a part the session does not own is refused.
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload, claim, claim_queue, claim_part) VALUES (gen_random_uuid(), 'q', 1, '', $1, 'q', 1)`, s1); err == nil {
		t.Fatal("a claim in another session's part was accepted")
	}
	// Giving up a part releases the claims in it, and only those.
	exec(`DELETE FROM crdbwork_session_parts WHERE session_id = $1 AND part = 1`, s2)
	var claimed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if claimed != 2 {
		t.Fatalf("%d claimed items after releasing part 1, want 2", claimed)
	}
	// Deleting a session releases its claims and deletes its parts.
	exec(`DELETE FROM crdbwork_sessions WHERE id = $1`, s1)
	var parts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_session_parts`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	if claimed != 1 || parts != 0 {
		t.Fatalf("after deleting session 1: %d claimed items (want 1), %d part rows (want 0)", claimed, parts)
	}
	var items int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items`).Scan(&items); err != nil {
		t.Fatal(err)
	}
	if items != 3 {
		t.Fatalf("%d items, want 3: releasing claims must never delete items", items)
	}
}

// TestSchemaFileWithClient applies sql/schema.sql twice with the engine's own
// command-line client, exactly as the README and docs/schema.md tell operators to.
func TestSchemaFileWithClient(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	var name string
	var args []string
	switch testdb.Kind(t) {
	case "cockroach":
		name = os.Getenv("COCKROACH_BINARY")
		if name == "" {
			name = "cockroach"
		}
		args = []string{"sql", "--url", url, "--file", "schema.sql"}
	default:
		name = "psql"
		args = []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "schema.sql", url}
	}
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not found: %v", name, err)
	}
	for i := range 2 {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("applying schema.sql with %s (run %d): %v\n%s", name, i+1, err, out)
		}
		// A fresh install creates each thing once: no "already exists"
		// or "does not exist, skipping" notices (there were 26).
		if i == 0 && strings.Contains(strings.ToUpper(string(out)), "NOTICE") {
			t.Errorf("schema.sql on a fresh database printed notices:\n%s", out)
		}
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatalf("after the client applied schema.sql: %v", err)
	}
}

// catalog describes every crdbwork table of one schema as the database sees
// it: columns (type, default, nullability), indexes (with their predicates)
// and constraints, one line each, sorted.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	queries := []string{
		`SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' default ' || COALESCE(column_default, '-') || ' nullable ' || is_nullable
		 FROM information_schema.columns WHERE table_schema = $1`,
		`SELECT 'index ' || tablename || ' ' || indexdef FROM pg_indexes WHERE schemaname = $1`,
		`SELECT 'constraint ' || cl.relname || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
		 FROM pg_constraint AS c JOIN pg_class AS cl ON cl.oid = c.conrelid JOIN pg_namespace AS n ON n.oid = cl.relnamespace
		 WHERE n.nspname = $1`,
	}
	var db string
	if err := pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, q := range queries {
		rows, err := pool.Query(context.Background(), q, schema)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			out = append(out, withoutDatabase(l, db))
		}
	}
	sort.Strings(out)
	return out
}

// withoutDatabase removes the database's name from an index definition of
// pg_indexes: CockroachDB releases without cockroachdb/cockroach#167134
// (merged 2026-03-31) write "CREATE INDEX i ON db.public.t ...", where
// PostgreSQL writes "ON public.t"; the databases compared have different
// names. A foreign key's "REFERENCES db.t" in a constraint line loses it
// too, in case a release qualifies those the same way. Other lines are
// returned unchanged.
func withoutDatabase(line, db string) string {
	var prefix string
	switch {
	case strings.HasPrefix(line, "index "):
		prefix = " ON "
	case strings.HasPrefix(line, "constraint "):
		prefix = "REFERENCES "
	default:
		return line
	}
	for _, name := range []string{db, pgx.Identifier{db}.Sanitize()} {
		line = strings.ReplaceAll(line, prefix+name+".", prefix)
	}
	return line
}

// TestCatalogIgnoresDatabaseName: an index definition as CockroachDB
// releases without cockroachdb/cockroach#167134 write it compares equal to
// PostgreSQL's, whatever the database is called.
func TestCatalogIgnoresDatabaseName(t *testing.T) {
	t.Parallel()
	pg := "index crdbwork_items CREATE INDEX crdbwork_items_lease ON public.crdbwork_items USING btree (queue ASC, lease_until ASC) WHERE (claim IS NOT NULL)"
	for _, c := range []struct{ db, line string }{
		{"test_a_1", "index crdbwork_items CREATE INDEX crdbwork_items_lease ON test_a_1.public.crdbwork_items USING btree (queue ASC, lease_until ASC) WHERE (claim IS NOT NULL)"},
		{"Test B", `index crdbwork_items CREATE INDEX crdbwork_items_lease ON "Test B".public.crdbwork_items USING btree (queue ASC, lease_until ASC) WHERE (claim IS NOT NULL)`},
		{"test_c", pg},
	} {
		if got := withoutDatabase(c.line, c.db); got != pg {
			t.Errorf("database %q:\n%s\nnormalised to\n%s\nwant\n%s", c.db, c.line, got, pg)
		}
	}
	fk := "constraint crdbwork_items crdbwork_items_claim_session FOREIGN KEY (claim) REFERENCES crdbwork_sessions(id) ON DELETE SET NULL"
	if got := withoutDatabase("constraint crdbwork_items crdbwork_items_claim_session FOREIGN KEY (claim) REFERENCES test_a_1.crdbwork_sessions(id) ON DELETE SET NULL", "test_a_1"); got != fk {
		t.Errorf("a foreign key normalised to\n%s\nwant\n%s", got, fk)
	}
	// Other lines, and a column that happens to mention the name, stay.
	col := "column crdbwork_items.queue text default - nullable NO ON test_a_1.x"
	if got := withoutDatabase(col, "test_a_1"); got != col {
		t.Errorf("a column line changed: %s", got)
	}
}

// TestMigrationsMatchSchema builds a version-1 database from migration 1,
// upgrades it with Apply, and compares its catalog with a fresh install of
// schema.sql: the two must be identical, so that schema.sql and the
// migrations cannot drift apart. It does so with default names and with a
// schema and prefix (where DROP INDEX must name the schema's index).
func TestMigrationsMatchSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tb := range []crsql.Tables{{}, {Schema: "Work Queue", Prefix: "app_"}} {
		schema := tb.Schema
		if schema == "" {
			schema = "public"
		}
		fresh := testdb.New(t)
		if err := crsql.Apply(ctx, fresh, tb); err != nil {
			t.Fatal(err)
		}
		upgraded := testdb.New(t)
		if tb.Schema != "" {
			if _, err := upgraded.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{tb.Schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			// The same tables in public too: the upgrade of tb must not touch them.
			if err := crsql.Apply(ctx, upgraded, crsql.Tables{}); err != nil {
				t.Fatal(err)
			}
		}
		migs := crsql.Migrations()
		if len(migs) != crsql.Version || migs[0].Version != 1 {
			t.Fatalf("migrations %v: want 1..%d", migs, crsql.Version)
		}
		for _, s := range migs[0].Statements(tb) {
			if _, err := upgraded.Exec(ctx, s); err != nil {
				t.Fatalf("%v\n%s", err, s)
			}
		}
		var v int
		if err := upgraded.QueryRow(ctx, "SELECT version FROM "+tb.Table("schema_version")).Scan(&v); err != nil || v != 1 {
			t.Fatalf("after migration 1: version %d, %v", v, err)
		}
		publicBefore := catalog(t, upgraded, "public")
		for range 2 { // the second run finds it current and changes nothing
			if err := crsql.Apply(ctx, upgraded, tb); err != nil {
				t.Fatal(err)
			}
		}
		if err := crsql.Check(ctx, upgraded, tb); err != nil {
			t.Fatalf("Check after the upgrade: %v", err)
		}
		want, got := catalog(t, fresh, schema), catalog(t, upgraded, schema)
		if d := diff(want, got); d != "" {
			t.Fatalf("fresh schema.sql (-) and v1 upgraded by the migrations (+) differ in %q:\n%s", schema, d)
		}
		if tb.Schema != "" {
			if d := diff(publicBefore, catalog(t, upgraded, "public")); d != "" {
				t.Fatalf("upgrading %q changed the tables in public:\n%s", tb.Schema, d)
			}
		}
		if len(want) < 40 {
			t.Fatalf("the catalog has %d lines: the query is not reading it", len(want))
		}
	}
}

func diff(want, got []string) string {
	in := func(list []string) map[string]bool {
		m := map[string]bool{}
		for _, s := range list {
			m[s] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, s := range want {
		if !g[s] {
			b.WriteString("- " + s + "\n")
		}
	}
	for _, s := range got {
		if !w[s] {
			b.WriteString("+ " + s + "\n")
		}
	}
	return b.String()
}

// TestMigrationFilesWithClient applies migration 1 and then migration 2 with
// the engine's own client, twice each (idempotent), and checks the version.
func TestMigrationFilesWithClient(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	if testdb.Kind(t) != "postgres" {
		t.Skip("psql only; TestSchemaFileWithClient covers cockroach sql")
	}
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skipf("psql not found: %v", err)
	}
	for _, m := range crsql.Migrations() {
		for i := range 2 {
			out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "migrations/"+m.Name, url).CombinedOutput()
			if err != nil {
				t.Fatalf("applying %s with psql (run %d): %v\n%s", m.Name, i+1, err, out)
			}
		}
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatalf("after psql applied the migrations: %v", err)
	}
	// An older file applied again never lowers the version.
	out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "migrations/"+crsql.Migrations()[0].Name, url).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatalf("migration 1 applied again lowered the version: %v", err)
	}
}

// TestSchemaFileRefusesAnOlderSchema applies sql/schema.sql with psql to
// databases at each older version (built by the migrations up to it): the
// file must stop at its checks, before changing anything, since an older
// database is upgraded by the migrations.
func TestSchemaFileRefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("psql only")
	}
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skipf("psql not found: %v", err)
	}
	for v := 1; v < crsql.Version; v++ {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			t.Parallel()
			url := testdb.NewURL(t)
			for _, m := range crsql.Migrations()[:v] {
				out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "migrations/"+m.Name, url).CombinedOutput()
				if err != nil {
					t.Fatalf("applying %s with psql: %v\n%s", m.Name, err, out)
				}
			}
			pool, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			before := catalog(t, pool, "public")
			out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "schema.sql", url).CombinedOutput()
			if err == nil {
				t.Fatalf("schema.sql applied to a version-%d database succeeded:\n%s", v, out)
			}
			want := `column "installed" does not exist` // versions 1 to 3
			if v >= 4 {
				want = fmt.Sprintf("crdbwork: the database has an older crdbwork schema, version %d: upgrade it", v)
			}
			if !strings.Contains(string(out), want) {
				t.Errorf("schema.sql on a version-%d database failed, but not at its check (%q):\n%s", v, want, out)
			}
			if d := diff(before, catalog(t, pool, "public")); d != "" {
				t.Errorf("schema.sql changed a version-%d database it refused:\n%s", v, d)
			}
			if err := crsql.Check(context.Background(), pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaOutdated) {
				t.Errorf("Check after the refusal = %v, want ErrSchemaOutdated", err)
			}
		})
	}
}

// TestApplyWarnsOnlyForCockroachSettings: on PostgreSQL Apply never runs
// cockroach.sql, so it reports no warning.
func TestApplyWarnsOnlyForCockroachSettings(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var warnings []string
	err := crsql.ApplyWith(context.Background(), pool, crsql.Tables{}, crsql.ApplyOptions{Warn: func(m string) { warnings = append(warnings, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if testdb.Kind(t) == "postgres" && len(warnings) != 0 {
		t.Fatalf("warnings on PostgreSQL: %v", warnings)
	}
}

// Version-1 statements, as version-1 workers send them (from the v1 code).
const (
	v1Enqueue = `INSERT INTO crdbwork_items (id, queue, part, payload) SELECT gen_random_uuid(), 'q', 0, '\x00'::BYTEA FROM generate_series(1, $1::INT)`
	v1Claim   = `UPDATE crdbwork_items
SET claim = $1, claimed_at = now(), attempts = attempts + 1
WHERE id = ANY(ARRAY(
    SELECT id FROM crdbwork_items
    WHERE queue = $2 AND claim IS NULL AND vesting_at <= now()
    ORDER BY priority, vesting_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED))
  AND claim IS NULL
RETURNING id, attempts`
	v1Ack = `DELETE FROM crdbwork_items WHERE id = $1 AND claim IS NOT DISTINCT FROM $2::UUID AND attempts = $3`
)

// TestUpgradeWhileVersion1WorkersRun: a version-1 worker holds claims while
// the database is upgraded; its acks of those claims and its later claims
// and acks keep working on the new schema, and the lease reaper leaves its
// lease-less claims alone.
func TestUpgradeWhileVersion1WorkersRun(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	for _, s := range crsql.Migrations()[0].Statements(crsql.Tables{}) {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var session string
	if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id::TEXT`).Scan(&session); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, v1Enqueue, 10); err != nil {
		t.Fatal(err)
	}
	claim := func(n int) map[string]int64 {
		t.Helper()
		rows, err := pool.Query(ctx, v1Claim, session, "q", n)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for rows.Next() {
			var id string
			var attempts int64
			if err := rows.Scan(&id, &attempts); err != nil {
				t.Fatal(err)
			}
			got[id] = attempts
		}
		if rows.Err() != nil || len(got) != n {
			t.Fatalf("v1 claim: %d items, %v", len(got), rows.Err())
		}
		return got
	}
	ack := func(held map[string]int64) {
		t.Helper()
		for id, attempts := range held {
			tag, err := pool.Exec(ctx, v1Ack, id, session, attempts)
			if err != nil || tag.RowsAffected() != 1 {
				t.Fatalf("v1 ack: %v rows, %v", tag.RowsAffected(), err)
			}
		}
	}
	before := claim(3)
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	d := store.Postgres
	if testdb.Kind(t) == "cockroach" {
		d = store.Cockroach
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	released, err := store.New(crsql.Tables{}).ItemsReapLeases(ctx, tx, d, "q", 100)
	if err != nil || released != 0 {
		_ = tx.Rollback(ctx)
		t.Fatalf("the lease reaper released %d version-1 claims (%v), want 0", released, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ack(before)
	ack(claim(4))
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL`).Scan(&left); err != nil || left != 3 {
		t.Fatalf("%d unclaimed items left (%v), want 3", left, err)
	}
}
