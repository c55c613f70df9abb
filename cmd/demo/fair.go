package main

import (
	"context"
	"strings"

	"github.com/crdbwork/crdbwork/partition"
)

func cmdFair(ctx context.Context, name string, args []string, out *console) error {
	var c common
	f := newFlagSet(name, `Shows whether --queue is fair, or makes it fair ("on") or plain ("off"). In a
fair queue, enqueue stamps each tenant's items one turn apart from the queue's
head, so claims take the backlogged tenants' items in turn and a small tenant
waits about one round, not behind a big tenant's backlog (see the README,
"Fairness across tenants"). It applies to items enqueued from then on; the
queue's other settings are kept. A queue without parts yet gets the default
number first (16), as the other commands give it.`)
	f.maxArgs, f.argName = 1, "[on|off]"
	c.register(f, urlRequired)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	set, fair := false, false
	if len(f.args) == 1 {
		switch strings.ToLower(f.args[0]) {
		case "on", "true":
			set, fair = true, true
		case "off", "false":
			set = true
		default:
			return f.usageError("unexpected argument %q: say on or off (or nothing, to show the setting)", f.args[0])
		}
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := q.Settings(ctx)
	if err != nil {
		return failf(1, "%v", err)
	}
	was := st.Fair
	if set {
		if _, err := partition.EnsureParts(ctx, pool, tables, c.queue, defaultParts); err != nil {
			return failf(1, "%v", err)
		}
		st.Fair = fair
		if err := q.Configure(ctx, st); err != nil {
			return failf(1, "%v", err)
		}
	}
	if c.json {
		return printJSON(out, map[string]any{"queue": c.queue, "fair": st.Fair, "was_fair": was})
	}
	word := map[bool]string{true: "fair", false: "plain (first in, first out within a priority)"}
	switch {
	case !set:
		out.printf("queue %q is %s\n", c.queue, word[st.Fair])
	case was == fair:
		out.printf("queue %q was already %s\n", c.queue, word[fair])
	default:
		out.printf("queue %q is now %s, for the items enqueued from now on\n", c.queue, word[fair])
	}
	return nil
}
