// Package sql is crdbwork's schema and its versions, for both CockroachDB
// and PostgreSQL.
//
// The schema is one plain file, schema.sql, that applies unchanged with
// `cockroach sql` or `psql`; numbered migrations (migrations/NNNN_*.sql,
// see Migrations) upgrade an existing database in place. Apply runs the same
// files through Go, with the table names rewritten for a configured prefix
// or schema (always quoted, see Tables): the schema file for a fresh
// install, the migrations above the installed version otherwise. The few
// CockroachDB-only statements live beside it in cockroach.sql and are
// applied, best-effort, only when the server is CockroachDB. Check tells
// whether a database serves this code (Version, Serves), with
// ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaNewer otherwise;
// docs/schema.md says what running workers see during an upgrade.
//
// Apply also installs the SQL function crdbwork_enqueue
// (EnqueueFunctionSQL), an enqueue from any language
// (docs/enqueue-from-sql.md).
//
// The statements crdbwork runs on these tables are not part of this
// package: the claim, session, partition and worker packages run them.
package sql
