// Package testdb gives each test a fresh, empty database on a real server.
//
// With TEST_DATABASE_URL set, databases are created on that server (its
// engine is detected with SELECT version()). Otherwise one throwaway server
// per test binary is started on first use with dbserver.Start — CockroachDB
// if a cockroach binary is available, else PostgreSQL — and stopped by Main.
// When no server can be found the test fails, it is never skipped.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
// Tests call New or NewURL; Example functions, which have no testing.TB,
// call ExampleURL.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// DefaultMaxConns is the MaxConns of pools returned by New.
const DefaultMaxConns = 32

// DefaultParallel is how many tests that call t.Parallel run at once in a
// test binary whose TestMain calls Main, unless go test's -parallel flag
// says otherwise (go test's own default is GOMAXPROCS, 2 on a 2-core
// machine, while such tests mostly wait for the database). The sizing
// rule: the parallel tests' pools must fit in the server's connections,
//
//	DefaultParallel × DefaultMaxConns + what else connects ≤ max_connections
//
// The server Main starts (dbserver) has max_connections 400: 8 × 32 = 256,
// leaving 144 for the connections outside the tests' pools (each session's
// heartbeat connection, processes a test starts, the admin pool of 8, the
// template copies). A test that needs more connections than its pool's 32
// opens its own pool on NewURL's database and must not be parallel. With
// TEST_DATABASE_URL on a server with fewer connections (PostgreSQL's
// default is 100), pass -parallel 2.
const DefaultParallel = 8

// setupTimeout bounds starting (or reaching) the server.
const setupTimeout = 3 * time.Minute

// opTimeout bounds creating and dropping one database.
const opTimeout = 2 * time.Minute

// env is the server the tests of this binary use.
type env struct {
	kind      dbserver.Kind
	server    *dbserver.Server // nil when TEST_DATABASE_URL is used
	admin     *pgxpool.Pool    // connected to the server's default database
	urlFor    func(database string) (string, error)
	forceDrop bool // PostgreSQL 13+: DROP DATABASE ... WITH (FORCE)

	mu        sync.Mutex
	templates []string // template databases built (NewFromTemplate), dropped by shutdown

	// bg counts the background work (drops, spare copies) that shutdown
	// waits for; once closing is set (under mu), none starts.
	bg      sync.WaitGroup
	closing bool
	drops   chan struct{} // a slot per concurrent drop
}

// maxConcurrentDrops bounds the drops running in the background at once.
const maxConcurrentDrops = 2

// background registers a piece of background work, or reports false once
// shutdown began. The work calls e.bg.Done when it ends.
func (e *env) background() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return false
	}
	e.bg.Add(1)
	return true
}

func (e *env) isClosing() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closing
}

// dropLater drops a test's database in the background, so that the test
// ends without waiting for it (a drop takes tens of milliseconds quiet,
// more under load); Main waits for every drop before it stops the server.
func (e *env) dropLater(name string) {
	if !e.background() {
		if err := e.drop(name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: %v (ignored)\n", err)
		}
		return
	}
	go func() {
		defer e.bg.Done()
		e.drops <- struct{}{}
		defer func() { <-e.drops }()
		if err := e.drop(name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: %v (ignored)\n", err)
		}
	}()
}

var (
	setupOnce sync.Once
	shared    *env
	setupErr  error
	seq       atomic.Uint64
)

// Main runs the tests, then stops the shared server if one was started, and
// exits with the tests' status (or 1 if stopping the server failed). Unless
// go test's -parallel flag is given, it runs DefaultParallel parallel tests
// at once.
func Main(m *testing.M) {
	setParallel()
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// setParallel sets the -test.parallel flag to DefaultParallel unless it
// was given.
func setParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && flag.Lookup("test.parallel") != nil {
		_ = flag.Set("test.parallel", strconv.Itoa(DefaultParallel))
	}
}

// New returns a pool connected to a fresh, empty database made for this
// test, with MaxConns DefaultMaxConns. The pool is closed and the database
// dropped when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	// openPool registers its cleanup after NewURL's, so it runs first: the
	// pool is closed before the database is dropped.
	return openPool(t, NewURL(t))
}

// NewURL is like New but returns only the URL of the fresh database, for
// tests that open their own pools or start subprocesses. The database is
// dropped when the test ends; close connections to it in cleanups
// registered after NewURL (they run before the drop).
func NewURL(t testing.TB) string {
	t.Helper()
	e := mustSetup(t)
	name, u, err := e.create()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() { e.dropLater(name) })
	return u
}

// ExampleURL is NewURL for Example functions, which have no testing.TB: it
// returns the URL of a fresh, empty database and a function that drops it.
// Close connections to the database before calling cleanup. It panics if no
// database can be made. The test binary's TestMain must call Main, which
// stops the shared server.
func ExampleURL() (url string, cleanup func()) {
	e, err := getEnv()
	if err != nil {
		panic(fmt.Sprintf("testdb: no database for examples: %v", err))
	}
	name, u, err := e.create()
	if err != nil {
		panic(fmt.Sprintf("testdb: %v", err))
	}
	return u, func() {
		if err := e.drop(name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: %v (ignored)\n", err)
		}
	}
}

// Kind reports which engine the tests run on, so that a test can branch
// where CockroachDB and PostgreSQL truly differ. With TEST_DATABASE_URL it
// is detected from SELECT version().
func Kind(t testing.TB) dbserver.Kind {
	t.Helper()
	return mustSetup(t).kind
}

func mustSetup(t testing.TB) *env {
	t.Helper()
	e, err := getEnv()
	if err != nil {
		t.Fatalf("testdb: no database for tests: %v", err)
	}
	return e
}

// getEnv sets up the shared server on first use and returns it.
func getEnv() (*env, error) {
	setupOnce.Do(func() { shared, setupErr = setup() })
	return shared, setupErr
}

func setup() (*env, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	e := &env{drops: make(chan struct{}, maxConcurrentDrops)}
	var adminURL string
	if raw := os.Getenv("TEST_DATABASE_URL"); raw != "" {
		adminURL = raw
		e.urlFor = func(db string) (string, error) { return withDatabase(raw, db) }
	} else {
		logf := func(format string, args ...any) {
			if testing.Verbose() {
				fmt.Fprintf(os.Stderr, "testdb: "+format+"\n", args...)
			}
		}
		srv, err := dbserver.Start(ctx, dbserver.Options{Logf: logf})
		if err != nil {
			return nil, err
		}
		e.server = srv
		adminURL = srv.URL("")
		e.urlFor = func(db string) (string, error) { return srv.URL(db), nil }
	}
	if err := e.connect(ctx, adminURL); err != nil {
		if e.server != nil {
			_ = e.server.Stop()
		}
		return nil, err
	}
	if e.kind == dbserver.Cockroach && e.server != nil {
		e.tuneCockroach(ctx)
	}
	if _, err := loadFaults(); err != nil {
		if e.server != nil {
			_ = e.server.Stop()
		}
		e.admin.Close()
		return nil, err
	}
	return e, nil
}

// cockroachTestSettings are the cluster settings CockroachDB's documentation
// recommends for unit tests ("Test Your Application Locally"), which make
// the many CREATE and DROP DATABASE of a test binary cheaper: ranges of
// dropped tables merged sooner, the jobs of schema changes kept and scanned
// less. Its advice to turn automatic statistics off is not followed: the
// plans under test depend on them.
var cockroachTestSettings = []string{
	`SET CLUSTER SETTING kv.range_merge.queue_interval = '50ms'`,
	`SET CLUSTER SETTING jobs.registry.interval.gc = '30s'`,
	`SET CLUSTER SETTING jobs.registry.interval.cancel = '180s'`,
	`SET CLUSTER SETTING jobs.retention_time = '15s'`,
	`SET CLUSTER SETTING kv.range_split.by_load_merge_delay = '5s'`,
}

// tuneCockroach applies cockroachTestSettings to the throwaway CockroachDB
// server of this binary (never to a TEST_DATABASE_URL server), best effort:
// a setting a version does not know is skipped.
func (e *env) tuneCockroach(ctx context.Context) {
	for _, stmt := range cockroachTestSettings {
		if _, err := e.admin.Exec(ctx, stmt); err != nil && testing.Verbose() {
			fmt.Fprintf(os.Stderr, "testdb: %s: %v (skipped)\n", stmt, err)
		}
	}
}

// connect opens the admin pool and detects the engine.
func (e *env) connect(ctx context.Context, adminURL string) error {
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = 8 // tests creating databases, and the background drops and copies
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	var version string
	if err := admin.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		admin.Close()
		return fmt.Errorf("connect to %s: %w", redact(adminURL), err)
	}
	e.admin = admin
	if strings.Contains(version, "CockroachDB") {
		e.kind = dbserver.Cockroach
		return nil
	}
	e.kind = dbserver.Postgres
	var num string
	if err := admin.QueryRow(ctx, "SHOW server_version_num").Scan(&num); err == nil {
		if n, err := strconv.Atoi(num); err == nil && n >= 130000 {
			e.forceDrop = true
		}
	}
	return nil
}

// create makes a fresh, empty database and returns its name and URL.
// ("Empty": the fault model's schema, crdbwork_test_faults, is there when
// it is on.)
func (e *env) create() (name, dbURL string, err error) {
	name, dbURL, n, err := e.createPlain()
	if err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := created(ctx, dbURL, n, e.kind); err != nil {
		_ = e.drop(name)
		return "", "", fmt.Errorf("create database %s: %w", name, err)
	}
	return name, dbURL, nil
}

// createPlain makes a fresh, empty database without what created adds (a
// template's, which the copies get instead), and returns its name, URL and
// number in the binary.
func (e *env) createPlain() (name, dbURL string, n uint64, err error) {
	name, n = newName()
	if dbURL, err = e.urlFor(name); err != nil {
		return "", "", 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", 0, fmt.Errorf("create database %s: %w", name, err)
	}
	return name, dbURL, n, nil
}

// created is called with every database this package makes (the n-th of
// the binary), once it exists: the place for what every test database
// gets (today the fault model, when it is on).
func created(ctx context.Context, dbURL string, n uint64, kind dbserver.Kind) error {
	return installFaults(ctx, dbURL, n, kind)
}

// drop removes a test database. Callers treat a failure as best effort:
// they only log it.
func (e *env) drop(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	stmt := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
	switch {
	case e.kind == dbserver.Cockroach:
		stmt += " CASCADE"
	case e.forceDrop:
		stmt += " WITH (FORCE)"
	}
	if _, err := e.admin.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// shutdown closes the admin pool and stops the server this binary started.
func shutdown() error {
	// Mark setup done, so that nothing can start a server after this, and
	// synchronize with a setup that did run.
	setupOnce.Do(func() {})
	if shared == nil {
		return nil
	}
	shared.mu.Lock()
	shared.closing = true
	shared.mu.Unlock()
	shared.bg.Wait()
	templatesMu.Lock()
	for _, tpl := range templates {
		for _, name := range tpl.spares {
			if err := shared.drop(name); err != nil {
				fmt.Fprintf(os.Stderr, "testdb: %v (ignored)\n", err)
			}
		}
		tpl.spares = nil
	}
	templatesMu.Unlock()
	for _, name := range shared.templates {
		if err := shared.drop(name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: %v (ignored)\n", err)
		}
	}
	shared.admin.Close()
	if shared.server != nil {
		return shared.server.Stop()
	}
	return nil
}

// newName returns a database name unique to this test: lowercase, with a
// per-binary counter (n) and a random suffix (binaries can share a server).
func newName() (name string, n uint64) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n = seq.Add(1)
	return fmt.Sprintf("crdbwork_test_%d_%s", n, hex.EncodeToString(b[:])), n
}

// withDatabase returns the connection string raw with its database replaced,
// for both URL and keyword/value forms.
func withDatabase(raw, db string) (string, error) {
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("parse TEST_DATABASE_URL: %w", err)
		}
		u.Path, u.RawPath = "/"+db, ""
		return u.String(), nil
	}
	// Keyword/value form: a later setting overrides an earlier one.
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'"
	return strings.TrimSpace(raw) + " dbname=" + quoted, nil
}

// redact names a server for error messages without its password.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "the TEST_DATABASE_URL server"
	}
	return u.Redacted()
}
