package sql

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
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
	t.Parallel()
	body := func(s string) string { return s[strings.Index(s, "CREATE OR REPLACE FUNCTION"):] }
	pg, crdb := EnqueueFunctionSQL(), CockroachEnqueueFunctionSQL()
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
// channel that of internal/store.Store.NotifyChannel (its hash input's table part).
func TestEnqueueFunctionRenamed(t *testing.T) {
	t.Parallel()
	tables := Tables{Schema: "it's", Prefix: "p_"}
	for _, d := range []bool{false, true} { // d: CockroachDB
		s, err := enqueueFunction(d, tables)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s, "crdbwork_items") || !strings.Contains(s, `FUNCTION "it's"."p_enqueue"(`) || !strings.Contains(s, `"it's"."p_items"`) {
			t.Errorf("cockroach %v: names not rewritten:\n%s", d, s)
		}
		if !d && !strings.Contains(s, `'4:it''s|2:p_|'`) {
			t.Errorf("the channel's tables are not rendered: %s", s)
		}
	}
	if _, err := enqueueFunction(false, Tables{Prefix: "x$crdbwork$"}); err == nil {
		t.Error("a prefix holding the dollar quote's tag was accepted")
	}
}

// Applying the schema again leaves an unchanged enqueue function alone, so
// that processes applying it at once as they start do not fail each other
// (PostgreSQL refuses concurrent rewrites of one catalog row); a changed
// function is replaced.
func TestEnqueueFunctionAppliedOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tables := Tables{Prefix: "once_"}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	stmt, err := enqueueFunction(false, tables)
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

// functionRow reads the catalog row of t's enqueue function: its oid, its
// xmin (the transaction that last wrote the row: CREATE OR REPLACE writes
// a new one even for the same text) and its body. PostgreSQL's catalog.
func functionRow(t *testing.T, db DB, tables Tables) (oid int64, xmin, body string) {
	t.Helper()
	err := db.QueryRow(context.Background(), `SELECT p.oid::BIGINT, p.xmin::TEXT, p.prosrc FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE p.proname = $1 AND n.nspname = COALESCE(NULLIF($2, ''), current_schema())`, tables.prefix()+"enqueue", tables.Schema).Scan(&oid, &xmin, &body)
	if err != nil {
		t.Fatal(err)
	}
	return oid, xmin, body
}

// reformatted returns the statement stmt creating the function with its
// body as CockroachDB stores one (pkg/sql/opt/optbuilder/create_function.go
// formats the parsed body): the comments gone, the white space changed, the
// table references qualified with the schema. The revision marker is kept,
// as a string constant is.
func reformatted(stmt string, tables Tables) string {
	const tag = "$crdbwork$"
	i, j := strings.Index(stmt, tag)+len(tag), strings.LastIndex(stmt, tag)
	var lines []string
	for _, line := range strings.Split(stmt[i:j], "\n") {
		if k := strings.Index(line, "--"); k >= 0 {
			line = line[:k]
		}
		lines = append(lines, strings.Fields(line)...)
	}
	body := strings.ReplaceAll(strings.Join(lines, " "), `"`+tables.prefix(), `public."`+tables.prefix())
	return stmt[:i] + "\n" + body + "\n" + stmt[j:]
}

// With its body stored otherwise than the file has it (as CockroachDB
// stores every body) but of the same revision, the installed function is
// left alone by the next Apply: the catalog row is not rewritten. Before
// the revision marker, Apply compared the bodies and replaced the
// function at every start on CockroachDB. PostgreSQL only: it checks the
// row's xmin.
func TestEnqueueFunctionKeptWhenStoredReformatted(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("reads the function's xmin, PostgreSQL's; CockroachDB reformats the body by itself")
	}
	pool := testdb.New(t)
	ctx := context.Background()
	tables := Tables{Prefix: "fmt_"}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	stmt, err := enqueueFunction(false, tables)
	if err != nil {
		t.Fatal(err)
	}
	oid, xmin, body := functionRow(t, pool, tables)
	if body != functionBody(stmt) || bodyRevision(body) != EnqueueFunctionRevision() || EnqueueFunctionRevision() < 1 {
		t.Fatalf("installed revision %d (body as the file's: %v), the files' %d", bodyRevision(body), body == functionBody(stmt), EnqueueFunctionRevision())
	}
	// Applied again, unchanged: the same row.
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	if o, x, _ := functionRow(t, pool, tables); o != oid || x != xmin {
		t.Fatalf("the second Apply rewrote the function (oid %d→%d, xmin %s→%s)", oid, o, xmin, x)
	}
	// Stored reformatted: still the same revision, so left alone.
	if _, err := pool.Exec(ctx, reformatted(stmt, tables)); err != nil {
		t.Fatal(err)
	}
	oid, xmin, stored := functionRow(t, pool, tables)
	if stored == functionBody(stmt) || bodyRevision(stored) != EnqueueFunctionRevision() {
		t.Fatalf("the reformatted body is the file's, or lost its revision:\n%s", stored)
	}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	if o, x, b := functionRow(t, pool, tables); o != oid || x != xmin || b != stored {
		t.Fatalf("Apply replaced a function of its own revision stored reformatted (oid %d→%d, xmin %s→%s, body kept: %v)", oid, o, xmin, x, b == stored)
	}
}

// A function of an older revision (or without a marker, as versions
// before the marker installed it) is replaced by Apply; one of a newer
// revision is left alone, so that old and new code applying the schema in
// a rolling upgrade do not take turns replacing it.
func TestEnqueueFunctionRevisionUpgrades(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("reads the function's xmin, PostgreSQL's")
	}
	pool := testdb.New(t)
	ctx := context.Background()
	tables := Tables{Prefix: "rev_"}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	stmt, err := enqueueFunction(false, tables)
	if err != nil {
		t.Fatal(err)
	}
	current := EnqueueFunctionRevision()
	mine := fmt.Sprint(revisionMarker, current)
	if !strings.Contains(stmt, mine) {
		t.Fatalf("the statement lacks its marker %q", mine)
	}
	for _, c := range []struct {
		name     string
		body     string // what the statement installs instead of the marker
		replaced bool
	}{
		{"older revision", fmt.Sprint(revisionMarker, current-1), true},
		{"no marker", "no revision", true},
		{"newer revision", fmt.Sprint(revisionMarker, current+1), false},
		{"much newer revision", fmt.Sprint(revisionMarker, current+10), false},
	} {
		if _, err := pool.Exec(ctx, strings.Replace(stmt, mine, c.body, 1)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_, xmin, _ := functionRow(t, pool, tables)
		if err := Apply(ctx, pool, tables); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_, x, body := functionRow(t, pool, tables)
		switch {
		case c.replaced && (body != functionBody(stmt) || x == xmin):
			t.Errorf("%s: Apply did not replace the function (now revision %d)", c.name, bodyRevision(body))
		case !c.replaced && (x != xmin || !strings.Contains(body, c.body)):
			t.Errorf("%s: Apply replaced a function newer than its own (now revision %d)", c.name, bodyRevision(body))
		}
	}
}

// enqueueFunctionPins pins the files of each revision of the enqueue
// function: the SHA-256 of the PostgreSQL file followed by the CockroachDB
// file. A change of either file must raise the revision in both (the
// marker's number): databases replace the function only for a newer
// revision.
var enqueueFunctionPins = map[int]string{
	1: "e9642d719a6f4235bcb8e7033e773ba44d103d9016acd586cc7845c474f08fca",
	// 2: the bounds of the queue's name (512 bytes), the key and the
	// tenant (2,048) that the items' indexes hold (docs/enqueue.md).
	2: "21fe27ae2e31e232916340157db4c0dca2b23837f04a9c94492cc05af7f2ae35",
	// 3: the parameter timeout, the item's own handler timeout
	// (timeout_us, docs/timeouts.md); the old parameter list is dropped.
	3: "1ea3de71236a459fe0d6a2260ef2620fc1f0371a6bc0497b2137093fccab699b",
	// 4: the parameters kind, the item's kind (docs/kinds.md), and after,
	// run_after and after_queues, its prerequisites (NewItem.After,
	// RunAfter, AfterIn; docs/dependencies.md); the list of revision 3 is
	// dropped.
	4: "2f96f99378e09cb70a90e2cbf0db14a21b4f1f25ad05c1526281ed05a59f98c3",
}

// The files are those pinned for their revision, and both carry it.
func TestEnqueueFunctionRevisionPinned(t *testing.T) {
	t.Parallel()
	pg, crdb := EnqueueFunctionSQL(), CockroachEnqueueFunctionSQL()
	rev := EnqueueFunctionRevision()
	if rev < 1 || bodyRevision(crdb) != rev || strings.Count(pg, revisionMarker) != 1 || strings.Count(crdb, revisionMarker) != 1 {
		t.Fatalf("revisions: PostgreSQL file %d, CockroachDB file %d (one marker each, from 1)", rev, bodyRevision(crdb))
	}
	sum := sha256.Sum256([]byte(pg + crdb))
	if got := hex.EncodeToString(sum[:]); enqueueFunctionPins[rev] != got {
		t.Fatalf("the enqueue function's files changed (SHA-256 %s) but not its revision (%d): raise %s%d to %d in sql/enqueue_function.sql and sql/cockroach_enqueue_function.sql, and pin the new files here",
			got, rev, revisionMarker, rev, rev+1)
	}
}

// testdb.EnqueueParams, which the tests use to call the function by
// position (CockroachDB takes no named arguments), is the function's
// parameter list, in order, with its defaults; and EnqueueArgs puts each
// named argument at its place.
func TestEnqueueParamsMatchTheFunction(t *testing.T) {
	t.Parallel()
	decl := regexp.MustCompile(`(?m)^\s+([a-z_]+)\s+[A-Z]+(?:\[\])?(?:\s+DEFAULT\s+(\S+?))?,$`)
	for _, d := range []bool{false, true} { // d: CockroachDB
		text := enqueueFunctionFor(d)
		head := text[strings.Index(text, "CREATE OR REPLACE FUNCTION"):strings.Index(text, "OUT item_id")]
		var got []string
		for _, m := range decl.FindAllStringSubmatch(head, -1) {
			got = append(got, m[1]+"="+m[2])
		}
		var want []string
		for _, p := range testdb.EnqueueParams {
			want = append(want, p.Name+"="+p.Default)
		}
		if !slices.Equal(got, want) {
			t.Errorf("cockroach %v: the function's parameters are\n%q\ntestdb.EnqueueParams\n%q", d, got, want)
		}
	}
	for _, c := range []struct {
		named []string
		want  string
	}{
		{nil, `'q', p`},
		{[]string{"key", "'k'"}, `'q', p, NULL, 'k'`},
		{[]string{"delay", "$1", "key", "'k'"}, `'q', p, NULL, 'k', 0, $1`},
		{[]string{"at_most_once", "true"}, `'q', p, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true`},
		{[]string{"priority", "NULL"}, `'q', p, NULL, NULL, NULL`},
	} {
		if got := testdb.EnqueueArgs("'q'", "p", c.named...); got != c.want {
			t.Errorf("EnqueueArgs(%q) = %s, want %s", c.named, got, c.want)
		}
	}
	for _, bad := range [][]string{{"nope", "1"}, {"queue", "'x'"}, {"key", "'a'", "key", "'b'"}, {"key"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("EnqueueArgs(%q) did not panic", bad)
				}
			}()
			testdb.EnqueueArgs("'q'", "p", bad...)
		}()
	}
}

// A database whose enqueue function has the parameter list of revisions 0
// to 2 (no timeout), or of revision 3 (no kind, after, run_after,
// after_queues), gets the new function in
// its place, not beside it: Apply drops the old list, so that a call both
// lists would accept is not ambiguous, and an older producer's call by
// position still works.
func TestEnqueueFunctionOldParameterListDropped(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("installs a stand-in function in SQL, PostgreSQL's")
	}
	for rev, extra := range map[int]string{2: "", 3: "timeout INTERVAL DEFAULT NULL, "} {
		t.Run(fmt.Sprintf("revision %d", rev), func(t *testing.T) {
			t.Parallel()
			oldParameterListDropped(t, extra)
		})
	}
}

// oldParameterListDropped is TestEnqueueFunctionOldParameterListDropped
// for the old list that ends with extra.
func oldParameterListDropped(t *testing.T, extra string) {
	pool := testdb.New(t)
	ctx := context.Background()
	tables := Tables{Prefix: "old_"}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	// A stand-in of the old list, and the installed function made older,
	// as a database upgraded from version 5 (or from an earlier 0.6) has
	// them.
	if _, err := pool.Exec(ctx, `DROP FUNCTION old_enqueue(TEXT, BYTEA, UUID, TEXT, BIGINT, INTERVAL, TIMESTAMPTZ, BIGINT, TEXT, INTERVAL, BYTEA, JSONB, BOOL, INTERVAL, TEXT, UUID[], TEXT[], TEXT[])`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE FUNCTION old_enqueue(queue TEXT, payload BYTEA, id UUID DEFAULT NULL, key TEXT DEFAULT NULL,
    priority BIGINT DEFAULT 0, delay INTERVAL DEFAULT NULL, run_at TIMESTAMPTZ DEFAULT NULL, max_attempts BIGINT DEFAULT NULL,
    tenant TEXT DEFAULT NULL, ttl INTERVAL DEFAULT NULL, metadata BYTEA DEFAULT NULL, headers JSONB DEFAULT NULL,
    at_most_once BOOL DEFAULT false, `+extra+`OUT item_id UUID, OUT added BOOL, OUT done BOOL)
LANGUAGE plpgsql AS $$ BEGIN item_id := NULL; added := false; done := false; END $$`); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_proc WHERE proname = 'old_enqueue'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d functions old_enqueue after Apply (%v), want 1", n, err)
	}
	var added bool
	if err := pool.QueryRow(ctx, `SELECT added FROM old_enqueue('q', ''::BYTEA)`).Scan(&added); err != nil || !added {
		t.Fatalf("a call by position after the upgrade: added %v, %v", added, err)
	}
}
