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
// sessions.go, …); X_sql.go holds the statements of the methods of X.go.
//
// The package is internal: its methods follow what crdbwork's own packages
// need and change between versions without notice. Applications use the
// claim, session, partition and worker packages; the schema itself (the
// files, Apply, Check, the versions) is package sql.
package store
