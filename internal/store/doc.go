// Package store runs every statement crdbwork runs on its tables, for both
// CockroachDB and PostgreSQL: sessions, parts, claims, acks, the reaper,
// enqueue, inspection, the operator commands, the dashboard's reads and the
// demo's checks.
//
// Store is the driver boundary: each statement is a typed method of Store,
// rendered once per set of table names (Tables, package sql's), with its
// text unexported. The business logic in the other packages never builds
// SQL; the EXPLAIN tests of this package check every statement's plan.
// Files are named by table or entity (items_claim.go, dead.go,
// sessions.go, …), and each statement's text stands just above the method
// that runs it (a const, or a var for a text built from templates); New
// renders them all for a set of tables, once.
//
// The package is internal: its methods follow what crdbwork's own packages
// need and change between versions without notice. Applications use the
// claim, session, partition and worker packages; the schema itself (the
// files, Apply, Check, the versions) is package sql.
package store
