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
}

var (
	setupOnce sync.Once
	shared    *env
	setupErr  error
	seq       atomic.Uint64
)

// Main runs the tests, then stops the shared server if one was started, and
// exits with the tests' status (or 1 if stopping the server failed).
func Main(m *testing.M) {
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
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
	t.Cleanup(func() {
		if err := e.drop(name); err != nil {
			t.Logf("testdb: %v (ignored)", err)
		}
	})
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
	e := &env{}
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
	if _, err := loadFaults(); err != nil {
		if e.server != nil {
			_ = e.server.Stop()
		}
		e.admin.Close()
		return nil, err
	}
	return e, nil
}

// connect opens the admin pool and detects the engine.
func (e *env) connect(ctx context.Context, adminURL string) error {
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = 4
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
