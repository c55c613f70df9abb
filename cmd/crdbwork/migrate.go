package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/cli"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func cmdMigrate(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var dryRun bool
	f := prog.NewFlagSet(name, `Creates the crdbwork schema (sql/schema.sql) in the tables --schema and
--prefix name, or upgrades an older one in place (the numbered migrations of
sql/migrations above its version, each idempotent; workers of the old version
may keep running meanwhile). It creates crdbwork's tables only, never the
demo's. On CockroachDB it also applies sql/cockroach.sql best-effort: a
cluster that refuses its zone settings (CockroachDB Cloud Basic/Serverless)
gets a warning, and the schema is still complete. It also creates (or
replaces) the SQL function crdbwork_enqueue, which enqueues from any language
(docs/enqueue-from-sql.md); a CockroachDB cluster older than 24.1 refuses it
with a warning. On a schema that is up to date
(its version, every table there) it writes nothing, so a role that may only
read can run it; --repair applies the statements all the same. A schema newer than this binary is refused (exit status 2), unless
it still serves this binary's version. With --dry-run it says what it would
do and changes nothing. It prints the oldest code version the schema serves:
workers and commands of that version and newer keep working on it.`)
	g.register(f, "not used by migrate")
	f.BoolVar(&dryRun, "dry-run", false, "only say what it would do; change nothing")
	var repair bool
	f.BoolVar(&repair, "repair", false, "apply the schema's statements even when it is up to date (re-creates a dropped index or function; needs the owner's privileges)")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := f.RequireURL(g.databaseURL); err != nil {
		return err
	}
	t := g.tables()
	if err := t.Validate(); err != nil {
		return f.UsageError("--schema or --prefix: %v", err)
	}
	opened.url, opened.tables = g.databaseURL, t
	pool, err := cli.Connect(ctx, g.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	engine := cli.EngineName(ctx, pool)
	from := cli.InstalledVersion(ctx, pool, t)
	// Up to date (the version, every table): nothing to write.
	upToDate := from == crsql.Version && cli.RequireSchema(ctx, pool, t) == nil
	if dryRun {
		var steps []string
		switch {
		case from == 0:
			steps = append(steps, "create the schema from sql/schema.sql")
		case from > crsql.Version:
			return cli.Failf(2, "the crdbwork schema is at version %d, newer than this binary's %d: use a newer crdbwork", from, crsql.Version)
		default:
			for _, m := range crsql.Migrations() {
				if int64(m.Version) > from {
					steps = append(steps, "apply "+m.Name)
				}
			}
			switch {
			case len(steps) > 0:
			case upToDate && !repair:
				steps = append(steps, fmt.Sprintf("nothing: the schema is at version %d", from))
			default:
				steps = append(steps, "apply sql/schema.sql again (it re-creates what is missing: a table, index or function)")
			}
		}
		if from < crsql.Version {
			steps = append(steps, "create the SQL function crdbwork_enqueue (sql/enqueue_function.sql; on CockroachDB sql/cockroach_enqueue_function.sql, best-effort)")
		}
		if g.json {
			return cli.PrintJSON(out, map[string]any{"dry_run": true, "engine": engine, "schema_version": from, "target_version": crsql.Version,
				"steps": steps, "tables": t.Table("items")})
		}
		out.Printf("would bring the crdbwork schema (tables like %s, on %s) from version %d to %d:\n", t.Table("items"), engine, from, crsql.Version)
		for _, s := range steps {
			out.Printf("  %s\n", s)
		}
		return nil
	}
	if upToDate && !repair {
		_, serves, err := crsql.Installed(ctx, pool, t)
		if err != nil {
			return cli.Failf(1, "reading the schema version: %v", err)
		}
		if g.json {
			return cli.PrintJSON(out, map[string]any{"migrated": false, "engine": engine, "schema_version": crsql.Version,
				"previous_version": from, "serves": serves, "warnings": []string{}})
		}
		out.Printf("the crdbwork schema is at version %d (%s): nothing to do\n", crsql.Version, engine)
		out.Printf("it serves code of version %d and newer (workers of those versions keep working on it)\n", serves)
		return nil
	}
	var warnings []string
	err = crsql.ApplyWith(ctx, pool, t, crsql.ApplyOptions{Warn: func(msg string) { warnings = append(warnings, msg) }})
	if err != nil {
		if errors.Is(err, crsql.ErrSchemaNewer) {
			return cli.Failf(2, "%v", err)
		}
		return cli.Failf(1, "applying the crdbwork schema: %v", err)
	}
	_, serves, err := crsql.Installed(ctx, pool, t)
	if err != nil {
		return cli.Failf(1, "reading the schema version after migrating: %v", err)
	}
	for _, w := range warnings {
		out.Errorf("crdbwork migrate: warning: %s", cli.OneLine(w))
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"migrated": true, "engine": engine, "schema_version": crsql.Version,
			"previous_version": from, "serves": serves, "warnings": append([]string{}, warnings...)})
	}
	switch {
	case from == 0:
		out.Printf("created the crdbwork schema, version %d (%s)\n", crsql.Version, engine)
	case from < crsql.Version:
		out.Printf("upgraded the crdbwork schema from version %d to %d (%s)\n", from, crsql.Version, engine)
	default:
		out.Printf("the crdbwork schema is at version %d (%s)\n", crsql.Version, engine)
	}
	out.Printf("it serves code of version %d and newer (workers of those versions keep working on it)\n", serves)
	return nil
}
