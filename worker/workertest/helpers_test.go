package workertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

// fakeTB records the failures of a helper under test: Fatalf records and
// ends the goroutine (as testing's does), Errorf records. Everything else
// goes to the real test.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	fatals []string
	errors []string
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Error(args ...any) { f.Errorf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) FailNow()          { f.Fatalf("FailNow") }
func (f *fakeTB) Fail()             { f.Errorf("Fail") }

// failures returns everything recorded.
func (f *fakeTB) failures() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(append([]string(nil), f.fatals...), f.errors...)
}

// underFake runs fn with a fakeTB on a goroutine of its own, as a test runs,
// and returns the fake once fn has returned or called Fatalf.
func underFake(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

// wantFatal checks that f recorded exactly one Fatalf containing every one
// of parts.
func wantFatal(t *testing.T, f *fakeTB, parts ...string) {
	t.Helper()
	if len(f.fatals) != 1 || len(f.errors) != 0 {
		t.Fatalf("recorded fatals %q and errors %q, want one fatal", f.fatals, f.errors)
	}
	for _, p := range parts {
		if !strings.Contains(f.fatals[0], p) {
			t.Errorf("failure message lacks %q:\n%s", p, f.fatals[0])
		}
	}
}

// wantPass checks that f recorded no failure.
func wantPass(t *testing.T, f *fakeTB) {
	t.Helper()
	if got := f.failures(); len(got) > 0 {
		t.Fatalf("the helper failed a correct expectation:\n%s", strings.Join(got, "\n"))
	}
}

type email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	Tries   int    `json:"tries"`
}

// producer enqueues three items, as code under test would.
func producer(t *testing.T, pool *pgxpool.Pool, tables crsql.Tables) (ids []uuid.UUID) {
	t.Helper()
	q, err := claim.New(pool, claim.Options{Queue: "emails", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	ada, _ := json.Marshal(email{To: "ada@example.com", Subject: "welcome", Tries: 1})
	res, err := q.Enqueue(context.Background(),
		claim.NewItem{Payload: ada, Key: "ada", Tenant: "acme", Priority: 2},
		claim.NewItem{Payload: []byte("raw bytes"), Key: "bob", Tenant: "acme"},
		claim.NewItem{Payload: []byte{0xff, 0x00}, Tenant: "other", Priority: -1},
	)
	if err != nil {
		t.Fatal(err)
	}
	return res.IDs
}

func TestRequireEnqueuedFindsWhatWasEnqueued(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	tables := workertest.Tables(t, pool)
	ids := producer(t, pool, tables)

	var got claim.Item
	f := underFake(t, func(tb testing.TB) {
		// Key order, spacing and number spelling do not matter to HasJSON.
		got = workertest.RequireEnqueued(tb, pool, tables, "emails",
			workertest.HasJSON(json.RawMessage(`{"tries": 1.0, "subject":"welcome","to":"ada@example.com"}`)),
			workertest.HasKey("ada"), workertest.HasTenant("acme"), workertest.HasPriority(2))
	})
	wantPass(t, f)
	if got.ID != ids[0] || got.Key != "ada" || got.Tenant != "acme" || got.Priority != 2 || got.Queue != "emails" || got.Attempt != 0 {
		t.Errorf("RequireEnqueued returned %+v, want the item %s", got, ids[0])
	}
	// A struct is compared through its JSON encoding.
	f = underFake(t, func(tb testing.TB) {
		got = workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasJSON(email{To: "ada@example.com", Subject: "welcome", Tries: 1}))
	})
	wantPass(t, f)
	if got.ID != ids[0] {
		t.Errorf("HasJSON(struct) found %s, want %s", got.ID, ids[0])
	}
	f = underFake(t, func(tb testing.TB) {
		got = workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasPayload([]byte{0xff, 0x00}))
	})
	wantPass(t, f)
	if got.ID != ids[2] || got.Priority != -1 {
		t.Errorf("HasPayload found %+v, want %s", got, ids[2])
	}

	var many []claim.Item
	f = underFake(t, func(tb testing.TB) {
		many = workertest.RequireEnqueuedN(tb, pool, tables, "emails", 2, workertest.HasTenant("acme"))
	})
	wantPass(t, f)
	// Claim order: priority 0 (bob) before priority 2 (ada).
	if len(many) != 2 || many[0].ID != ids[1] || many[1].ID != ids[0] {
		t.Errorf("RequireEnqueuedN(tenant acme) = %v, want [%s %s]", many, ids[1], ids[0])
	}
	f = underFake(t, func(tb testing.TB) {
		many = workertest.RequireEnqueuedN(tb, pool, tables, "emails", 3)
	})
	wantPass(t, f)
	if len(many) != 3 || many[0].ID != ids[2] {
		t.Errorf("RequireEnqueuedN(3) = %v, want all three, priority -1 first", many)
	}
	f = underFake(t, func(tb testing.TB) {
		workertest.RequireNotEnqueued(tb, pool, tables, "emails", workertest.HasKey("carol"))
		workertest.RequireNotEnqueued(tb, pool, tables, "other-queue")
		workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.Where("max attempts 25", func(it claim.Item) bool { return it.MaxAttempts == 25 }), workertest.HasKey("bob"))
		workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasKey(""))
	})
	wantPass(t, f)
}

// TestRequireEnqueuedSeesATransaction: given the transaction the code under
// test enqueued in, the assertion sees its items before the commit.
func TestRequireEnqueuedSeesATransaction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	tables := workertest.Tables(t, pool)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "emails", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Payload: []byte("in tx")}); err != nil {
		t.Fatal(err)
	}
	wantPass(t, underFake(t, func(tb testing.TB) {
		workertest.RequireEnqueued(tb, tx, tables, "emails", workertest.HasPayload([]byte("in tx")))
	}))
	wantPass(t, underFake(t, func(tb testing.TB) {
		workertest.RequireNotEnqueued(tb, pool, tables, "emails")
	}))
}

// TestRequireEnqueuedCatchesMistakes gives the assertions wrong
// expectations: each must fail, once, with a message that says what was
// wanted and what the queue holds.
func TestRequireEnqueuedCatchesMistakes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	tables := workertest.Tables(t, pool)
	ids := producer(t, pool, tables)
	ada, bob, raw := ids[0].String(), ids[1].String(), ids[2].String()

	cases := []struct {
		name string
		fn   func(tb testing.TB)
		want []string
	}{
		{"wrong key", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasKey("carol"))
		}, []string{`want 1 item of queue "emails"`, `with key "carol"`, "found 0 among the queue's 3 items",
			ada, bob, raw, `differs: key "ada" (want key "carol")`, `key "" (want key "carol")`, tables.Schema}},
		{"wrong JSON", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasJSON(email{To: "ada@example.com", Subject: "welcome", Tries: 2}))
		}, []string{"found 0", `payload {"to":"ada@example.com","subject":"welcome","tries":1} (want JSON payload {"to":"ada@example.com","subject":"welcome","tries":2})`,
			`payload "raw bytes" (not JSON)`}},
		{"wrong payload", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasPayload([]byte("raw byte")))
		}, []string{"found 0", `payload "raw bytes" (want payload "raw byte")`, `payload 0xff00`}},
		{"wrong tenant", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasKey("ada"), workertest.HasTenant("other"))
		}, []string{"found 0", `tenant "acme" (want tenant "other")`}},
		{"wrong priority", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasKey("ada"), workertest.HasPriority(0))
		}, []string{"found 0", "priority 2 (want priority 0)"}},
		{"two where one is wanted", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasTenant("acme"))
		}, []string{"want 1 item", "found 2 among the queue's 3 items", "matches"}},
		{"wrong count", func(tb testing.TB) {
			workertest.RequireEnqueuedN(tb, pool, tables, "emails", 4)
		}, []string{"want 4 items", "found 3 among the queue's 3 items"}},
		{"enqueued but should not be", func(tb testing.TB) {
			workertest.RequireNotEnqueued(tb, pool, tables, "emails", workertest.HasKey("bob"))
		}, []string{"RequireNotEnqueued", "want 0 items", `with key "bob"`, "found 1", bob}},
		{"empty queue", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "mails")
		}, []string{`queue "mails"`, "the queue is empty"}},
		{"where", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.Where("metadata set", func(it claim.Item) bool { return it.Metadata != nil }))
		}, []string{"with metadata set", "differs: not metadata set\n"}},
		{"tables without the schema", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, crsql.Tables{}, "emails")
		}, []string{"RequireEnqueued", "crdbwork schema is missing"}},
		{"bad JSON wanted", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.HasJSON([]byte(`{"to":`)))
		}, []string{"HasJSON: the wanted value \"{\\\"to\\\":\" is not JSON"}},
		{"zero match", func(tb testing.TB) {
			workertest.RequireEnqueued(tb, pool, tables, "emails", workertest.Match{})
		}, []string{"a zero Match"}},
		{"negative count", func(tb testing.TB) {
			workertest.RequireEnqueuedN(tb, pool, tables, "emails", -1)
		}, []string{"negative"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := underFake(t, c.fn)
			wantFatal(t, f, c.want...)
			t.Logf("message:\n%s", f.fatals[0])
		})
	}
}

// TestRequireEnqueuedListsAtMost20 keeps failure messages readable.
func TestRequireEnqueuedListsAtMost20(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	tables := workertest.Tables(t, pool)
	q, err := claim.New(pool, claim.Options{Queue: "bulk", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, 25)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint("item ", i))}
	}
	if _, err := q.Enqueue(context.Background(), items...); err != nil {
		t.Fatal(err)
	}
	f := underFake(t, func(tb testing.TB) { workertest.RequireNotEnqueued(tb, pool, tables, "bulk") })
	wantFatal(t, f, "found 25 among the queue's 25 items", "... and 5 more")
	if n := strings.Count(f.fatals[0], "\n      matches"); n != 20 {
		t.Errorf("listed %d items, want 20:\n%s", n, f.fatals[0])
	}
}

// schemaExists reports whether a schema of that name exists.
func schemaExists(t *testing.T, pool *pgxpool.Pool, name string) bool {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1`, name) > 0
}

// TestTablesIsolatesParallelTests runs four parallel subtests on one
// database, each with its own Tables and the same queue name (two of them
// in parts mode, with a different number of parts): each enqueues its own
// number of items and one that fails for good, works them with a worker,
// and must see exactly its items handled, its one dead item, its one
// session, its own number of parts, and nothing left; the default tables
// are never created, and every schema is gone once the subtests end.
func TestTablesIsolatesParallelTests(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var mu sync.Mutex
	var schemas []string
	t.Run("group", func(t *testing.T) {
		for i := 1; i <= 4; i++ {
			n := 5 * i
			t.Run(fmt.Sprint("items", n), func(t *testing.T) {
				t.Parallel()
				tables := workertest.Tables(t, pool)
				mu.Lock()
				schemas = append(schemas, tables.Schema)
				mu.Unlock()
				workQueue(t, pool, tables, n, []int{0, 4, 0, 7}[i-1])
			})
		}
	})
	if len(schemas) != 4 {
		t.Fatalf("%d schemas made, want 4", len(schemas))
	}
	for _, s := range schemas {
		if schemaExists(t, pool, s) {
			t.Errorf("schema %s is left after its test ended", s)
		}
	}
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Errorf("the default tables: Check = %v, want ErrSchemaMissing (something wrote outside the tests' schemas)", err)
	}
}

// workQueue enqueues n items in queue "shared" of tables, runs a worker
// until it handled them all, and checks the counts. The items' payloads and
// the table of handled items (outside the crdbwork tables) are the test's
// own, named after n, so a worker of another test that took one of them
// shows.
func workQueue(t *testing.T, pool *pgxpool.Pool, tables crsql.Tables, n, parts int) {
	ctx := context.Background()
	tag := fmt.Sprintf("items%d", n)
	done := pgx.Identifier{"done_" + tag}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+done+` (id UUID PRIMARY KEY, payload TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "shared", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprintf("%s/%d", tag, i))}
	}
	items = append(items, claim.NewItem{Payload: []byte(tag + "/dead")})
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	workertest.RequireEnqueuedN(t, pool, tables, "shared", n+1)

	var handled, foreign atomic.Int64
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if !strings.HasPrefix(string(it.Payload), tag+"/") {
			foreign.Add(1)
		}
		if strings.HasSuffix(string(it.Payload), "/dead") {
			return nil, claim.Permanent(errors.New("no such address"))
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+done+` (id, payload) VALUES ($1, $2)`, it.ID, string(it.Payload))
			if err == nil {
				handled.Add(1)
			}
			return err
		}, nil
	}
	w, err := worker.New(q, h, worker.Options{Concurrency: 2, Parts: parts, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	var runErr error
	stopped := false
	stopWorker := func() error { // once; also when the wait below fails
		if !stopped {
			stop()
			runErr, stopped = <-ran, true
		}
		return runErr
	}
	t.Cleanup(func() { _ = stopWorker() })
	var sessions []session.Info
	var dead []claim.DeadItem
	await.Until(t, "the worker to handle every item, one dead, with its session listed", func() (bool, string) {
		if sessions, err = session.List(ctx, pool, tables); err != nil {
			t.Fatal(err)
		}
		if dead, err = deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})); err != nil {
			t.Fatal(err)
		}
		got := count(t, pool, `SELECT count(*) FROM `+done)
		return got >= n && len(dead) > 0 && len(sessions) > 0,
			fmt.Sprintf("%d of %d items handled, %d dead, %d sessions", got, n, len(dead), len(sessions))
	})
	if len(sessions) != 1 {
		t.Errorf("the test's tables list %d sessions, want its worker's one", len(sessions))
	}
	if len(dead) != 1 || string(dead[0].Payload) != tag+"/dead" {
		t.Errorf("dead items %v, want the test's one", dead)
	}
	if got, err := partition.Parts(ctx, pool, tables, "shared"); err != nil || got != max(parts, 1) {
		t.Errorf("queue shared has %d parts (%v), want %d", got, err, max(parts, 1))
	}
	if err := stopWorker(); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	// (A record may run more than once: an ack transaction is retried on
	// a serialization failure. The rows count what committed.)
	if got := count(t, pool, `SELECT count(*) FROM `+done); got != n || handled.Load() < int64(n) || foreign.Load() != 0 {
		t.Errorf("handled %d rows (%d records run, %d items of other tests), want exactly %d", got, handled.Load(), foreign.Load(), n)
	}
	if got := count(t, pool, `SELECT count(*) FROM `+done+` WHERE payload NOT LIKE $1`, tag+"/%"); got != 0 {
		t.Errorf("%d handled items came from other tests", got)
	}
	workertest.RequireNotEnqueued(t, pool, tables, "shared")
}

// TestTablesDropsOnItsOwnConnection: a pool closed before the test's
// cleanups (closed by a cleanup registered after Tables) does not leave the
// schema behind.
func TestTablesDropsOnItsOwnConnection(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	admin, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	var schema string
	t.Run("test", func(t *testing.T) {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		tables := workertest.Tables(t, pool)
		schema = tables.Schema
		t.Cleanup(pool.Close) // runs before the drop
		producer(t, pool, tables)
		if !schemaExists(t, admin, schema) {
			t.Fatalf("schema %s not made", schema)
		}
	})
	if schema == "" || schemaExists(t, admin, schema) {
		t.Errorf("schema %q is left after its test ended", schema)
	}
}

func TestTablesNames(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seen := map[string]bool{}
	for range 3 {
		tables := workertest.Tables(t, pool)
		if seen[tables.Schema] || len(tables.Schema) > 63 || !strings.HasPrefix(tables.Schema, "crdbwork_test_testtablesnames_") || tables.Prefix != "" {
			t.Errorf("schema name %q: want a fresh crdbwork_test_testtablesnames_ name of at most 63 bytes", tables.Schema)
		}
		seen[tables.Schema] = true
		if err := crsql.Check(context.Background(), pool, tables); err != nil {
			t.Errorf("Check(%s) = %v", tables.Schema, err)
		}
		// Every table of the schema is in the test's schema: sessions,
		// queues, parts, items, dead items, ended ids and the rest.
		if got := count(t, pool, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name IN
			('crdbwork_sessions', 'crdbwork_queues', 'crdbwork_session_queues', 'crdbwork_session_parts', 'crdbwork_items',
			 'crdbwork_dead_items', 'crdbwork_tenant_limits', 'crdbwork_schedules', 'crdbwork_ended', 'crdbwork_schema_version')`, tables.Schema); got != 10 {
			t.Errorf("schema %s holds %d of the 10 crdbwork tables", tables.Schema, got)
		}
	}
	t.Run(strings.Repeat("a very long name, with spaces/and slashes ", 4), func(t *testing.T) {
		s := workertest.Tables(t, pool).Schema
		if len(s) > 63 || strings.ContainsAny(s, " /,") {
			t.Errorf("schema name %q", s)
		}
	})
	f := underFake(t, func(tb testing.TB) { workertest.Tables(tb, nil) })
	wantFatal(t, f, "nil pool")
}
