package sql

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/names"
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

// prefix returns the table prefix ("crdbwork_" if t has none).
func (t Tables) prefix() string { return names.Prefix(t.Prefix) }

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

// Table returns the quoted, qualified name of one table, by its default name
// without the prefix: Table("items") is "crdbwork_items" by default.
func (t Tables) Table(suffix string) string {
	return names.Name(t.Schema, t.Prefix, names.DefaultPrefix+suffix)
}

// rewrite renames every crdbwork_ identifier of a SQL text for t
// (internal/names.Rewrite says how).
func (t Tables) rewrite(text string) string { return names.Rewrite(t.Schema, t.Prefix, text) }

// Pool is a database that runs statements and starts transactions: a
// *pgxpool.Pool or a *pgx.Conn satisfies it (a pgx.Tx does not: it is a DB
// only). It is the one database type of crdbwork's packages: claim.DB,
// partition.DB and worker.DB are this type, under the name their package
// documents.
type Pool interface {
	DB
	// BeginTx starts a transaction with opts.
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}
