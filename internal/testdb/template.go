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

	size int64 // of the template database, in bytes

	// spares are copies made ahead of the tests that will take them (see
	// sparesWanted), by one goroutine at a time (filling).
	mu      sync.Mutex
	spares  []string
	filling bool
	taken   int // copies handed out
}

// Spare copies. A test takes a spare in the time of a lookup, while the
// next is copied in the background: a copy takes a quarter of a second to
// a second, as PostgreSQL writes the whole database, catalogs included
// (about 8 MB with the crdbwork schema). A template is kept with up to
// spareCopies spares, one fewer than the copies taken so far (a binary
// that takes one copy makes no spare), and none if it is larger than
// maxSpareSize (copying it ahead would cost more than it saves).
const (
	spareCopies  = 2
	maxSpareSize = 32 << 20
)

// sparesWanted is how many spares tpl should have now. Call with tpl.mu
// held.
func (tpl *template) sparesWanted() int {
	if tpl.size > maxSpareSize {
		return 0
	}
	return min(spareCopies, tpl.taken-1)
}

var (
	templatesMu sync.Mutex
	templates   = map[string]*template{}
)

// take returns a copy of the template for a test: a spare if one is
// ready, otherwise a new copy. Then it has the spares made up again in the
// background.
func (tpl *template) take(e *env) (string, error) {
	tpl.mu.Lock()
	tpl.taken++
	var name string
	if n := len(tpl.spares); n > 0 {
		name, tpl.spares = tpl.spares[n-1], tpl.spares[:n-1]
	}
	tpl.mu.Unlock()
	if name == "" {
		var err error
		if name, err = e.copyOf(tpl.name); err != nil {
			return "", err
		}
	}
	tpl.refill(e)
	return name, nil
}

// refill starts making spares, unless a fill is under way or the tests
// are over.
func (tpl *template) refill(e *env) {
	tpl.mu.Lock()
	defer tpl.mu.Unlock()
	if tpl.filling || len(tpl.spares) >= tpl.sparesWanted() || !e.background() {
		return
	}
	tpl.filling = true
	go func() {
		defer e.bg.Done()
		for {
			tpl.mu.Lock()
			if len(tpl.spares) >= tpl.sparesWanted() || e.isClosing() {
				tpl.filling = false
				tpl.mu.Unlock()
				return
			}
			tpl.mu.Unlock()
			name, err := e.copyOf(tpl.name)
			tpl.mu.Lock()
			if err == nil {
				tpl.spares = append(tpl.spares, name)
			}
			if err != nil || e.isClosing() {
				// A failed copy is made again, and reported, by the test
				// that needs it; shutdown drops the spares left.
				tpl.filling = false
				tpl.mu.Unlock()
				return
			}
			tpl.mu.Unlock()
		}
	}()
}

// copyOf makes a new database copied from the template database tplName.
// The copy gets what every test database gets (the fault model, when it is
// on: created); the template was built without it.
func (e *env) copyOf(tplName string) (string, error) {
	name, n := newName()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{tplName}.Sanitize()); err != nil {
		return "", fmt.Errorf("copying template %s: %w", tplName, err)
	}
	u, err := e.urlFor(name)
	if err == nil {
		err = created(ctx, u, n, e.kind)
	}
	if err != nil {
		_ = e.drop(name)
		return "", fmt.Errorf("copying template %s: %w", tplName, err)
	}
	return name, nil
}

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
	return openPool(t, NewURLFromTemplate(t, key, build))
}

// NewURLFromTemplate is NewFromTemplate for tests that open their own
// pools or start processes: it returns the URL of the test's database,
// which is dropped when the test ends (close connections to it in
// cleanups registered after this call).
func NewURLFromTemplate(t testing.TB, key string, build func(ctx context.Context, pool *pgxpool.Pool) error) string {
	t.Helper()
	e := mustSetup(t)
	if e.kind == dbserver.Cockroach {
		u := NewURL(t)
		ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
		defer cancel()
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatalf("testdb: connect: %v", err)
		}
		err = build(ctx, pool)
		pool.Close()
		if err != nil {
			t.Fatalf("testdb: building %s: %v", key, err)
		}
		return u
	}
	tpl := e.template(t, "", key, build)
	return e.takeCopy(t, key, tpl)
}

// A Step is one state of a series of database states built one upon the
// other (NewFromSteps): Key names it among the states that follow the same
// steps before it, Build brings a copy of the state before it (an empty
// database for the first step) to it.
type Step struct {
	Key   string
	Build func(ctx context.Context, pool *pgxpool.Pool) error
}

// NewFromSteps is NewFromTemplate for states that follow one another (a
// table filled, then analyzed, then changed again): the template of each
// step is a copy of the template of the step before it that the step's
// Build changed, built once per test binary and series of keys, so that
// tests of different states share the work of the states before theirs.
// The test's database is a copy of the last step's template. On
// CockroachDB every Build runs, in order, on the test's database. A series
// of one step is NewFromTemplate with its key.
func NewFromSteps(t testing.TB, steps ...Step) *pgxpool.Pool {
	t.Helper()
	return openPool(t, NewURLFromSteps(t, steps...))
}

// NewURLFromSteps is NewFromSteps for tests that open their own pools: it
// returns the URL of the test's database, which is dropped when the test
// ends.
func NewURLFromSteps(t testing.TB, steps ...Step) string {
	t.Helper()
	if len(steps) == 0 {
		t.Fatalf("testdb: NewURLFromSteps without a step")
	}
	e := mustSetup(t)
	if e.kind == dbserver.Cockroach {
		u := NewURL(t)
		ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
		defer cancel()
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatalf("testdb: connect: %v", err)
		}
		defer pool.Close()
		for _, st := range steps {
			if err := st.Build(ctx, pool); err != nil {
				t.Fatalf("testdb: building %s: %v", st.Key, err)
			}
		}
		return u
	}
	var tpl *template
	key := ""
	for i, st := range steps {
		if i > 0 {
			key += " / "
		}
		key += st.Key
		base := ""
		if tpl != nil {
			base = tpl.name
		}
		tpl = e.template(t, base, key, st.Build)
	}
	return e.takeCopy(t, key, tpl)
}

// template returns the template of key, built by build on a copy of the
// template database base ("": on an empty database) by the first call.
func (e *env) template(t testing.TB, base, key string, build func(ctx context.Context, pool *pgxpool.Pool) error) *template {
	t.Helper()
	templatesMu.Lock()
	tpl := templates[key]
	if tpl == nil {
		tpl = &template{}
		templates[key] = tpl
	}
	templatesMu.Unlock()
	tpl.once.Do(func() { tpl.name, tpl.size, tpl.err = e.buildTemplate(base, key, build) })
	if tpl.err != nil {
		t.Fatalf("testdb: template %s: %v", key, tpl.err)
	}
	return tpl
}

// takeCopy gives the test a copy of tpl (the template of key), dropped when
// the test ends, and returns its URL.
func (e *env) takeCopy(t testing.TB, key string, tpl *template) string {
	t.Helper()
	name, err := tpl.take(e)
	if err != nil {
		t.Fatalf("testdb: %s: %v", key, err)
	}
	t.Cleanup(func() { e.dropLater(name) })
	u, err := e.urlFor(name)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return u
}

// buildTemplate makes a database (empty, or a copy of the template
// database base), runs build on it and closes every connection to it, so
// that CREATE DATABASE may copy it.
func (e *env) buildTemplate(base, key string, build func(ctx context.Context, pool *pgxpool.Pool) error) (string, int64, error) {
	// Without the fault model: building the template is the harness's own
	// work (the copies get the model).
	ctx, cancel := context.WithTimeout(context.Background(), templateTimeout)
	defer cancel()
	var name, u string
	var err error
	if base == "" {
		name, u, _, err = e.createPlain()
	} else {
		name, _ = newName()
		if u, err = e.urlFor(name); err == nil {
			if _, err = e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{base}.Sanitize()); err != nil {
				err = fmt.Errorf("copying template %s: %w", base, err)
			}
		}
	}
	if err != nil {
		return "", 0, err
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		_ = e.drop(name)
		return "", 0, fmt.Errorf("connect: %w", err)
	}
	err = build(ctx, pool)
	pool.Close()
	if err != nil {
		_ = e.drop(name)
		return "", 0, err
	}
	e.mu.Lock()
	e.templates = append(e.templates, name)
	e.mu.Unlock()
	var size int64
	if err := e.admin.QueryRow(ctx, `SELECT pg_database_size($1)`, name).Scan(&size); err != nil {
		size = maxSpareSize + 1 // unknown: no spares
	}
	return name, size, nil
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
