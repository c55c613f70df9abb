// Package testschema gives a test a fresh database with crdbwork's schema
// applied (sql.Apply, default table names) in a few milliseconds: the
// schema is applied once per test binary, to a template database that each
// test's database copies (testdb.NewFromTemplate). On CockroachDB, which
// has no template databases, the schema is applied to each test's database.
//
// A test package's setup is then
//
//	func setup(t testing.TB) *pgxpool.Pool { return testschema.New(t) }
//
// and its TestMain calls testdb.Main as before. Package sql's own tests,
// which this package's import of sql would make a cycle, call
// testdb.NewFromTemplate with their own Apply under the key Key.
package testschema

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Key names the template of crdbwork's schema with the default tables
// among a test binary's templates (testdb.NewFromTemplate).
const Key = "crdbwork schema"

// Apply installs crdbwork's schema with the default table names into the
// database of pool: the build of the template, also what testdb.NewLived
// takes.
func Apply(ctx context.Context, pool *pgxpool.Pool) error {
	return crsql.Apply(ctx, pool, crsql.Tables{})
}

// New returns a pool (testdb.DefaultMaxConns connections at most) on a
// fresh database of the test with crdbwork's schema, default table names.
// The pool is closed and the database dropped when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testdb.NewFromTemplate(t, Key, Apply)
}

// NewURL is New for tests that open their own pools or start processes: it
// returns the URL of the test's database, dropped when the test ends
// (close connections to it in cleanups registered after this call).
func NewURL(t testing.TB) string {
	t.Helper()
	return testdb.NewURLFromTemplate(t, Key, Apply)
}
