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
// Store is the driver boundary: every statement crdbwork runs on its tables
// (sessions, parts, claims, acks, the reaper, enqueue, inspection, the
// operator commands, the demo's checks) is a typed method of Store, rendered
// once per set of table names, with its text unexported. The business logic
// in the other packages never builds SQL; the EXPLAIN tests of this package
// check every statement's plan. Store is low-level and unstable: applications
// use the claim, session, partition and worker packages.
package sql
