package main

import (
	"context"
	"strings"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/partition"
)

// defaultParts is the part count fair gives a queue without a stored one,
// as a worker would (worker.Options.Parts' default).
const defaultParts = 16

func cmdFair(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	f := prog.NewFlagSet(name, `Shows whether --queue is fair, or makes it fair ("on") or plain ("off"). In a
fair queue, enqueue stamps each tenant's items one turn apart from the queue's
head, so claims take the backlogged tenants' items in turn and a small tenant
waits about one round, not behind a big tenant's backlog (see
docs/fairness.md). It applies to items enqueued from then on; the
queue's other settings are kept. A queue without parts yet gets the default
number first (16), as the other commands give it.`)
	f.MaxArgs, f.ArgName = 1, "[on|off]"
	g.register(f, queueRequired)
	g.registerCreate(f)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	set, fair, err := onOff(f)
	if err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := q.Settings(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	was := st.Fair
	if set {
		if _, err := partition.EnsureParts(ctx, pool, g.tables(), g.queue, defaultParts); err != nil {
			return cli.Failf(1, "%v", err)
		}
		st.Fair = fair
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &st.Policy}); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "fair": st.Fair, "was_fair": was})
	}
	word := map[bool]string{true: "fair", false: "plain (first in, first out within a priority)"}
	switch {
	case !set:
		out.Printf("queue %q is %s\n", g.queue, word[st.Fair])
	case was == fair:
		out.Printf("queue %q was already %s\n", g.queue, word[fair])
	default:
		out.Printf("queue %q is now %s, for the items enqueued from now on\n", g.queue, word[fair])
	}
	return nil
}

// onOff reads the optional on|off argument of a command that shows or sets
// a queue setting (fair, sequence): set reports whether one was given.
func onOff(f *cli.FlagSet) (set, on bool, err error) {
	if len(f.Args) == 0 {
		return false, false, nil
	}
	switch strings.ToLower(f.Args[0]) {
	case "on", "true":
		return true, true, nil
	case "off", "false":
		return true, false, nil
	}
	return false, false, f.UsageError("unexpected argument %q: say on or off (or nothing, to show the setting)", f.Args[0])
}
