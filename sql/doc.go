// Package sql holds crdbwork's schema and every SQL statement the other
// packages run, for both CockroachDB and PostgreSQL.
//
// The schema is one plain file, schema.sql, that applies unchanged with
// `cockroach sql` or `psql`; numbered migrations (migrations/NNNN_*.sql,
// see Migrations) upgrade an existing database in place. Apply runs the same
// files through Go, with the table names rewritten for a configured prefix
// or schema (always quoted): the schema file for a fresh install, the
// migrations above the installed version otherwise. The few CockroachDB-only
// statements live beside it in cockroach.sql and are applied, best-effort,
// only when the server is CockroachDB. docs/schema.md says what running
// workers see during an upgrade.
//
// Statements renders the queries of packages session, partition and claim for
// one set of table names. Keeping the text here is the driver boundary: the
// business logic in those packages never builds SQL itself.
package sql
