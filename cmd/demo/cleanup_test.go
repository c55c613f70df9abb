package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// foreignDB returns a fresh database holding the crdbwork schema and a
// queue the demo did not create, "emails", with n items; and a pool on it.
func foreignDB(t *testing.T, n int) (string, *pgxpool.Pool) {
	t.Helper()
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte("a real email")}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// demoTableCount counts the demo's tables in the database.
func demoTableCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'demo\_%'`)
}

// TestDemoRefusesOtherQueues: on a database holding a queue the demo did
// not create, a bare `demo` with DATABASE_URL exported, `demo run`, `demo
// enqueue` and `demo work` are refused with exit status 2 before anything
// is written; `demo work`, `enqueue` and `cleanup` on that queue itself are
// refused even with --shared-database. The queue's items stay untouched.
func TestDemoRefusesOtherQueues(t *testing.T) {
	t.Parallel()
	url, pool := foreignDB(t, 52)
	env := demoEnv("DATABASE_URL=" + url)
	intact := func(after string) {
		t.Helper()
		if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails' AND claim IS NULL AND attempts = 0`); n != 52 {
			t.Fatalf("after %s: %d of emails' 52 items left unclaimed and untried", after, n)
		}
	}
	nothingElse := func(after string) {
		t.Helper()
		if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue <> 'emails'`); n != 0 {
			t.Fatalf("after %s: %d items in other queues", after, n)
		}
		if n := demoTableCount(t, pool); n != 0 {
			t.Errorf("after %s: %d demo tables made", after, n)
		}
	}
	r := demo(t, time.Minute, env)
	wantExit(t, r, 2, `queues the demo did not create ("emails")`)
	wantExit(t, r, 2, "--shared-database")
	intact("a bare demo")
	nothingElse("a bare demo")
	wantExit(t, demo(t, time.Minute, env, "run", "--items", "100"), 2, "did not create")
	wantExit(t, demo(t, time.Minute, env, "enqueue", "--count", "5"), 2, "did not create")
	wantExit(t, demo(t, time.Minute, env, "work", "--name", "w"), 2, "did not create")
	intact("run, enqueue and work on the demo queue")
	nothingElse("run, enqueue and work on the demo queue")
	for _, args := range [][]string{
		{"work", "--queue", "emails", "--name", "w"},
		{"work", "--queue", "emails", "--name", "w", "--shared-database"},
		{"enqueue", "--queue", "emails", "--count", "5", "--shared-database"},
		{"run", "--queue", "emails", "--items", "5", "--shared-database"},
		{"cleanup", "--queue", "emails"},
		{"cleanup", "--queue", "emails", "--drop-schema"},
	} {
		wantExit(t, demo(t, time.Minute, env, args...), 2, `queue "emails" was not created by the demo`)
		intact(strings.Join(args, " "))
		nothingElse(strings.Join(args, " "))
	}
	// --shared-database: the demo works beside the other queue, on its own.
	r = demo(t, 2*time.Minute, env, "run", "--items", "300", "--workers", "2", "--shared-database", "--json")
	checkSummary(t, r, 300)
	intact("a shared run")
	// Then the demo queue is the demo's, but the other queue still needs
	// the flag.
	wantExit(t, demo(t, time.Minute, env, "enqueue", "--count", "5"), 2, "--shared-database")
	if r := demo(t, time.Minute, env, "enqueue", "--count", "5", "--shared-database"); r.code != 0 {
		t.Fatalf("enqueue --shared-database: %d\n%s", r.code, r.stderr)
	}
	intact("a shared enqueue")
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'demo'`); n != 5 {
		t.Errorf("%d items in the demo queue, want 5", n)
	}
}

// TestDemoOwnDatabase: on a database holding only demo queues (or nothing),
// the demo needs no flag and no migrate: it creates the schema and its
// tables itself.
func TestDemoOwnDatabase(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	if r := demo(t, time.Minute, env, "enqueue", "--queue", "a", "--count", "10"); r.code != 0 {
		t.Fatalf("enqueue into an empty database: %d\n%s", r.code, r.stderr)
	}
	if r := demo(t, time.Minute, env, "enqueue", "--queue", "b", "--count", "10"); r.code != 0 {
		t.Fatalf("enqueue into a second demo queue: %d\n%s", r.code, r.stderr)
	}
	r := demo(t, 2*time.Minute, env, "run", "--queue", "c", "--items", "200", "--workers", "2", "--json")
	checkSummary(t, r, 200)
	// The tables are whole: the next command's start runs no DDL.
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ready bool
	if err := pool.QueryRow(context.Background(), demoTablesReady).Scan(&ready); err != nil || !ready {
		t.Errorf("the demo tables are not all there after a run: %v, %v", ready, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM demo_queues`); n != 3 {
		t.Errorf("%d demo queues recorded, want a, b and c", n)
	}
}

// TestEnqueueBound: --count is bounded, with the bound in the message.
func TestEnqueueBound(t *testing.T) {
	t.Parallel()
	wantExit(t, demo(t, time.Minute, nil, "enqueue", "--database-url", "postgres://127.0.0.1:1/x", "--count", "10000001"), 2,
		`invalid value "10000001" for --count: must be between 1 and 10000000`)
}

// TestCleanup: cleanup removes the demo queue's items and dead items, and
// the demo tables with the last demo queue; --drop-schema refuses while
// another queue is left, before deleting anything, and drops the crdbwork
// tables once none is.
func TestCleanup(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "30"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	makeDead(t, pool, "demo", 2)
	var out struct {
		Items  int  `json:"items_deleted"`
		Dead   int  `json:"dead_items_deleted"`
		Tables bool `json:"demo_tables_dropped"`
	}
	r := demo(t, time.Minute, env, "cleanup", "--json")
	jsonOut(t, r, &out)
	if out.Items != 30 || out.Dead != 2 || !out.Tables {
		t.Errorf("cleanup deleted %d items and %d dead items, tables dropped %v; want 30, 2 and true", out.Items, out.Dead, out.Tables)
	}
	if !strings.Contains(r.stderr, `removing demo queue "demo": 30 items, 2 dead items`) {
		t.Errorf("cleanup does not say what it removes:\n%s", r.stderr)
	}
	if n := demoTableCount(t, pool); n != 0 {
		t.Errorf("%d demo tables left", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_queues`); n != 0 {
		t.Errorf("%d rows of the demo queue left", n)
	}
	if r := demo(t, time.Minute, env, "enqueue", "--count", "10"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	r = demo(t, time.Minute, env, "cleanup", "--drop-schema")
	if r.code != 0 {
		t.Fatalf("cleanup --drop-schema: %d\n%s", r.code, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'crdbwork\_%'`); n != 0 {
		t.Errorf("%d crdbwork tables left after --drop-schema", n)
	}
	if n := demoTableCount(t, pool); n != 0 {
		t.Errorf("%d demo tables left after --drop-schema", n)
	}
}

// TestCleanupLeavesOthers: cleaning one demo queue up leaves another
// queue's rows and another demo queue's rows and tables intact; with
// --drop-schema it refuses while other queues are left, before deleting
// anything.
func TestCleanupLeavesOthers(t *testing.T) {
	t.Parallel()
	url, pool := foreignDB(t, 7)
	env := demoEnv("DATABASE_URL=" + url)
	makeDead(t, pool, "emails", 1)
	for q, n := range map[string]string{"d1": "30", "d2": "20"} {
		if r := demo(t, time.Minute, env, "enqueue", "--queue", q, "--count", n, "--shared-database"); r.code != 0 {
			t.Fatalf("enqueue %s: %d\n%s", q, r.code, r.stderr)
		}
	}
	counts := func() map[string]int {
		return map[string]int{
			"emails items": countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails'`),
			"emails dead":  countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'emails'`),
			"d1 items":     countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'd1'`),
			"d2 items":     countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'd2'`),
			"d2 recorded":  countRows(t, pool, `SELECT count(*) FROM demo_enqueued WHERE queue = 'd2'`),
		}
	}
	want := map[string]int{"emails items": 7, "emails dead": 1, "d1 items": 30, "d2 items": 20, "d2 recorded": 20}
	check := func(after string) {
		t.Helper()
		for k, v := range counts() {
			if v != want[k] {
				t.Errorf("after %s: %s = %d, want %d", after, k, v, want[k])
			}
		}
	}
	check("the enqueues")
	// --drop-schema refuses before deleting anything, naming the others.
	wantExit(t, demo(t, time.Minute, env, "cleanup", "--queue", "d1", "--drop-schema"), 1, `"d2", "emails"`)
	check("the refused --drop-schema")

	if r := demo(t, time.Minute, env, "cleanup", "--queue", "d1"); r.code != 0 || !strings.Contains(r.stderr, `stay for the demo queues "d2"`) {
		t.Fatalf("cleanup d1: %d\n%s", r.code, r.stderr)
	}
	want["d1 items"] = 0
	check("cleanup d1")
	if n := countRows(t, pool, `SELECT count(*) FROM demo_enqueued WHERE queue = 'd1'`); n != 0 {
		t.Errorf("%d recorded items of d1 left", n)
	}
	// d2's verify still sees exactly its items, nothing lost.
	v := lastJSON(t, demo(t, time.Minute, env, "verify", "--json"))
	for key, w := range map[string]float64{"enqueued": 20, "pending": 20, "lost": 0} {
		if got := num(t, v, key); got != w {
			t.Errorf("verify after cleanup d1: %s = %v, want %v", key, got, w)
		}
	}
	// The last demo queue takes the demo tables with it; emails stays.
	if r := demo(t, time.Minute, env, "cleanup", "--queue", "d2"); r.code != 0 {
		t.Fatalf("cleanup d2: %d\n%s", r.code, r.stderr)
	}
	if n := demoTableCount(t, pool); n != 0 {
		t.Errorf("%d demo tables left after the last demo queue's cleanup", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails'`); n != 7 {
		t.Errorf("emails has %d items, want 7", n)
	}
}

// TestVerifyQueueAndCancelled: verify --queue checks that demo queue only,
// refuses a queue the demo did not create, and an item an operator
// cancelled is counted as cancelled, not lost.
func TestVerifyQueueAndCancelled(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	for q, n := range map[string]string{"q1": "10", "q2": "5"} {
		if r := demo(t, time.Minute, env, "enqueue", "--queue", q, "--count", n); r.code != 0 {
			t.Fatalf("enqueue %s: %d\n%s", q, r.code, r.stderr)
		}
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var id uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT item_id FROM demo_enqueued WHERE queue = 'q1' LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "q1"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	r := demo(t, time.Minute, env, "verify", "--json")
	if r.code != 0 {
		t.Errorf("verify with a cancelled item: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	v := lastJSON(t, r)
	for key, w := range map[string]float64{"enqueued": 15, "pending": 14, "cancelled": 1, "lost": 0} {
		if got := num(t, v, key); got != w {
			t.Errorf("verify: %s = %v, want %v", key, got, w)
		}
	}
	v = lastJSON(t, demo(t, time.Minute, env, "verify", "--queue", "q2", "--json"))
	for key, w := range map[string]float64{"enqueued": 5, "pending": 5, "cancelled": 0, "lost": 0} {
		if got := num(t, v, key); got != w {
			t.Errorf("verify --queue q2: %s = %v, want %v", key, got, w)
		}
	}
	r = demo(t, time.Minute, env, "verify", "--queue", "q1")
	if r.code != 0 || !strings.Contains(r.stdout, "1 cancelled by an operator") {
		t.Errorf("verify --queue q1: %d\n%s", r.code, r.stdout)
	}
	wantExit(t, demo(t, time.Minute, env, "verify", "--queue", "nope"), 2, `queue "nope" is not one the demo created`)
	// An item gone without a trace is still lost.
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE id = (SELECT item_id FROM demo_enqueued WHERE queue = 'q2' LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	r = demo(t, time.Minute, env, "verify", "--queue", "q2", "--json")
	if r.code != 1 || num(t, lastJSON(t, r), "lost") != 1 {
		t.Errorf("verify of a deleted item: exit status %d, %s", r.code, r.stdout)
	}
}

// TestEnqueueProgress: a short enqueue shows nothing; a long one shows
// how far it is, its rate and the time left.
func TestEnqueueProgress(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	out := cli.NewConsole(&strings.Builder{}, &stderr)
	enqueueProgress(out, "demo", 1000, time.Now())(500)
	if stderr.Len() != 0 {
		t.Errorf("a fresh enqueue showed progress: %q", stderr.String())
	}
	enqueueProgress(out, "demo", 1000, time.Now().Add(-4*time.Second))(500)
	line := stderr.String()
	for _, want := range []string{`500/1000 items into "demo" (50%)`, "items/s", "left"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
}
