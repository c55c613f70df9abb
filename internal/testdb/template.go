package testdb

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/internal/lived"
)

// templateTimeout bounds building one template database.
const templateTimeout = 10 * time.Minute

// template is a database built once per test binary and copied for each
// test that asks for it (PostgreSQL's CREATE DATABASE ... TEMPLATE).
type template struct {
	once sync.Once
	name string // the template database; "" until built
	err  error
}

var (
	templatesMu sync.Mutex
	templates   = map[string]*template{}
)

// NewFromTemplate returns a pool on a fresh database made for this test
// that starts as build left a database: on PostgreSQL, a copy of a template
// database that build fills once per test binary and key (the first call
// with key builds it, later calls copy it: CREATE DATABASE ... TEMPLATE
// copies the tables, their dead tuples and their statistics alike); on
// CockroachDB, which has no templates, build runs on each test's database.
// Calls with one key must pass the same build. The template is dropped when
// the binary's tests end (Main).
func NewFromTemplate(t testing.TB, key string, build func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	t.Helper()
	e := mustSetup(t)
	if e.kind == dbserver.Cockroach {
		pool := New(t)
		ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
		defer cancel()
		if err := build(ctx, pool); err != nil {
			t.Fatalf("testdb: building %s: %v", key, err)
		}
		return pool
	}
	templatesMu.Lock()
	tpl := templates[key]
	if tpl == nil {
		tpl = &template{}
		templates[key] = tpl
	}
	templatesMu.Unlock()
	tpl.once.Do(func() { tpl.name, tpl.err = e.buildTemplate(key, build) })
	if tpl.err != nil {
		t.Fatalf("testdb: template %s: %v", key, tpl.err)
	}
	name, n := newName()
	u, err := e.urlFor(name)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tpl.name}.Sanitize()); err != nil {
		t.Fatalf("testdb: copying template %s: %v", key, err)
	}
	t.Cleanup(func() {
		if err := e.drop(name); err != nil {
			t.Logf("testdb: %v (ignored)", err)
		}
	})
	// The copy gets what every test database gets (the fault model); the
	// template was built without it.
	if err := created(ctx, u, n, e.kind); err != nil {
		t.Fatalf("testdb: copying template %s: %v", key, err)
	}
	return openPool(t, u)
}

// buildTemplate makes a database, runs build on it and closes every
// connection to it, so that CREATE DATABASE may copy it.
func (e *env) buildTemplate(key string, build func(ctx context.Context, pool *pgxpool.Pool) error) (string, error) {
	// Without the fault model: building the template is the harness's own
	// work (the copies get the model).
	name, u, _, err := e.createPlain()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		_ = e.drop(name)
		return "", fmt.Errorf("connect: %w", err)
	}
	err = build(ctx, pool)
	pool.Close()
	if err != nil {
		_ = e.drop(name)
		return "", err
	}
	e.mu.Lock()
	e.templates = append(e.templates, name)
	e.mu.Unlock()
	return name, nil
}

// livedKey names NewLived's templates by their options.
func livedKey(o lived.Options) string { return fmt.Sprintf("lived %+v", o) }

// NewLived returns a pool on a fresh database of this test in the lived
// state (package internal/lived): the schema as apply installs it (the
// caller's crdbwork sql.Apply: this package cannot import it), then
// lived.Build with o. Built once per test binary and options, and copied
// for each test (NewFromTemplate); apply must be the same for every call.
// The test's own queue is then quiet: empty, or tiny if it is among
// o.Quiet, when the statistics were taken.
func NewLived(t testing.TB, apply func(ctx context.Context, pool *pgxpool.Pool) error, o lived.Options) *pgxpool.Pool {
	t.Helper()
	return NewFromTemplate(t, livedKey(o), func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := apply(ctx, pool); err != nil {
			return fmt.Errorf("applying the schema: %w", err)
		}
		return lived.Build(ctx, pool, o)
	})
}

// openPool opens a pool of DefaultMaxConns on u, closed when the test ends
// (before the database is dropped, if the drop was registered first).
func openPool(t testing.TB, u string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("testdb: parse %s: %v", u, err)
	}
	cfg.MaxConns = DefaultMaxConns
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testdb: ping %s: %v", u, err)
	}
	return pool
}
