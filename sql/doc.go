// Package sql holds crdbwork's schema and every SQL statement the other
// packages run, for both CockroachDB and PostgreSQL.
//
// The schema is one plain file, schema.sql, that applies unchanged with
// `cockroach sql` or `psql`; Apply runs the same file through Go, with the
// table names rewritten for a configured prefix or schema (always quoted). The
// few CockroachDB-only statements live beside it in cockroach.sql and are
// applied only when the server is CockroachDB.
//
// Statements renders the queries of packages session, partition and claim for
// one set of table names. Keeping the text here is the driver boundary: the
// business logic in those packages never builds SQL itself.
package sql
