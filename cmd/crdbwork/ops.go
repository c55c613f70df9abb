package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/partition"
)

// parseID reads an item id argument.
func parseID(f *cli.FlagSet, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, f.UsageError("%q is not an item id (a UUID like 0b9c1f0e-6f0c-4d2a-9d7e-1c2b3a4d5e6f)", s)
	}
	return id, nil
}

type deadJSON struct {
	ID          string `json:"id"`
	Death       string `json:"death"`
	Part        int    `json:"part"`
	Key         string `json:"key,omitempty"`
	Priority    int    `json:"priority"`
	Attempts    int    `json:"attempts"`
	MaxAttempts int    `json:"max_attempts"`
	LastError   string `json:"last_error"`
	Reason      string `json:"reason"`
	Tenant      string `json:"tenant,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Payload     []byte `json:"payload"` // base64 in JSON
	// PayloadText is the payload as text, when it is UTF-8 ("" else).
	PayloadText string    `json:"payload_text,omitempty"`
	EnqueuedAt  time.Time `json:"enqueued_at"`
	DiedAt      time.Time `json:"died_at"`
}

// quoteReasons lists claim.Reasons quoted where they hold a space.
func quoteReasons() string {
	var out []string
	for _, r := range claim.Reasons() {
		if strings.Contains(r, " ") {
			r = fmt.Sprintf("%q", r)
		}
		out = append(out, r)
	}
	return strings.Join(out, ", ")
}

// filterFlags are the dead-item filters of dead and requeue.
type filterFlags struct{ f claim.DeadFilter }

// register adds --tenant, --reason, --error and --kind; flagOnly makes them
// unreadable from the environment (for requeue: they choose what moves).
func (d *filterFlags) register(f *cli.FlagSet, flagOnly bool) {
	f.StringVar(&d.f.Tenant, "tenant", "", "NAME", "only the dead items of this tenant", nil)
	f.StringVar(&d.f.Reason, "reason", "", "REASON", "only the dead items that died for this reason: "+strings.Join(claim.Reasons(), ", ")+
		" (\"dependency died: ID\" for one prerequisite's; the start of the id is enough; \"unknown kind: KIND\" for one kind's)", func(s string) error {
		if err := claim.CheckReason(s); err != nil {
			return fmt.Errorf("must be one of %s, \"dependency died: ID\", \"unknown kind: KIND\" or \"bad arguments: KIND\"", quoteReasons())
		}
		return nil
	})
	f.StringVar(&d.f.ErrorContains, "error", "", "TEXT", "only the dead items whose last error contains this text", nil)
	f.StringVar(&d.f.Kind, "kind", "", "KIND", "only the dead items of this kind (claim.NewItem.Kind)", nil)
	if flagOnly {
		for _, name := range []string{"tenant", "reason", "error", "kind"} {
			f.FlagOnly(name)
		}
	}
}

func (d *filterFlags) any() bool { return d.f != claim.DeadFilter{} }

// anyButKind reports a filter other than --kind.
func (d *filterFlags) anyButKind() bool {
	f := d.f
	f.Kind = ""
	return f != claim.DeadFilter{}
}

// ofKind names the --kind filter for a sentence (" of kind \"refund\"";
// "" without one), as crdbwork cancelled does.
func (d *filterFlags) ofKind() string {
	if d.f.Kind == "" {
		return ""
	}
	return " of kind " + strconv.Quote(d.f.Kind)
}

func cmdDead(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var ff filterFlags
	var limit int
	var after string
	var count bool
	f := prog.NewFlagSet(name, `Lists the dead items of --queue, the most recent first, with why they died:
"failed" (attempts used up), "permanent" (a permanent error), "crash loop"
(attempts used up without an ack or nack), "expired" (past its deadline),
"snoozed too often", "dependency died: ID" (a prerequisite ended without an
ack), "cancelled" (a sequenced item cancelled while its sequence holds),
"refused by the database", "unknown kind: KIND" (no handler of a
worker.Kinds knew its kind) or "bad arguments: KIND" (its payload did not
decode into its kind's arguments). --reason "dependency died" matches every
prerequisite's, "unknown kind" every kind's.
--tenant, --reason, --error and --kind filter them. A page holds --limit items; when
more follow, it ends with the cursor of the next page, for --after. An id that
died several times is listed once per death, each with its own DEATH key.
With --count it prints only how many match. Requeue them with
"crdbwork requeue ID", "crdbwork requeue ID --death DEATH", by filter or --all.`)
	g.register(f, queueRequired)
	ff.register(f, false)
	f.IntVar(&limit, "limit", 20, 1, 100_000, "most items to list")
	f.StringVar(&after, "after", "", "CURSOR", "list the page after this cursor (printed at the end of the previous page)", nil)
	f.BoolVar(&count, "count", false, "print only the number of dead items that match")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	total, err := countDead(ctx, q, ff.f)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if count {
		if g.json {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "count": total})
		}
		out.Printf("%d\n", total)
		return nil
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: ff.f, After: after, Limit: limit})
	if err != nil {
		if errors.Is(err, claim.ErrBadCursor) {
			return f.UsageError("--after %q is not a cursor printed by crdbwork dead", after)
		}
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		list := make([]deadJSON, len(page.Items))
		for i, d := range page.Items {
			list[i] = deadJSON{ID: d.ID.String(), Death: d.Death.String(), Part: d.Part, Key: d.Key, Priority: d.Priority, Attempts: d.Attempts,
				MaxAttempts: d.MaxAttempts, LastError: d.LastError, Reason: d.Reason, Tenant: d.Tenant, Kind: d.Kind, Payload: d.Payload,
				EnqueuedAt: d.EnqueuedAt.UTC(), DiedAt: d.DiedAt.UTC()}
			if utf8.Valid(d.Payload) {
				list[i].PayloadText = string(d.Payload)
			}
		}
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "total": total, "items": list, "next": page.Next})
	}
	if total == 0 {
		out.Printf("queue %q has no dead items%s%s\n", g.queue, ff.ofKind(), map[bool]string{true: " that match"}[ff.anyButKind()])
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "queue %q: %s%s", g.queue, plural(int(total), "dead item"), map[bool]string{true: map[bool]string{true: " matches", false: " match"}[total == 1]}[ff.any()])
	if len(page.Items) > 0 {
		fmt.Fprintf(&b, " (%d shown)", len(page.Items))
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEATH\tPART\tKIND\tTENANT\tATTEMPTS\tDIED\tREASON\tPAYLOAD\tLAST ERROR")
	for _, d := range page.Items {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", d.ID, d.Death, d.Part, orDash(d.Kind), orDash(d.Tenant), d.Attempts, d.MaxAttempts,
			d.DiedAt.UTC().Format(time.RFC3339Nano), orDash(d.Reason), preview(d.Payload, 24), cli.Fit(cli.OneLine(d.LastError), 60))
	}
	tw.Flush()
	if page.Next != "" {
		fmt.Fprintf(&b, "more: --after %s\n", page.Next)
	}
	out.Printf("%s", b.String())
	return nil
}

// preview shows a payload briefly: its text as it is (control characters
// and line ends escaped, so that it stays on its line), or its size when
// it is not UTF-8.
func preview(p []byte, n int) string {
	switch {
	case len(p) == 0:
		return "(empty)"
	case !utf8.Valid(p):
		return "(" + plural(len(p), "byte") + ")"
	}
	var b strings.Builder
	for _, r := range cli.Fit(string(p), n) {
		if unicode.IsControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func cmdRequeue(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var ff filterFlags
	var cf confirmFlags
	var all, cancelled bool
	var deathArg string
	f := prog.NewFlagSet(name, `Moves dead items of --queue back into the queue (fresh attempts, no delay):
the newest death of the id given (or the death given with --death; older
deaths stay listed, as history); or, with --all or a filter (--tenant,
--reason, --error, --kind), the newest death of every dead id that matches. An id that
is live (enqueued again: an item, or a waiting item whose prerequisites are not
yet acked, of any queue) is not requeued: its dead item stays. Requeueing more
than one item needs --yes (--dry-run counts them). Exits 1 if the given item is
not a dead item of the queue, or is live. With --cancelled it requeues
cancelled items instead (the id given, --all of them, or those of one --kind): a cancel keeps the
item for the queue's dedup window (see crdbwork cancelled); the requeued item
is no longer listed as cancelled.`)
	f.MaxArgs, f.ArgName = 1, "[ID]"
	g.register(f, queueRequired)
	ff.register(f, true)
	cf.register(f)
	f.BoolVar(&all, "all", false, "requeue every dead item of the queue")
	f.FlagOnly("all")
	f.StringVar(&deathArg, "death", "", "DEATH", "requeue this death of the id (the DEATH column of `crdbwork dead`) rather than its newest", nil)
	f.FlagOnly("death")
	f.BoolVar(&cancelled, "cancelled", false, "requeue cancelled items (kept for the queue's dedup window), not dead ones")
	f.FlagOnly("cancelled")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := cf.check(f); err != nil {
		return err
	}
	if cancelled {
		return requeueCancelled(ctx, f, &g, &cf, all, ff.f.Kind, ff.f != (claim.DeadFilter{Kind: ff.f.Kind}) || deathArg != "", out)
	}
	many := all || ff.any()
	var id, death uuid.UUID
	switch {
	case many && len(f.Args) > 0:
		return f.UsageError("give an item id, or --all or a filter, not both")
	case all && ff.any():
		return f.UsageError("--all requeues every dead item: give it no filter")
	case many && deathArg != "":
		return f.UsageError("--death requeues one death of the id given, not --all nor a filter")
	case !many && len(f.Args) == 0:
		return f.UsageError("give the id of a dead item (see `crdbwork dead`), or --all, or a filter (--tenant, --reason, --error, --kind)")
	case !many:
		var err error
		if id, err = parseID(f, f.Args[0]); err != nil {
			return err
		}
		if deathArg != "" {
			if death, err = uuid.Parse(deathArg); err != nil {
				return f.UsageError("--death %q is not a death key (a UUID: the DEATH column of `crdbwork dead`)", deathArg)
			}
		}
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !many {
		if cf.dryRun {
			return report(out, &g, map[string]any{"queue": g.queue, "dry_run": true, "would_requeue": 1, "ids": []string{id.String()}},
				fmt.Sprintf("would requeue item %s into queue %q\n", id, g.queue))
		}
		o := claim.RequeueOptions{ID: id}
		if deathArg != "" {
			o.Death = death
		}
		res, err := q.Requeue(ctx, o)
		if err != nil {
			return cli.Failf(1, "%v", err)
		}
		if res.Requeued == 0 {
			if deathArg != "" {
				return cli.Failf(1, "item %s has no death %s in queue %q (see `crdbwork dead --queue %s`)", id, death, g.queue, g.queue)
			}
			return cli.Failf(1, "item %s is not a dead item of queue %q (see `crdbwork dead --queue %s`)", id, g.queue, g.queue)
		}
		recordAudit(ctx, pool, &g, out, "requeue", fmt.Sprintf("requeued item %s", id))
		return report(out, &g, map[string]any{"queue": g.queue, "requeued": 1, "ids": []string{id.String()}},
			fmt.Sprintf("requeued item %s into queue %q\n", id, g.queue))
	}
	n, err := countDead(ctx, q, ff.f)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	what := fmt.Sprintf("requeue the %d dead items (deaths) of queue %q that match", n, g.queue)
	if all {
		what = fmt.Sprintf("requeue all %d dead items (deaths) of queue %q", n, g.queue)
	}
	if cf.dryRun || !cf.yes && n > 1 {
		if g.json && cf.dryRun {
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "dry_run": true, "would_requeue": n})
		}
		if cf.dryRun {
			out.Printf("would %s (each id's newest death; live ids are skipped)\n", what)
			return nil
		}
		out.Errorf("crdbwork requeue: this would %s", what)
		return refuse(f)
	}
	res, err := q.Requeue(ctx, claim.RequeueOptions{Filter: ff.f, All: all, Progress: func(r claim.RequeueResult) {
		if !g.json {
			out.Progress(fmt.Sprintf("requeued %d of up to %d…", r.Requeued, n), false)
		}
	}})
	out.EndProgress()
	if err != nil {
		return cli.Failf(1, "requeued %s, then: %v", plural(res.Requeued, "item"), err)
	}
	recordAudit(ctx, pool, &g, out, "requeue-filter", fmt.Sprintf("requeued %d dead items (%d live already, %d refused)", res.Requeued, res.Live, res.Refused))
	msg := fmt.Sprintf("requeued %s%s into queue %q\n", plural(res.Requeued, "dead item"), ff.ofKind(), g.queue)
	if res.Live > 0 {
		msg += fmt.Sprintf("%d dead ids not requeued: the id is live, an item or a waiting item has it (their dead items stay)\n", res.Live)
	}
	if res.Refused > 0 {
		msg += fmt.Sprintf("%d dead ids not requeued: the database refused their rows (they stay dead; `crdbwork requeue ID` says why), first: %s\n",
			res.Refused, res.RefusedIDs[0])
	}
	return report(out, &g, map[string]any{"queue": g.queue, "requeued": res.Requeued, "live": res.Live, "refused": res.Refused}, msg)
}

// report prints v as JSON with --json, else text.
func report(out *cli.Console, g *globals, v any, text string) error {
	if g.json {
		return cli.PrintJSON(out, v)
	}
	out.Printf("%s", text)
	return nil
}

func cmdParts(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var cf confirmFlags
	var set int
	f := prog.NewFlagSet(name, `Shows the number of parts of --queue and who owns them, or changes the
number with --set N and --yes (safe while workers run: items in removed parts
move to part % N, and the workers' rebalancers follow at their next poll).`)
	g.register(f, queueRequired)
	g.registerCreate(f)
	cf.register(f)
	f.IntVar(&set, "set", 0, 1, partition.MaxParts, "set the queue's number of parts")
	f.FlagOnly("set")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := cf.check(f); err != nil {
		return err
	}
	pool, _, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	t := g.tables()
	before, err := partition.Parts(ctx, pool, t, g.queue)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if f.IsSet("set") && (cf.dryRun || !cf.yes) {
		line := fmt.Sprintf("would change the parts of queue %q from %d to %d", g.queue, before, set)
		if before > set {
			line += fmt.Sprintf(" (the items of parts %d-%d move)", set, before-1)
		}
		switch {
		case cf.dryRun && g.json:
			return cli.PrintJSON(out, map[string]any{"queue": g.queue, "dry_run": true, "parts": before, "would_set": set})
		case cf.dryRun:
			out.Printf("%s\n", line)
			return nil
		}
		out.Errorf("crdbwork parts: %s", line)
		return refuse(f)
	}
	if f.IsSet("set") {
		if err := partition.SetParts(ctx, pool, t, g.queue, set); err != nil {
			return cli.Failf(1, "%v", err)
		}
		recordAudit(ctx, pool, &g, out, "parts", fmt.Sprintf("set the parts to %d (were %d)", set, before))
	}
	s, err := readQueueStatus(ctx, pool, t, g.queue)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		m := map[string]any{"queue": g.queue, "parts": s.NumParts, "stored": s.PartsStored, "owners": s.PartOwners,
			"unowned": s.UnownedParts, "in_use": s.PartsInUse}
		if f.IsSet("set") {
			m["previous"] = before
		}
		return cli.PrintJSON(out, m)
	}
	var b strings.Builder
	if f.IsSet("set") {
		fmt.Fprintf(&b, "queue %q: %s (was %d)\n", g.queue, plural(s.NumParts, "part"), before)
	} else {
		fmt.Fprintf(&b, "queue %q: %s%s\n", g.queue, plural(s.NumParts, "part"), map[bool]string{false: " (no stored count: the default for a queue nobody has set up)"}[s.PartsStored])
	}
	writeOwners(&b, s)
	out.Printf("%s", b.String())
	return nil
}

func cmdPause(ctx context.Context, name string, args []string, out *cli.Console) error {
	return pauseResume(ctx, name, args, out, true)
}

func cmdResume(ctx context.Context, name string, args []string, out *cli.Console) error {
	return pauseResume(ctx, name, args, out, false)
}

// pauseResume pauses or resumes --queue: every claim of a paused queue
// returns nothing; items already claimed finish as usual; enqueues go on.
func pauseResume(ctx context.Context, name string, args []string, out *cli.Console, pause bool) error {
	var g globals
	what := `Pauses --queue: from the next claim on, no worker claims its items, until
"crdbwork resume". Items already claimed finish (acked, nacked or released as
usual) and enqueues go on. Idempotent.`
	if !pause {
		what = `Resumes --queue after "crdbwork pause": workers claim its items again at their
next poll. Idempotent.`
	}
	f := prog.NewFlagSet(name, what)
	g.register(f, queueRequired)
	if pause {
		g.registerCreate(f)
	}
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	set, err := q.Settings(ctx)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	was := set.Paused
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: toggle(pause)}); err != nil {
		return cli.Failf(1, "%v", err)
	}
	if was != pause {
		verb := map[bool]string{true: "pause", false: "resume"}[pause]
		recordAudit(ctx, pool, &g, out, verb, verb+"d the queue")
	}
	if g.json {
		return cli.PrintJSON(out, map[string]any{"queue": g.queue, "paused": pause, "was_paused": was})
	}
	verb := map[bool]string{true: "paused", false: "resumed"}[pause]
	switch {
	case was == pause:
		out.Printf("queue %q was already %s\n", g.queue, verb)
	case pause:
		out.Printf("paused queue %q: workers claim none of its items until `crdbwork resume --queue %s`\n", g.queue, g.queue)
	default:
		out.Printf("resumed queue %q\n", g.queue)
	}
	return nil
}

// countDead counts the deaths of q that match f (claim.DeadQuery.Count).
func countDead(ctx context.Context, q *claim.Queue, f claim.DeadFilter) (int64, error) {
	page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: f, Count: true, Limit: 1})
	return page.Count, err
}

// requeueCancelled is crdbwork requeue --cancelled: the id given, --all,
// or every kept cancelled item of kind (--kind).
func requeueCancelled(ctx context.Context, f *cli.FlagSet, g *globals, cf *confirmFlags, all bool, kind string, deadOnly bool, out *cli.Console) error {
	var id uuid.UUID
	many := all || kind != ""
	ofKind := ""
	if kind != "" {
		ofKind = fmt.Sprintf(" of kind %q", kind)
	}
	switch {
	case deadOnly:
		return f.UsageError("--cancelled requeues cancelled items: --death and the filters (--tenant, --reason, --error) select dead ones; --kind selects the cancelled items of a kind")
	case all && kind != "":
		return f.UsageError("--all requeues every cancelled item: give it no --kind")
	case many && len(f.Args) > 0:
		return f.UsageError("give an item id, or --all or --kind, not both")
	case !many && len(f.Args) == 0:
		return f.UsageError("give the id of a cancelled item (see `crdbwork cancelled`), or --all, or --kind")
	case many && !cf.yes && !cf.dryRun:
		out.Errorf("crdbwork requeue: this would requeue every cancelled item%s queue %q kept", ofKind, g.queue)
		return refuse(f)
	case !many:
		var err error
		if id, err = parseID(f, f.Args[0]); err != nil {
			return err
		}
	}
	if cf.dryRun {
		what := "every cancelled item" + ofKind + " it kept"
		if !many {
			what = "cancelled item " + id.String()
		}
		return report(out, g, map[string]any{"queue": g.queue, "dry_run": true, "cancelled": true, "all": all, "kind": kind},
			fmt.Sprintf("would requeue %s into queue %q\n", what, g.queue))
	}
	g.create = true // a queue whose every item ended has no row
	pool, q, err := g.openQueue(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: id, All: all, Filter: claim.DeadFilter{Kind: kind}})
	if err != nil {
		return cli.Failf(1, "requeued %d cancelled items, then: %v", res.Requeued, err)
	}
	if !many {
		recordAudit(ctx, pool, g, out, "requeue-cancelled", fmt.Sprintf("requeued cancelled item %s", id))
		return report(out, g, map[string]any{"queue": g.queue, "requeued": 1, "ids": []string{id.String()}},
			fmt.Sprintf("requeued cancelled item %s into queue %q\n", id, g.queue))
	}
	recordAudit(ctx, pool, g, out, "requeue-cancelled", fmt.Sprintf("requeued %d cancelled items%s (%d live already, %d ran again since)", res.Requeued, ofKind, res.Live, res.Gone))
	msg := fmt.Sprintf("requeued %d cancelled items%s into queue %q\n", res.Requeued, ofKind, g.queue)
	if res.Live > 0 {
		msg += fmt.Sprintf("%d cancelled ids not requeued: the id is live (enqueued again)\n", res.Live)
	}
	return report(out, g, map[string]any{"queue": g.queue, "requeued": res.Requeued, "live": res.Live, "gone": res.Gone, "refused": res.Refused}, msg)
}
