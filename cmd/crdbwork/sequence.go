package main

import (
	"context"

	"github.com/crdbwork/crdbwork/internal/cli"
)

func cmdSequence(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	f := prog.NewFlagSet(name, `Shows whether --queue is sequenced, or makes it sequenced ("on") or not
("off"). In a sequenced queue the items enqueued with a key run one at a
time per key, in enqueue order: an item of a key is claimed only once the
key's earlier items were acked (or died), and a failed item holds its key
until it succeeds or dies (see docs/sequences.md). It applies to items
enqueued from then on; "off" leaves the items already sequenced in order
until they end. Turn it on only once every worker of the queue runs
crdbwork 0.5 or newer: older workers run sequenced items out of order (never
two of one key at once: the database refuses that claim). The queue's other
settings are kept.`)
	f.MaxArgs, f.ArgName = 1, "[on|off]"
	g.register(f, queueRequired)
	g.registerCreate(f)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	set, on, err := onOff(f)
	if err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	was, err := q.Sequencing(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	now := was
	if set {
		if err := q.SetSequenced(ctx, on); err != nil {
			return cli.Failf(1, "%v", err)
		}
		if now, err = q.Sequencing(ctx); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "sequenced": now.On, "was_sequenced": was.On, "sequenced_items": now.Items})
	}
	word := map[bool]string{true: "sequenced (one item in flight per key, in enqueue order)", false: "not sequenced"}
	switch {
	case !set:
		out.Printf("queue %q is %s\n", g.queue, word[now.On])
	case was.On == on:
		out.Printf("queue %q was already %s\n", g.queue, word[on])
	default:
		out.Printf("queue %q is now %s, for the items enqueued from now on\n", g.queue, word[on])
	}
	if !now.On && now.Items {
		out.Printf("it still holds sequenced items: they keep their order until they end\n")
	}
	return nil
}
