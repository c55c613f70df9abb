// Package names renders crdbwork's table, index and function names for a
// schema and a prefix: the one table-name rewriting that package sql (to
// apply the schema files) and internal/store (to render its statements)
// share.
package names

import (
	"errors"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultPrefix starts every crdbwork identifier of the schema files and
// the statements' texts.
const DefaultPrefix = "crdbwork_"

// tables are the schema's tables, by suffix; other crdbwork_ names in the
// schema file are indexes and constraints, which are never schema-qualified.
var tables = map[string]bool{
	"sessions": true, "queues": true, "session_parts": true,
	"items": true, "dead_items": true, "schema_version": true,
	"tenant_limits": true, "schedules": true, "session_queues": true, "ended": true,
	"audit":   true,
	"waiting": true, "waits_for": true, // dependencies (version 5)
	"cancelled_items": true, // cancelled items kept for a requeue (version 6)
	"waits_across":    true, // cross-queue prerequisites (version 6)
	"attempt_errors":  true, // items' failed attempts (version 6)
	"reaps":           true, // reap turns (version 6)
}

// routines are the schema's functions, by suffix: qualified with the
// schema like the tables.
var routines = map[string]bool{"enqueue": true}

// Tables returns the suffixes of the schema's tables (unordered).
func Tables() []string {
	out := make([]string, 0, len(tables))
	for s := range tables {
		out = append(out, s)
	}
	return out
}

var identPattern = regexp.MustCompile(`\bcrdbwork_[a-z_]+\b`)

// Prefix returns the prefix that replaces DefaultPrefix: p, or DefaultPrefix
// if p is empty.
func Prefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	return p
}

// Name returns the quoted name, for schema and prefix, of a crdbwork_
// identifier of the schema file: tables and functions are qualified with
// the schema (if set), indexes and constraints never.
func Name(schema, prefix, ident string) string {
	suffix := strings.TrimPrefix(ident, DefaultPrefix)
	id := pgx.Identifier{Prefix(prefix) + suffix}
	if schema != "" && (tables[suffix] || routines[suffix]) {
		id = pgx.Identifier{schema, Prefix(prefix) + suffix}
	}
	return id.Sanitize()
}

var dropIndexPattern = regexp.MustCompile(`(DROP INDEX IF EXISTS )(crdbwork_[a-z_]+)\b`)

// Rewrite renames every crdbwork_ identifier of a SQL text for schema and
// prefix. An index named by DROP INDEX is qualified with the schema (CREATE
// INDEX names are not: an index always lives in its table's schema). Both
// engines accept a schema-qualified index name there: PostgreSQL's DROP
// INDEX takes one, and CockroachDB's grammar (sql.y: table_index_name is
// table@index or a standalone_index_name, itself a db_object_name) does
// too; its docs show the table@index form, which PostgreSQL refuses.
func Rewrite(schema, prefix, text string) string {
	text = dropIndexPattern.ReplaceAllStringFunc(text, func(m string) string {
		sub := dropIndexPattern.FindStringSubmatch(m)
		id := pgx.Identifier{Prefix(prefix) + strings.TrimPrefix(sub[2], DefaultPrefix)}
		if schema != "" {
			id = pgx.Identifier{schema, id[0]}
		}
		return sub[1] + "\x00" + id.Sanitize() + "\x00"
	})
	// The \x00 marks keep the already rendered name from being renamed again.
	parts := strings.Split(text, "\x00")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = identPattern.ReplaceAllStringFunc(parts[i], func(ident string) string { return Name(schema, prefix, ident) })
	}
	return strings.Join(parts, "")
}

// MissingRelation reports whether err is the server's "relation does not
// exist" or "schema does not exist" (SQLSTATE 42P01, 3F000): the schema is
// not in place.
func MissingRelation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000")
}
