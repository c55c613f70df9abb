package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// newSchemaDB returns a pool on a fresh database of the test with
// crdbwork's schema, default table names (internal/testschema: a copy of a
// template built once per test binary). The pool is closed and the
// database dropped when the test ends.
func newSchemaDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testschema.New(t)
}
