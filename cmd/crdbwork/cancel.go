package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
)

// defaultBy is who a cancel is by unless --by says: user@host of this
// process ("unknown" for what cannot be read).
func defaultBy() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// cancelledItem is what cancel did with one id, for its output.
type cancelledItem struct {
	ID               string `json:"id"`
	Running          bool   `json:"running"`
	AlreadyRequested bool   `json:"already_requested"`
	// Outcome is how the item ended (with --wait): "cancelled", or
	// "acked" when its ack committed before the request.
	Outcome string `json:"outcome,omitempty"`
}

func cmdCancel(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var cf confirmFlags
	var by, reason string
	var wait bool
	var timeout time.Duration
	f := prog.NewFlagSet(name, `Cancels the items given of --queue. An item no worker holds ends at once. An
item a worker is running is asked to stop: the worker cancels its handler's
context (at its next heartbeat, or at once through PostgreSQL's notification),
its result is not written, and the item ends as cancelled. Each line says
whether the item was running; --wait waits until the running ones ended.
Who cancelled (--by, default user@host) and why (--reason) are kept with the
item: crdbwork cancelled lists them. It needs --yes (--dry-run shows what it
would do). Exits 1 if the queue has no item with one of the ids (the others
are cancelled), or if --wait times out.`)
	f.MaxArgs, f.ArgName = 1000, "ID..."
	g.register(f, queueRequired)
	cf.register(f)
	f.StringVar(&by, "by", "", "WHO", "who cancels, kept with the item (default: user@host)", nil)
	f.StringVar(&reason, "reason", "", "TEXT", "why, kept with the item", nil)
	f.BoolVar(&wait, "wait", false, "wait until the running items ended (their handlers stopped)")
	f.DurationVar(&timeout, "wait-timeout", 5*time.Minute, false, "how long --wait waits at most")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := cf.check(f); err != nil {
		return err
	}
	if len(f.Args) == 0 {
		return f.UsageError("give the ids of the items to cancel")
	}
	if by == "" {
		by = defaultBy()
	}
	ids := make([]uuid.UUID, len(f.Args))
	for i, a := range f.Args {
		var err error
		if ids[i], err = parseID(f, a); err != nil {
			return err
		}
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	if cf.dryRun || !cf.yes {
		if g.json && cf.dryRun {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "dry_run": true, "would_cancel": f.Args})
		}
		line := fmt.Sprintf("would cancel %s of queue %q: %s", plural(len(ids), "item"), g.queue, strings.Join(f.Args, ", "))
		if cf.dryRun {
			out.Printf("%s\n", line)
			return nil
		}
		out.Errorf("crdbwork cancel: %s", line)
		return refuse(f)
	}
	var done []cancelledItem
	var missing []string
	for _, id := range ids {
		res, err := q.CancelItem(ctx, id, claim.CancelOptions{By: by, Reason: reason})
		if err != nil {
			return cli.Failf(1, "cancelled %s, then: %v", plural(len(done), "item"), err)
		}
		if !res.Found {
			missing = append(missing, id.String())
			continue
		}
		done = append(done, cancelledItem{ID: id.String(), Running: res.Running, AlreadyRequested: res.AlreadyRequested})
		if g.json {
			continue
		}
		switch {
		case res.AlreadyRequested:
			out.Printf("item %s of queue %q is running and was asked to stop already; it ends when its handler stops\n", id, g.queue)
		case res.Running:
			out.Printf("item %s of queue %q was running: its worker was asked to stop it; it ends as cancelled when its handler stops\n", id, g.queue)
		default:
			out.Printf("cancelled item %s of queue %q (it was not running)\n", id, g.queue)
		}
	}
	if len(done) > 0 {
		list := make([]string, len(done))
		for i, d := range done {
			list[i] = d.ID
		}
		recordAudit(ctx, pool, &g, out, "cancel", fmt.Sprintf("cancelled %s (by %s): %s", plural(len(done), "item"), by, strings.Join(list, ", ")))
	}
	var waitErr error
	if wait {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		for i := range done {
			if !done[i].Running {
				done[i].Outcome = "cancelled"
				continue
			}
			outcome, err := q.WaitEnded(wctx, uuid.MustParse(done[i].ID), 100*time.Millisecond)
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					err = fmt.Errorf("item %s had not ended after %v", done[i].ID, timeout)
				}
				waitErr = err
				break
			}
			if outcome == "" {
				outcome = "ended" // not recorded: the queue keeps no ended ids
			}
			done[i].Outcome = outcome
			if !g.json {
				out.Printf("item %s ended: %s\n", done[i].ID, outcome)
			}
		}
	}
	if g.json {
		ids := make([]string, len(done))
		for i, d := range done {
			ids[i] = d.ID
		}
		if err := cli.PrintJSON(out, map[string]any{"queue": g.queue, "cancelled": ids, "missing": append([]string{}, missing...),
			"items": append([]cancelledItem{}, done...), "by": by, "reason": reason}); err != nil {
			return err
		}
	}
	if waitErr != nil {
		return cli.Failf(1, "waiting for the cancelled items: %v", waitErr)
	}
	if len(missing) > 0 {
		return cli.Failf(1, "queue %q has no item %s (already done, dead, cancelled, or in another queue)", g.queue, strings.Join(missing, ", "))
	}
	return nil
}

func cmdCancelled(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var limit int
	var kind string
	f := prog.NewFlagSet(name, `Lists the cancelled items of --queue, the most recent first: who cancelled
each (--by of crdbwork cancel), why, when the cancel was asked for and when
the item ended, whether a handler was running it, and its kind. They are kept
as long as the queue's dedup window (default 24 h), and so are the items
themselves: crdbwork requeue --cancelled ID (or --all) puts them back into the
queue. --kind lists only the items of one kind.`)
	g.register(f, queueRequired)
	f.IntVar(&limit, "limit", 20, 1, 100_000, "most items to list")
	f.StringVar(&kind, "kind", "", "KIND", "only the cancelled items of this kind (claim.NewItem.Kind)", nil)
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	// A queue whose every item ended has no row the unknown-queue check
	// finds, yet its cancelled items are listed.
	g.create = true
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := q.CancelledItems(ctx, claim.CancelledQuery{Limit: limit, Kind: kind})
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	items := page.Items
	if g.json {
		type row struct {
			ID          string     `json:"id"`
			By          string     `json:"by"`
			Reason      string     `json:"reason"`
			RequestedAt *time.Time `json:"requested_at"`
			EndedAt     time.Time  `json:"ended_at"`
			WasRunning  bool       `json:"was_running"`
			Kind        string     `json:"kind,omitempty"`
		}
		rows := []row{}
		for _, it := range items {
			r := row{ID: it.ID.String(), By: it.By, Reason: it.Reason, EndedAt: it.EndedAt, WasRunning: it.WasRunning, Kind: it.Kind}
			if !it.RequestedAt.IsZero() {
				r.RequestedAt = &it.RequestedAt
			}
			rows = append(rows, r)
		}
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "items": rows})
	}
	if len(items) == 0 {
		out.Printf("queue %q has no cancelled items%s (within its dedup window)\n", g.queue, map[bool]string{true: " of kind " + strconv.Quote(kind)}[kind != ""])
		return nil
	}
	for _, it := range items {
		running := "not running"
		if it.WasRunning {
			running = "was running"
		}
		line := fmt.Sprintf("%s  ended %s  %s  by %q", it.ID, it.EndedAt.UTC().Format(time.RFC3339), running, it.By)
		if it.Reason != "" {
			line += fmt.Sprintf("  reason %q", it.Reason)
		}
		if it.Kind != "" {
			line += fmt.Sprintf("  kind %q", it.Kind)
		}
		out.Printf("%s\n", line)
	}
	return nil
}
