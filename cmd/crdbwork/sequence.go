package main

import (
	"context"
	"strings"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
)

func cmdSequence(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var key string
	var limit int
	f := prog.NewFlagSet(name, `Shows whether --queue is sequenced, or makes it sequenced ("on") or not
("off"). In a sequenced queue the items enqueued with a key run one at a
time per key, in enqueue order: an item of a key is claimed only once the
key's earlier items were acked (or died), and a failed item holds its key
until it succeeds or dies (see docs/sequences.md). It applies to items
enqueued from then on; "off" leaves the items already sequenced in order
until they end. Turn it on only once every worker of the queue runs
crdbwork 0.5 or newer: older workers run sequenced items out of order (never
two of one key at once: the database refuses that claim). The queue's other
settings are kept.

What a death (attempts used up, permanent failure, crash loop, expiry, or a
cancel) of a sequenced item does to its key: "advance" (the default) lets
the key's next item run; "hold" keeps the key's later items waiting until
the dead item is requeued (it runs at its place, first), deleted from the
dead items, or the key is released. "advance" releases the keys held.
Hold needs every worker at crdbwork 0.6 or newer.

"blocked" lists the keys that cannot run: held by a dead item, or whose
head waits for its retry or delay, with the blocking item (--limit keys).
"release --key K" releases key K from the dead items that hold it (they
stay in the dead items).`)
	f.MaxArgs, f.ArgName = 1, "[on|off|hold|advance|blocked|release]"
	g.register(f, queueRequired)
	g.registerCreate(f)
	f.StringVar(&key, "key", "", "KEY", `the key to release ("release")`, nil)
	f.IntVar(&limit, "limit", 100, 1, 100000, `the most blocked keys to list ("blocked")`)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	verb := ""
	if len(f.Args) > 0 {
		verb = strings.ToLower(f.Args[0])
	}
	if verb != "release" && f.IsSet("key") {
		return f.UsageError("--key is for release")
	}
	if verb != "blocked" && f.IsSet("limit") {
		return f.UsageError("--limit is for blocked")
	}
	switch verb {
	case "hold", "advance":
		return sequenceHold(ctx, f, &g, verb == "hold", out)
	case "blocked":
		return sequenceBlocked(ctx, f, &g, limit, out)
	case "release":
		if key == "" {
			return f.UsageError("release needs --key")
		}
		return sequenceRelease(ctx, f, &g, key, out)
	}
	set, on, err := onOff(f)
	if err != nil {
		return f.UsageError("unexpected argument %q: say on, off, hold, advance, blocked or release (or nothing, to show the setting)", f.Args[0])
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	was, err := q.Settings(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	now := was
	if set {
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: toggle(on)}); err != nil {
			return cli.Failf(1, "%v", err)
		}
		if now, err = q.Settings(ctx); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "sequenced": now.Sequenced, "was_sequenced": was.Sequenced, "sequenced_items": now.SequencedItems,
			"on_death": onDeath(now.SequenceHold)})
	}
	word := map[bool]string{true: "sequenced (one item in flight per key, in enqueue order)", false: "not sequenced"}
	switch {
	case !set:
		out.Printf("queue %q is %s\n", g.queue, word[now.Sequenced])
	case was.Sequenced == on:
		out.Printf("queue %q was already %s\n", g.queue, word[on])
	default:
		out.Printf("queue %q is now %s, for the items enqueued from now on\n", g.queue, word[on])
	}
	if !now.Sequenced && now.SequencedItems {
		out.Printf("it still holds sequenced items: they keep their order until they end\n")
	}
	if now.Sequenced || now.SequencedItems {
		out.Printf("on a death a key %ss\n", onDeath(now.SequenceHold))
	}
	return nil
}

// maxReleasedCount bounds the blocked keys sequence advance counts to
// report the dead items it released.
const maxReleasedCount = 10_000

// toggle is on as a claim.Toggle.
func toggle(on bool) claim.Toggle {
	if on {
		return claim.On
	}
	return claim.Off
}

// onDeath names what a death of a sequenced item does to its key.
func onDeath(hold bool) string {
	if hold {
		return "hold"
	}
	return "advance"
}

// sequenceHold sets what a death does to a key of the queue.
func sequenceHold(ctx context.Context, f *cli.FlagSet, g *globals, hold bool, out *cli.Console) error {
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	was, err := q.Settings(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	// The dead items that hold their keys, which advance releases.
	released := 0
	if !hold {
		blocked, err := q.BlockedKeys(ctx, maxReleasedCount)
		if err != nil {
			return cli.Failf(1, "%v", err)
		}
		for _, b := range blocked {
			if b.Kind == claim.BlockedDead {
				released++
			}
		}
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: toggle(hold)}); err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "on_death": onDeath(hold), "was": onDeath(was.SequenceHold), "released": released})
	}
	if was.SequenceHold == hold {
		out.Printf("queue %q already lets a key %s on a death\n", g.queue, onDeath(hold))
	} else if hold {
		out.Printf("queue %q now holds a key on the death of a sequenced item, until the dead item is requeued, deleted or released\n", g.queue)
	} else {
		out.Printf("queue %q now lets a key advance on the death of a sequenced item\n", g.queue)
	}
	if released > 0 {
		out.Printf("released %s that held their keys (they stay in the dead items)\n", plural(int(released), "dead item"))
	}
	if !was.Sequenced && !was.SequencedItems {
		out.Printf("note: the queue is not sequenced (crdbwork sequence on)\n")
	}
	return nil
}

// sequenceBlocked lists the queue's blocked keys.
func sequenceBlocked(ctx context.Context, f *cli.FlagSet, g *globals, limit int, out *cli.Console) error {
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	blocked, err := q.BlockedKeys(ctx, limit)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		type row struct {
			Key       string    `json:"key"`
			ID        string    `json:"id"`
			Kind      string    `json:"kind"`
			Reason    string    `json:"reason,omitempty"`
			LastError string    `json:"last_error,omitempty"`
			At        time.Time `json:"at"`
			Attempts  int       `json:"attempts"`
		}
		rows := make([]row, len(blocked))
		for i, b := range blocked {
			rows[i] = row{b.Key, b.ID.String(), b.Kind, b.Reason, b.LastError, b.At, b.Attempts}
		}
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "blocked": rows})
	}
	if len(blocked) == 0 {
		out.Printf("queue %q has no blocked keys\n", g.queue)
		return nil
	}
	for _, b := range blocked {
		why := ""
		switch b.Kind {
		case claim.BlockedDead:
			why = "held by dead item " + b.ID.String() + " (" + b.Reason + ", died " + b.At.UTC().Format(time.RFC3339) + ")"
		case claim.BlockedRetry:
			why = "head " + b.ID.String() + " waits for its retry at " + b.At.UTC().Format(time.RFC3339)
		default:
			why = "head " + b.ID.String() + " waits for its delay until " + b.At.UTC().Format(time.RFC3339)
		}
		line := "key " + quote(b.Key) + ": " + why
		if b.LastError != "" {
			line += ": " + oneLine(b.LastError)
		}
		out.Printf("%s\n", line)
	}
	if len(blocked) == limit {
		out.Printf("(the first %d; --limit for more)\n", limit)
	}
	return nil
}

// sequenceRelease releases a key of the queue.
func sequenceRelease(ctx context.Context, f *cli.FlagSet, g *globals, key string, out *cli.Console) error {
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids, err := q.ReleaseSequenceKey(ctx, key)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = id.String()
		}
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "key": key, "released": s})
	}
	if len(ids) == 0 {
		out.Printf("key %s of queue %q was not held by a dead item\n", quote(key), g.queue)
		return nil
	}
	out.Printf("released key %s of queue %q from %s (they stay in the dead items)\n", quote(key), g.queue, plural(len(ids), "dead item"))
	return nil
}

// quote quotes s for a line of output.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// oneLine returns s on one line, cut at 200 bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
