package main

import (
	"context"

	crsql "github.com/crdbwork/crdbwork/sql"
)

func cmdMigrate(ctx context.Context, name string, args []string, out *console) error {
	var c common
	f := newFlagSet(name, `Applies the crdbwork schema (sql/schema.sql, plus sql/cockroach.sql on
CockroachDB) and the demo's tables (demo_results, demo_enqueued) to the database.
It is idempotent: running it again changes nothing.`)
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
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	engine := engineName(ctx, pool)
	if c.json {
		return printJSON(out, map[string]any{"migrated": true, "engine": engine, "schema_version": crsql.Version})
	}
	out.printf("crdbwork schema version %d and the demo tables are in place (%s)\n", crsql.Version, engine)
	return nil
}
