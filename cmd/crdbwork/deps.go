package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/fleet"
)

// depsJSON is what `crdbwork deps --json` prints.
type depsJSON struct {
	Queue      string `json:"queue"`
	ID         string `json:"id"`
	Waiting    bool   `json:"waiting"`
	Remaining  int64  `json:"remaining"`
	EnqueuedAt string `json:"enqueued_at,omitempty"`
	// RunAfter lists the ends of a prerequisite after which the item runs
	// anyway ("died", "cancelled"; NewItem.RunAfter).
	RunAfter   []string     `json:"run_after"`
	Prereqs    []prereqJSON `json:"prereqs"`
	Dependents []string     `json:"dependents"`
	// DependentsIn are the items of other queues that wait for it
	// (NewItem.AfterIn).
	DependentsIn []prereqJSON `json:"dependents_in"`
	// State and StateQueue say where a item that is not waiting is (the
	// state of crdbwork item: queued, claimed, dead, acked, …; "" when
	// found nowhere).
	State      string `json:"state,omitempty"`
	StateQueue string `json:"state_queue,omitempty"`
}

type prereqJSON struct {
	ID string `json:"id"`
	// Queue is the item's queue when it is not --queue (a prerequisite
	// of another queue, NewItem.AfterIn).
	Queue string `json:"queue,omitempty"`
	State string `json:"state,omitempty"`
}

func cmdDeps(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var limit int
	f := prog.NewFlagSet(name, `Shows an item's dependencies in --queue (see docs/dependencies.md): whether it
waits, how many of its prerequisites are not yet acked, each of them with its
state (queued, waiting, or how it ended: acked, taken, dead, cancelled;
an ended one is settled by the workers' reaper within seconds) and its queue
when it is an item of another queue, whether it
runs anyway after a prerequisite that died or was cancelled, and up to
--limit of the items that wait for it. Reads only.`)
	f.MaxArgs, f.ArgName = 1, "ID"
	g.register(f, queueRequired)
	f.IntVar(&limit, "limit", 100, 1, 100_000, "most dependents to list")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if len(f.Args) == 0 {
		return f.UsageError("give the id of an item")
	}
	id, err := parseID(f, f.Args[0])
	if err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := q.Dependencies(ctx, id, limit)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	// Not waiting: say where it is (fleet.Item, the read of crdbwork item).
	var where string
	var found *fleet.ItemView
	if !d.Waiting {
		if found, where, err = locate(ctx, pool, &g, id); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if g.json {
		j := depsJSON{Queue: g.queue, ID: id.String(), Waiting: d.Waiting, Remaining: d.Remaining,
			Prereqs: []prereqJSON{}, Dependents: []string{}, DependentsIn: []prereqJSON{}, RunAfter: []string{}}
		if d.RunAfter != 0 {
			j.RunAfter = strings.Split(d.RunAfter.String(), "|")
		}
		if !d.Waiting {
			j.State, j.StateQueue = found.State, found.Queue
		}
		if d.Waiting {
			j.EnqueuedAt = d.EnqueuedAt.UTC().Format(time.RFC3339Nano)
		}
		for _, p := range d.Prereqs {
			j.Prereqs = append(j.Prereqs, prereqJSON{ID: p.ID.String(), Queue: p.Queue, State: p.State})
		}
		for _, dep := range d.Dependents {
			j.Dependents = append(j.Dependents, dep.String())
		}
		for _, dep := range d.DependentsIn {
			j.DependentsIn = append(j.DependentsIn, prereqJSON{ID: dep.ID.String(), Queue: dep.Queue})
		}
		return cli.PrintJSON(out, j)
	}
	var b strings.Builder
	if d.Waiting {
		fmt.Fprintf(&b, "item %s of queue %q waits for %s (enqueued %s)\n", id, g.queue, plural(int(d.Remaining), "prerequisite"),
			d.EnqueuedAt.UTC().Format(time.RFC3339))
		if d.RunAfter != 0 {
			fmt.Fprintf(&b, "it runs anyway after a prerequisite that %s\n",
				strings.NewReplacer("|", " or ", "cancelled", "was cancelled").Replace(d.RunAfter.String()))
		}
	} else {
		fmt.Fprintf(&b, "item %s of queue %q is not waiting: %s\n", id, g.queue, where)
	}
	for _, p := range d.Prereqs {
		if p.Queue != "" {
			fmt.Fprintf(&b, "  after %s  %s  (queue %q)\n", p.ID, p.State, p.Queue)
			continue
		}
		fmt.Fprintf(&b, "  after %s  %s\n", p.ID, p.State)
	}
	switch n := len(d.Dependents) + len(d.DependentsIn); {
	case n == 0:
		b.WriteString("no item waits for it\n")
	case len(d.Dependents) == limit || len(d.DependentsIn) == limit:
		fmt.Fprintf(&b, "at least %d items wait for it (--limit):\n", n)
	default:
		fmt.Fprintf(&b, "%s for it:\n", verb(n, "item waits", "items wait"))
	}
	for _, dep := range d.Dependents {
		fmt.Fprintf(&b, "  %s\n", dep)
	}
	for _, dep := range d.DependentsIn {
		fmt.Fprintf(&b, "  %s  (queue %q)\n", dep.ID, dep.Queue)
	}
	out.Printf("%s", b.String())
	return nil
}
