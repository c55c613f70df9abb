package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/crdbwork/crdbwork/internal/names"
	"github.com/crdbwork/crdbwork/sql"
)

// The schema package's names for the tables and the connections, under the
// names the store's methods use.
type (
	// Tables names the crdbwork tables (sql.Tables).
	Tables = sql.Tables
	// DB is a connection that runs statements (sql.DB).
	DB = sql.DB
	// Pool is a DB that also starts transactions (sql.Pool).
	Pool = sql.Pool
)

// defaultPrefix starts every crdbwork identifier of the statements' texts.
const defaultPrefix = names.DefaultPrefix

// rewrite renders a statement's text for t: every crdbwork_ identifier
// renamed for t's prefix and qualified with its schema (internal/names).
func rewrite(t Tables, text string) string { return names.Rewrite(t.Schema, t.Prefix, text) }

// prefix returns t's table prefix ("crdbwork_" if t has none).
func prefix(t Tables) string { return names.Prefix(t.Prefix) }

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

// Classify turns a "relation does not exist" error into one that wraps
// sql.ErrSchemaMissing, keeping the original error in the chain. Other
// errors are returned unchanged.
func Classify(err error) error {
	if names.MissingRelation(err) {
		return fmt.Errorf("%w: %w", sql.ErrSchemaMissing, err)
	}
	return err
}
