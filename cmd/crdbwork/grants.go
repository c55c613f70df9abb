package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/worker"
)

func cmdGrants(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	f := prog.NewFlagSet(name, `Checks that the database user of the connection has every privilege a worker
needs on the crdbwork tables: what every worker (worker.Run, a Group, demo
work) checks at start, and refuses to start without. Exit 0 when it has them
all; exit 2 with one line naming the user, each table and the privileges it
lacks there, and the GRANT statements that give them (docs/operations.md,
"Roles and grants"). Run it with the workers' URL before deploying them, or
after an upgrade that added tables. It reads the catalog only: it changes
nothing, and needs no grant to run.`)
	g.register(f, "not read: the grants are the same for every queue")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := f.RequireURL(g.databaseURL); err != nil {
		return err
	}
	if err := g.tables().Validate(); err != nil {
		return f.UsageError("--schema or --prefix: %v", err)
	}
	pool, err := cli.Connect(ctx, g.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	err = worker.CheckGrants(ctx, pool, g.tables())
	switch {
	case errors.Is(err, worker.ErrPrivileges):
		// The worker's line, not the server's refusal it may wrap.
		return &cli.ExitError{Code: 2, Msg: err.Error()}
	case err != nil:
		return cli.RequireSchema(ctx, pool, g.tables())
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"worker_grants": true})
	}
	fmt.Fprintln(out.Stdout(), "the database user has every privilege a worker needs on the crdbwork tables")
	return nil
}
