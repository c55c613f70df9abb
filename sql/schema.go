package sql

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Version is the schema version this code expects. Apply brings a database
// to it; Check reports a database at any other version.
const Version = 1

//go:embed schema.sql
var schemaFile string

//go:embed cockroach.sql
var cockroachFile string

// SchemaSQL returns the schema file with the default table names, exactly as
// shipped in sql/schema.sql.
func SchemaSQL() string { return schemaFile }

// CockroachSQL returns the CockroachDB-only settings, exactly as shipped in
// sql/cockroach.sql.
func CockroachSQL() string { return cockroachFile }

// Errors returned by Check and Apply, and wrapped by the other packages when
// a statement fails because the schema is not in place.
var (
	// ErrSchemaMissing means the crdbwork tables do not exist in the database.
	ErrSchemaMissing = errors.New("crdbwork schema is missing: apply it first (sql.Apply in Go, `demo migrate`, or `psql -f sql/schema.sql` / `cockroach sql --file sql/schema.sql`)")
	// ErrSchemaOutdated means the tables exist at an older version.
	ErrSchemaOutdated = errors.New("crdbwork schema is older than this code: apply the current schema (sql.Apply or `demo migrate`)")
	// ErrSchemaNewer means the tables were created by a newer crdbwork.
	ErrSchemaNewer = errors.New("crdbwork schema is newer than this code: upgrade crdbwork")
)

// DB is what this package needs of a connection: a *pgxpool.Pool, *pgx.Conn
// or pgx.Tx all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Tables names the crdbwork tables. The zero value means the default names
// (crdbwork_sessions, crdbwork_items, ...) in the connection's search path.
type Tables struct {
	// Schema, if set, qualifies every table ("work" gives "work"."crdbwork_items").
	// Apply creates it if it does not exist.
	Schema string
	// Prefix replaces "crdbwork_" at the start of every table, index and
	// constraint name. Empty means "crdbwork_".
	Prefix string
}

const defaultPrefix = "crdbwork_"

// tableNames are the schema's tables, by suffix; other crdbwork_ names in the
// schema file are indexes and constraints, which are never schema-qualified.
var tableNames = map[string]bool{
	"sessions": true, "queues": true, "session_parts": true,
	"items": true, "dead_items": true, "schema_version": true,
}

var identPattern = regexp.MustCompile(`\bcrdbwork_[a-z_]+\b`)

func (t Tables) prefix() string {
	if t.Prefix == "" {
		return defaultPrefix
	}
	return t.Prefix
}

// Validate reports a prefix or schema that cannot name tables.
func (t Tables) Validate() error {
	for _, s := range []string{t.Schema, t.Prefix} {
		if strings.ContainsRune(s, 0) {
			return fmt.Errorf("crdbwork tables: names must not contain NUL bytes")
		}
	}
	if len(t.prefix())+len("session_parts_one_owner") > 63 {
		return fmt.Errorf("crdbwork tables: prefix %q is too long (identifiers are limited to 63 bytes)", t.Prefix)
	}
	return nil
}

// name returns the quoted name for a crdbwork_ identifier of the schema file.
func (t Tables) name(ident string) string {
	suffix := strings.TrimPrefix(ident, defaultPrefix)
	id := pgx.Identifier{t.prefix() + suffix}
	if t.Schema != "" && tableNames[suffix] {
		id = pgx.Identifier{t.Schema, t.prefix() + suffix}
	}
	return id.Sanitize()
}

// Table returns the quoted, qualified name of one table, by its default name
// without the prefix: Table("items") is "crdbwork_items" by default.
func (t Tables) Table(suffix string) string { return t.name(defaultPrefix + suffix) }

// rewrite renames every crdbwork_ identifier of a SQL text.
func (t Tables) rewrite(text string) string {
	return identPattern.ReplaceAllStringFunc(text, t.name)
}

// statements splits a SQL file into its statements, dropping comments.
func statements(file string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(file, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// Dialect is the SQL engine behind a connection.
type Dialect int

// The engines crdbwork runs on.
const (
	Postgres Dialect = iota
	Cockroach
)

// String returns "postgres" or "cockroach".
func (d Dialect) String() string {
	if d == Cockroach {
		return "cockroach"
	}
	return "postgres"
}

// DetectDialect asks the server which engine it is.
func DetectDialect(ctx context.Context, db DB) (Dialect, error) {
	var v string
	if err := db.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		return Postgres, fmt.Errorf("crdbwork: asking the server for its version: %w", err)
	}
	if strings.Contains(v, "CockroachDB") {
		return Cockroach, nil
	}
	return Postgres, nil
}

// Apply creates or upgrades the crdbwork schema. It is idempotent: applying it
// to a current schema changes nothing. It refuses a schema newer than Version.
func Apply(ctx context.Context, db DB, t Tables) error {
	if err := t.Validate(); err != nil {
		return err
	}
	current, err := installedVersion(ctx, db, t)
	switch {
	case errors.Is(err, ErrSchemaMissing):
	case err != nil:
		return err
	case current > Version:
		return fmt.Errorf("%w (database has version %d, this code %d)", ErrSchemaNewer, current, Version)
	}
	dialect, err := DetectDialect(ctx, db)
	if err != nil {
		return err
	}
	var stmts []string
	if t.Schema != "" {
		stmts = append(stmts, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize())
	}
	stmts = append(stmts, statements(t.rewrite(schemaFile))...)
	if dialect == Cockroach {
		stmts = append(stmts, statements(t.rewrite(cockroachFile))...)
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			return fmt.Errorf("crdbwork: applying schema: %w\nstatement: %s", err, s)
		}
	}
	return nil
}

// Check reports whether the schema is in place at this code's version:
// nil, or an error wrapping ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaNewer.
func Check(ctx context.Context, db DB, t Tables) error {
	v, err := installedVersion(ctx, db, t)
	if err != nil {
		return err
	}
	switch {
	case v < Version:
		return fmt.Errorf("%w (database has version %d, this code %d)", ErrSchemaOutdated, v, Version)
	case v > Version:
		return fmt.Errorf("%w (database has version %d, this code %d)", ErrSchemaNewer, v, Version)
	}
	return nil
}

func installedVersion(ctx context.Context, db DB, t Tables) (int64, error) {
	var v int64
	err := db.QueryRow(ctx, "SELECT version FROM "+t.Table("schema_version")).Scan(&v)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("%w (the version table %s is empty)", ErrSchemaMissing, t.Table("schema_version"))
	case err != nil:
		return 0, Classify(err)
	}
	return v, nil
}

// Classify turns a "relation does not exist" error into one that wraps
// ErrSchemaMissing, keeping the original error in the chain. Other errors are
// returned unchanged.
func Classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("%w: %w", ErrSchemaMissing, err)
	}
	return err
}
