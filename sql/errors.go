package sql

import (
	"errors"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/names"
)

// Errors returned by Check and Apply, and wrapped by the other packages when
// a statement fails because the schema is not in place.
var (
	// ErrSchemaMissing means the crdbwork tables do not exist in the database.
	ErrSchemaMissing = errors.New("crdbwork schema is missing: apply it first (sql.Apply, or the file sql/schema.sql)")
	// ErrSchemaOutdated means the tables exist at an older version.
	ErrSchemaOutdated = errors.New("crdbwork schema is older than this code: upgrade it in place (sql.Apply, or the files in sql/migrations/ above its version)")
	// ErrSchemaNewer means the tables were created by a newer crdbwork that
	// no longer serves this code.
	ErrSchemaNewer = errors.New("crdbwork schema is newer than this code and no longer serves it: build with a newer crdbwork release")
)

// ErrBadName is wrapped by the errors that refuse a name the schema cannot
// store (claim.New, partition.New and SetParts: a queue's name;
// claim.SettingsUpdate.TenantLimits: a tenant): too long, not valid UTF-8, or with
// a NUL byte.
var ErrBadName = errors.New("name refused")

// classify turns a "relation does not exist" error into one that wraps
// ErrSchemaMissing, keeping the original error in the chain.
func classify(err error) error {
	if names.MissingRelation(err) {
		return fmt.Errorf("%w: %w", ErrSchemaMissing, err)
	}
	return err
}
