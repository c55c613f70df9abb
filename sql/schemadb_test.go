package sql_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// schemaKey names the template of crdbwork's schema with the default table
// names among this binary's templates (internal/testschema, which imports
// this package, gives the other packages the same).
const schemaKey = "crdbwork schema"

// newSchemaDB returns a pool on a fresh database of the test with
// crdbwork's schema (applySchema): a copy of a template built once per test
// binary. The pool is closed and the database dropped when the test ends.
func newSchemaDB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testdb.NewFromTemplate(t, schemaKey, applySchema)
}

// applySchema installs the schema with the default table names: the build
// of the template.
func applySchema(ctx context.Context, pool *pgxpool.Pool) error {
	return crsql.Apply(ctx, pool, crsql.Tables{})
}
