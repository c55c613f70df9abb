package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
)

// The operator commands: dead, requeue, cancel, parts, pause, resume. Each
// connects, checks the schema, acts on --queue and prints one result (one
// JSON object with --json).

// openChecked connects to --database-url with a pool of conns and checks
// the crdbwork schema: the start of every command that needs it.
func openChecked(ctx context.Context, c *common, f *flagSet, conns int) (*pgxpool.Pool, error) {
	if err := c.requireURL(f); err != nil {
		return nil, err
	}
	pool, err := connect(ctx, c.databaseURL, conns)
	if err != nil {
		return nil, err
	}
	if err := requireSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// opConn connects for an operator command, checks the schema and returns
// the queue of --queue.
func opConn(ctx context.Context, c *common, f *flagSet) (*pgxpool.Pool, *claim.Queue, error) {
	pool, err := openChecked(ctx, c, f, 2)
	if err != nil {
		return nil, nil, err
	}
	q, err := claim.New(pool, claim.Options{Queue: c.queue, Tables: tables})
	if err != nil {
		pool.Close()
		return nil, nil, failf(2, "%v", err)
	}
	return pool, q, nil
}

// parseID reads an item id argument.
func parseID(f *flagSet, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, f.usageError("%q is not an item id (a UUID like 0b9c1f0e-6f0c-4d2a-9d7e-1c2b3a4d5e6f)", s)
	}
	return id, nil
}

type deadJSON struct {
	ID          string    `json:"id"`
	Death       string    `json:"death"`
	Part        int       `json:"part"`
	Key         string    `json:"key,omitempty"`
	Priority    int       `json:"priority"`
	Attempts    int       `json:"attempts"`
	MaxAttempts int       `json:"max_attempts"`
	LastError   string    `json:"last_error"`
	Reason      string    `json:"reason"`
	Tenant      string    `json:"tenant,omitempty"`
	Payload     []byte    `json:"payload"` // base64 in JSON
	EnqueuedAt  time.Time `json:"enqueued_at"`
	DiedAt      time.Time `json:"died_at"`
}

func cmdDead(ctx context.Context, name string, args []string, out *console) error {
	var c common
	var limit int
	f := newFlagSet(name, `Lists the dead items of --queue, the most recent first, with why they died:
"failed" (attempts used up), "permanent" (a permanent error), "crash loop"
(attempts used up without an ack or nack) or "expired" (past its deadline,
--ttl). An id that died several times (enqueued again, or requeued, after it
died) is listed once per death, each with its own DEATH key. Requeue them
with "demo requeue ID" (its newest death), "demo requeue ID --death DEATH"
or "demo requeue --all".`)
	c.register(f, urlRequired)
	f.intVar(&limit, "limit", 20, 1, 100_000, "most items to list")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	items, err := q.Dead(ctx, limit)
	if err != nil {
		return failf(1, "%v", err)
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("dead_items")+` WHERE queue = $1`, c.queue).Scan(&total); err != nil {
		return failf(1, "counting the dead items of %q: %v", c.queue, err)
	}
	if c.json {
		list := make([]deadJSON, len(items))
		for i, d := range items {
			list[i] = deadJSON{ID: d.ID.String(), Death: d.Death.String(), Part: d.Part, Key: d.Key, Priority: d.Priority, Attempts: d.Attempts,
				MaxAttempts: d.MaxAttempts, LastError: d.LastError, Reason: d.Reason, Tenant: d.Tenant, Payload: d.Payload,
				EnqueuedAt: d.EnqueuedAt.UTC(), DiedAt: d.DiedAt.UTC()}
		}
		return printJSON(out, map[string]any{"queue": c.queue, "total": total, "items": list})
	}
	if total == 0 {
		out.printf("queue %q has no dead items\n", c.queue)
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "queue %q: %d dead items", c.queue, total)
	if int64(len(items)) < total {
		fmt.Fprintf(&b, " (the %d most recent; --limit for more)", len(items))
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEATH\tPART\tATTEMPTS\tDIED\tREASON\tPAYLOAD\tLAST ERROR")
	for _, d := range items {
		reason := d.Reason
		if reason == "" {
			reason = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d\t%s\t%s\t%s\t%s\n", d.ID, d.Death, d.Part, d.Attempts, d.MaxAttempts,
			d.DiedAt.UTC().Format(time.RFC3339Nano), reason, preview(d.Payload, 24), shorten(oneLine(d.LastError), 60))
	}
	tw.Flush()
	out.printf("%s", b.String())
	return nil
}

// preview shows a payload briefly: quoted text, or its size when binary.
func preview(p []byte, n int) string {
	if !utf8.Valid(p) {
		return fmt.Sprintf("(%d bytes)", len(p))
	}
	return fmt.Sprintf("%q", shorten(string(p), n))
}

// shorten cuts s to at most n runes, marking the cut with "…".
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func cmdRequeue(ctx context.Context, name string, args []string, out *console) error {
	var c common
	var all bool
	var deathArg string
	f := newFlagSet(name, `Moves a dead item of --queue back into the queue (fresh attempts, no delay):
the newest death of the id given (or the death given with --death; older
deaths stay listed, as history), or the newest death of every dead id of the
queue with --all. An id that is live (in the queue again) is not requeued:
its dead item stays. Exits 1 if the given item is not a dead item of the
queue, or is live.`)
	f.maxArgs, f.argName = 1, "[ID]"
	c.register(f, urlRequired)
	f.boolVar(&all, "all", false, "requeue every dead item of the queue")
	f.flagOnly("all")
	f.stringVar(&deathArg, "death", "", "DEATH", "requeue this death of the id (the DEATH column of `demo dead`) rather than its newest", nil)
	f.flagOnly("death")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	var id, death uuid.UUID
	switch {
	case all && len(f.args) > 0:
		return f.usageError("give an item id or --all, not both")
	case all && deathArg != "":
		return f.usageError("--death requeues one death of the id given, not --all")
	case !all && len(f.args) == 0:
		return f.usageError("give the id of a dead item (see `demo dead`), or --all")
	case !all:
		var err error
		if id, err = parseID(f, f.args[0]); err != nil {
			return err
		}
		if deathArg != "" {
			if death, err = uuid.Parse(deathArg); err != nil {
				return f.usageError("--death %q is not a death key (a UUID: the DEATH column of `demo dead`)", deathArg)
			}
		}
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	if !all {
		var ok bool
		if deathArg != "" {
			ok, err = q.RequeueDeath(ctx, id, death)
		} else {
			ok, err = q.Requeue(ctx, id)
		}
		if err != nil {
			return failf(1, "%v", err)
		}
		if !ok {
			if deathArg != "" {
				return failf(1, "item %s has no death %s in queue %q (see `demo dead --queue %s`)", id, death, c.queue, c.queue)
			}
			return failf(1, "item %s is not a dead item of queue %q (see `demo dead --queue %s`)", id, c.queue, c.queue)
		}
		if c.json {
			return printJSON(out, map[string]any{"queue": c.queue, "requeued": 1, "ids": []string{id.String()}})
		}
		out.printf("requeued item %s into queue %q\n", id, c.queue)
		return nil
	}
	n, live, err := requeueAll(ctx, q)
	if err != nil {
		return failf(1, "requeued %d items, then: %v", n, err)
	}
	if c.json {
		return printJSON(out, map[string]any{"queue": c.queue, "requeued": n, "live": live})
	}
	out.printf("requeued %d dead items into queue %q\n", n, c.queue)
	if live > 0 {
		out.printf("%d dead ids not requeued: an item with the id is live (their dead items stay)\n", live)
	}
	return nil
}

// requeueAll requeues the newest death of every dead id of q, paging through
// the dead items (newest first) once: an id is requeued once, its older
// deaths stay as history, and an item that dies again while this runs is not
// requeued twice (its new death is newer than the first page). Ids that are
// live are skipped and counted.
func requeueAll(ctx context.Context, q *claim.Queue) (requeued, live int, err error) {
	const page = 500
	seen := map[uuid.UUID]bool{}
	items, err := q.Dead(ctx, page)
	for err == nil && len(items) > 0 {
		for _, d := range items {
			if seen[d.ID] {
				continue
			}
			seen[d.ID] = true
			ok, err := q.Requeue(ctx, d.ID)
			switch {
			case errors.Is(err, claim.ErrItemLive):
				live++
			case err != nil:
				return requeued, live, err
			case ok:
				requeued++
			}
		}
		items, err = q.DeadBefore(ctx, items[len(items)-1], page)
	}
	return requeued, live, err
}

func cmdCancel(ctx context.Context, name string, args []string, out *console) error {
	var c common
	f := newFlagSet(name, `Deletes an item of --queue, claimed or not: it will not be handled (again).
If a worker holds it, that worker's ack fails and records nothing. Exits 1 if
the queue has no item with that id.`)
	f.maxArgs, f.argName = 1, "ID"
	c.register(f, urlRequired)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if len(f.args) == 0 {
		return f.usageError("give the id of the item to cancel")
	}
	id, err := parseID(f, f.args[0])
	if err != nil {
		return err
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	ok, err := q.Cancel(ctx, id)
	if err != nil {
		return failf(1, "%v", err)
	}
	if !ok {
		return failf(1, "queue %q has no item %s (already done, dead, cancelled, or in another queue)", c.queue, id)
	}
	if c.json {
		return printJSON(out, map[string]any{"queue": c.queue, "cancelled": id.String()})
	}
	out.printf("cancelled item %s of queue %q\n", id, c.queue)
	return nil
}

func cmdParts(ctx context.Context, name string, args []string, out *console) error {
	var c common
	var set int
	f := newFlagSet(name, `Shows the number of parts of --queue and who owns them, or changes the
number with --set N (safe while workers run: items in removed parts move to
part % N, and the workers' rebalancers follow at their next poll).`)
	c.register(f, urlRequired)
	f.intVar(&set, "set", 0, 1, partition.MaxParts, "set the queue's number of parts")
	f.flagOnly("set")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	pool, _, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := partition.Parts(ctx, pool, tables, c.queue)
	if err != nil {
		return failf(1, "%v", err)
	}
	if f.isSet("set") {
		if err := partition.SetParts(ctx, pool, tables, c.queue, set); err != nil {
			return failf(1, "%v", err)
		}
	}
	s, err := readStatus(ctx, pool, c.queue)
	if err != nil {
		return failf(1, "%v", err)
	}
	if c.json {
		m := map[string]any{"queue": c.queue, "parts": s.NumParts, "stored": s.PartsStored, "owners": s.PartOwners,
			"unowned": s.UnownedParts}
		if f.isSet("set") {
			m["previous"] = before
		}
		return printJSON(out, m)
	}
	var b strings.Builder
	if f.isSet("set") {
		fmt.Fprintf(&b, "queue %q: %d parts (was %d)\n", c.queue, s.NumParts, before)
	} else {
		fmt.Fprintf(&b, "queue %q: %d parts%s\n", c.queue, s.NumParts, map[bool]string{false: " (no stored count: the default for a queue nobody has set up)"}[s.PartsStored])
	}
	writeOwners(&b, s)
	out.printf("%s", b.String())
	return nil
}

func cmdPause(ctx context.Context, name string, args []string, out *console) error {
	return pauseResume(ctx, name, args, out, true)
}

func cmdResume(ctx context.Context, name string, args []string, out *console) error {
	return pauseResume(ctx, name, args, out, false)
}

// pauseResume pauses or resumes --queue: every claim of a paused queue
// returns nothing; items already claimed finish as usual; enqueues go on.
func pauseResume(ctx context.Context, name string, args []string, out *console, pause bool) error {
	var c common
	what := `Pauses --queue: from the next claim on, no worker claims its items, until
"demo resume". Items already claimed finish (acked, nacked or released as
usual) and enqueues go on. Idempotent.`
	if !pause {
		what = `Resumes --queue after "demo pause": workers claim its items again at their
next poll. Idempotent.`
	}
	f := newFlagSet(name, what)
	c.register(f, urlRequired)
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	pool, q, err := opConn(ctx, &c, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	was, err := q.Paused(ctx)
	if err != nil {
		return failf(1, "%v", err)
	}
	if pause {
		err = q.Pause(ctx)
	} else {
		err = q.Resume(ctx)
	}
	if err != nil {
		return failf(1, "%v", err)
	}
	if c.json {
		return printJSON(out, map[string]any{"queue": c.queue, "paused": pause, "was_paused": was})
	}
	verb := map[bool]string{true: "paused", false: "resumed"}[pause]
	if was == pause {
		out.printf("queue %q was already %s\n", c.queue, verb)
		return nil
	}
	if pause {
		out.printf("paused queue %q: workers claim none of its items until `demo resume --queue %s`\n", c.queue, c.queue)
	} else {
		out.printf("resumed queue %q\n", c.queue)
	}
	return nil
}
