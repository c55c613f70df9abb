package main

import (
	"context"

	crsql "github.com/crdbwork/crdbwork/sql"
)

func cmdMigrate(ctx context.Context, name string, args []string, out *console) error {
	var c common
	f := newFlagSet(name, `Creates the crdbwork schema (sql/schema.sql), or upgrades an older one in place
(the numbered migrations of sql/migrations above its version, each idempotent;
workers of the old version may keep running meanwhile), then creates the demo's
tables (demo_results, demo_enqueued). On CockroachDB it also applies
sql/cockroach.sql best-effort: a cluster that refuses its zone settings
(CockroachDB Cloud Basic/Serverless) gets a warning, and the schema is still
complete. Running it again changes nothing. A schema newer than this binary
is refused (exit status 2), unless it still serves this binary's version.
It prints the oldest code version the schema serves: workers and commands of
that version and newer keep working on it (a rolling upgrade).`)
	c.register(f, urlRequired)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := connect(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrate(ctx, pool)
	if err != nil {
		return err
	}
	engine := engineName(ctx, pool)
	_, serves, err := crsql.Installed(ctx, pool, tables)
	if err != nil {
		return failf(1, "reading the schema version after migrating: %v", err)
	}
	for _, w := range m.Warnings {
		out.errorf("demo migrate: warning: %s", oneLine(w))
	}
	if c.json {
		return printJSON(out, map[string]any{"migrated": true, "engine": engine, "schema_version": m.To,
			"previous_version": m.From, "serves": serves, "warnings": append([]string{}, m.Warnings...)})
	}
	switch {
	case m.From == 0:
		out.printf("created the crdbwork schema, version %d, and the demo tables (%s)\n", m.To, engine)
	case m.From < m.To:
		out.printf("upgraded the crdbwork schema from version %d to %d; the demo tables are in place (%s)\n", m.From, m.To, engine)
	default:
		out.printf("the crdbwork schema is at version %d and the demo tables are in place (%s)\n", m.To, engine)
	}
	out.printf("it serves code of version %d and newer (workers of those versions keep working on it)\n", serves)
	return nil
}
