package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/session"
)

// purgeJSON is a purge's counts.
type purgeJSON struct {
	Items        int64 `json:"items"`
	Dead         int64 `json:"dead_items"`
	Ended        int64 `json:"ended_ids"`
	OwnedParts   int64 `json:"owned_parts"`
	TenantLimits int64 `json:"tenant_limits"`
	Schedules    int64 `json:"schedules"`
	QueueRow     bool  `json:"queue_row"`
}

func toPurgeJSON(c claim.PurgeCounts) purgeJSON {
	return purgeJSON{Items: c.Items, Dead: c.Dead, Ended: c.Ended, OwnedParts: c.OwnedParts, TenantLimits: c.TenantLimits,
		Schedules: c.Schedules, QueueRow: c.Stored}
}

// describePurge lists the rows of c for people.
func describePurge(c claim.PurgeCounts) string {
	parts := []string{
		plural(int(c.Items), "item"), plural(int(c.Dead), "dead item"), plural(int(c.Ended), "ended id"),
		plural(int(c.OwnedParts), "owned part"), plural(int(c.TenantLimits), "tenant limit"),
		plural(int(c.Schedules), "schedule mark"),
	}
	if c.Stored {
		parts = append(parts, "its settings row (part count, settings, pause)")
	}
	return strings.Join(parts, ", ")
}

func cmdPurge(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var cf confirmFlags
	f := prog.NewFlagSet(name, `Deletes everything of --queue: its items (claimed ones too), dead items,
ended ids (the dedup window), owned parts, tenant limits, schedule marks and
settings row (part count, settings, pause). Other queues are not touched. It
says what it will delete, with counts, and needs --yes (--dry-run only shows
it). The large tables are deleted in batches, with progress on stderr. Stop
the queue's workers first: running ones set the queue up again.`)
	g.register(f, queueRequired)
	cf.register(f)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := cf.check(f); err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	plan, err := q.Purge(ctx, claim.PurgeOptions{DryRun: true})
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	members, err := session.Members(ctx, pool, g.tables(), g.queue)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if cf.dryRun || !cf.yes {
		switch {
		case cf.dryRun && g.json:
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "dry_run": true, "would_delete": toPurgeJSON(plan), "live_members": len(members)})
		case cf.dryRun:
			out.Printf("would delete from queue %q: %s\n", g.queue, describePurge(plan))
			if len(members) > 0 {
				out.Printf("warning: %s the queue: stop them first\n", verb(len(members), "live session works", "live sessions work"))
			}
			return nil
		}
		out.Errorf("crdbwork purge: this would delete from queue %q: %s", g.queue, describePurge(plan))
		return refuse(f)
	}
	if len(members) > 0 {
		out.Errorf("crdbwork purge: warning: %s queue %q: they will set it up again", verb(len(members), "live session works", "live sessions work"), g.queue)
	}
	done, err := q.Purge(ctx, claim.PurgeOptions{Progress: func(c claim.PurgeCounts) {
		if !g.json {
			out.Progress(fmt.Sprintf("purging %q: %d of %d items, %d of %d dead items, %d of %d ended ids…",
				g.queue, c.Items, plan.Items, c.Dead, plan.Dead, c.Ended, plan.Ended), false)
		}
	}})
	out.EndProgress()
	if err != nil {
		return cli.Failf(1, "%v (deleted so far: %s)", err, describePurge(done))
	}
	recordAudit(ctx, pool, &g, out, "purge", "deleted "+describePurge(done))
	return report(out, &g, map[string]any{"queue": g.queue, "deleted": toPurgeJSON(done)},
		fmt.Sprintf("purged queue %q: deleted %s\n", g.queue, describePurge(done)))
}
