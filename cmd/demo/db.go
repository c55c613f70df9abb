package main

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/cli"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// tables are the crdbwork table names the demo uses: the defaults.
var tables = crsql.Tables{}

// prog is the demo binary for the shared command-line plumbing: its name
// in messages, and DEMO_ before its flags' variables.
var prog = cli.Program{Name: "demo", EnvPrefix: "DEMO_", URLVars: []string{"DATABASE_URL"}}

// migration is what migrate did.
type migration struct {
	From     int64    // the version before (0: no schema)
	To       int64    // the version after
	Warnings []string // things Apply did not do (CockroachDB zone settings it was refused)
}

// migrate creates or upgrades the crdbwork schema in place (crsql.ApplyWith:
// only the migrations above the installed version) and creates the demo
// tables.
func migrate(ctx context.Context, db crsql.DB) (migration, error) {
	m := migration{To: crsql.Version}
	m.From = cli.InstalledVersion(ctx, db, tables)
	err := crsql.ApplyWith(ctx, db, tables, crsql.ApplyOptions{Warn: func(msg string) { m.Warnings = append(m.Warnings, msg) }})
	if err != nil {
		if errors.Is(err, crsql.ErrSchemaNewer) {
			return m, cli.Failf(2, "%v", err)
		}
		return m, cli.Failf(1, "applying the crdbwork schema: %v", err)
	}
	return m, ensureDemoTables(ctx, db)
}

// ensureDemoTables creates the demo's own tables (demo_results,
// demo_enqueued) if they are missing: the demo makes what it uses, and an
// operator's `crdbwork migrate` creates only crdbwork's schema. Processes
// that start together (a producer and workers) may race to create them:
// PostgreSQL then fails the loser's CREATE ... IF NOT EXISTS with a unique
// violation on its catalog, and the statement is tried again (it finds the
// table then).
func ensureDemoTables(ctx context.Context, db crsql.DB) error {
	for _, s := range demoTablesSQL {
		if _, err := db.Exec(ctx, s); err != nil {
			return m, failf(1, "creating the demo tables: %v", err)
		}
	}
	return m, nil
}

// installedVersion reads the schema version row: 0 when there is none.
func installedVersion(ctx context.Context, db crsql.DB) int64 {
	v, _, err := crsql.Installed(ctx, db, tables)
	if err != nil {
		return 0
	}
	return v
}

// engineName asks the server which engine it is.
func engineName(ctx context.Context, db crsql.DB) string {
	d, err := crsql.DetectDialect(ctx, db)
	if err != nil {
		return "unknown"
	}
	return d.String()
}

// raced reports an error of a CREATE ... IF NOT EXISTS that lost a race
// with the same statement: a unique violation (23505), a duplicate table or
// object (42P07, 42710), or a retryable transaction error (40001).
func raced(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", "42P07", "42710", "40001":
		return true
	}
	return false
}

// verbose reports whether level shows info logs.
func verbose(level string) bool {
	l := strings.ToLower(level)
	return l == "debug" || l == "info"
}
