package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/store"
)

// itemJSON is what `crdbwork item --json` prints: where the id is, and
// what the tables hold about it.
type itemJSON struct {
	ID string `json:"id"`
	// State is queued, scheduled, claimed, waiting, dead, cancelled,
	// acked, taken, or "" (found nowhere).
	State   string `json:"state"`
	Queue   string `json:"queue"`
	Snoozed bool   `json:"snoozed"`
	// Kind is the item's kind in its State (claim.NewItem.Kind): the live
	// or waiting item's, the newest death's, or that of its ended record
	// (a cancelled, acked or taken item); "" for none, and for an ended
	// record of code older than schema version 6 (which records no kind).
	Kind string `json:"kind,omitempty"`
	// Item is the live or waiting item (nil when it has ended).
	Item *itemBody `json:"item"`
	// Deaths are its deaths, newest first; Ended its ended records.
	Deaths []deathBody `json:"deaths"`
	Ended  []endedBody `json:"ended"`
	// History is the per-attempt history of the item in its State, oldest
	// first: each attempt's number, start, end, session, outcome and error
	// (a panic's with its stack trace). HistoryRecorded is false for an
	// item that ended under code older than schema version 6 (no history
	// recorded); HistoryOmitted reports older attempts left out (an item
	// keeps its last 20 failed ones).
	History         []attemptBody `json:"history"`
	HistoryRecorded bool          `json:"history_recorded"`
	HistoryOmitted  bool          `json:"history_omitted,omitempty"`
}

// payloadBody is a payload as JSON shows it: its text when it is UTF-8,
// else its bytes in base64.
type payloadBody struct {
	Size   int    `json:"size"`
	Text   string `json:"text,omitempty"`
	Base64 []byte `json:"base64,omitempty"`
}

func payloadOf(b []byte) *payloadBody {
	if b == nil {
		return nil
	}
	if utf8.Valid(b) {
		return &payloadBody{Size: len(b), Text: string(b)}
	}
	return &payloadBody{Size: len(b), Base64: b}
}

type itemBody struct {
	Queue       string       `json:"queue"`
	Part        int          `json:"part"`
	Key         string       `json:"key,omitempty"`
	Tenant      string       `json:"tenant,omitempty"`
	Priority    int64        `json:"priority"`
	Attempts    int64        `json:"attempts"`
	MaxAttempts int64        `json:"max_attempts"`
	LastError   string       `json:"last_error"`
	EnqueuedAt  time.Time    `json:"enqueued_at"`
	VestingAt   *time.Time   `json:"vesting_at,omitempty"`
	ClaimedBy   string       `json:"claimed_by,omitempty"`
	ClaimedAt   *time.Time   `json:"claimed_at,omitempty"`
	LeaseUntil  *time.Time   `json:"lease_until,omitempty"`
	Snoozes     int64        `json:"snoozes"`
	Cancel      *cancelBody  `json:"cancel,omitempty"`
	Remaining   int64        `json:"remaining_prerequisites,omitempty"`
	Kind        string       `json:"kind,omitempty"`
	Payload     *payloadBody `json:"payload"`
	Metadata    *payloadBody `json:"metadata,omitempty"`
}

type cancelBody struct {
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	By          string     `json:"by"`
	Reason      string     `json:"reason"`
	WasRunning  bool       `json:"was_running"`
}

type deathBody struct {
	Death       string       `json:"death"`
	Queue       string       `json:"queue"`
	Reason      string       `json:"reason"`
	Attempts    int          `json:"attempts"`
	MaxAttempts int          `json:"max_attempts"`
	LastError   string       `json:"last_error"`
	DiedAt      time.Time    `json:"died_at"`
	Kind        string       `json:"kind,omitempty"`
	Payload     *payloadBody `json:"payload"`
}

type endedBody struct {
	Queue   string      `json:"queue"`
	Outcome string      `json:"outcome"`
	EndedAt time.Time   `json:"ended_at"`
	Cancel  *cancelBody `json:"cancel,omitempty"`
	// Kind is the item's kind, as its ended record keeps it ("": none,
	// or a record of code older than schema version 6).
	Kind string `json:"kind,omitempty"`
}

// attemptBody is one attempt of the per-attempt history (issue #33).
type attemptBody struct {
	// Number counts from 1 (0: a requeue marker, Outcome "requeued");
	// Run counts the requeues before it.
	Number    int64      `json:"number"`
	Run       int        `json:"run"`
	Outcome   string     `json:"outcome"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Session   string     `json:"session,omitempty"`
	Error     string     `json:"error,omitempty"`
	// From is where a requeue took the item from (dead, cancelled).
	From string `json:"from,omitempty"`
}

func cmdItem(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	f := prog.NewFlagSet(name, `Shows one item wherever it is: queued, scheduled (due later), claimed (by which
session, until when), waiting for prerequisites, dead (each death, with its
reason and last error), cancelled, acked or taken (the ids a queue remembers
for its history or dedup window, a day by default): payload (as text when it
is UTF-8, else bytes), and each attempt: its start, end, session, outcome and
error (a panic's stack trace line for line). An attempt whose worker died
while it ran shows as lost. With --queue it looks in that queue's ended ids
only; without, in every queue's. Reads only. Exits 1 if the id is found
nowhere.`)
	f.MaxArgs, f.ArgName = 1, "ID"
	g.register(f, "the queue whose ended ids to look in (default: every queue's)")
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
	pool, err := g.open(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	queues := []string{g.queue}
	if g.queue == "" {
		if queues, err = claim.Queues(ctx, pool, g.tables()); err != nil {
			return cli.Failf(1, "%v", err)
		}
	}
	r, err := fleet.New(pool, g.tables())
	if err != nil {
		return cli.Failf(2, "%v", err)
	}
	v, err := r.Item(ctx, id, queues)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	j := itemView(v)
	if g.json {
		if err := cli.PrintJSON(out, j); err != nil {
			return err
		}
	} else {
		out.Printf("%s", formatItem(j))
	}
	if v.State == fleet.StateUnknown {
		where := "in the items, waiting items, dead items or any queue's ended ids"
		if g.queue != "" {
			where = fmt.Sprintf("in the items, waiting items, dead items or queue %q's ended ids", g.queue)
		}
		return cli.Failf(1, "item %s is not %s (never enqueued, purged, or past its queue's dedup window)", id, where)
	}
	return nil
}

// itemView is the JSON of what fleet.Item read.
func itemView(v *fleet.ItemView) itemJSON {
	j := itemJSON{ID: v.ID.String(), State: v.State, Queue: v.Queue, Snoozed: v.Snoozed,
		Deaths: []deathBody{}, Ended: []endedBody{}, History: []attemptBody{},
		HistoryRecorded: v.HistoryRecorded, HistoryOmitted: v.HistoryOmitted}
	for _, a := range v.History {
		b := attemptBody{Number: a.Number, Run: a.Run, Outcome: a.Outcome, StartedAt: utc(a.StartedAt), EndedAt: utc(a.EndedAt), Error: a.Error, From: a.From}
		if a.Session != nil {
			b.Session = a.Session.String()
		}
		j.History = append(j.History, b)
	}
	if it := v.Live; it != nil {
		b := &itemBody{Queue: it.Queue, Part: it.Part, Key: it.Key, Tenant: it.Tenant, Priority: it.Priority, Attempts: it.Attempts,
			MaxAttempts: it.MaxAttempts, LastError: it.LastError, EnqueuedAt: it.EnqueuedAt.UTC(), VestingAt: utc(&it.VestingAt),
			ClaimedAt: utc(it.ClaimedAt), LeaseUntil: utc(it.LeaseUntil), Snoozes: it.Snoozes, Kind: it.Kind,
			Payload: payloadOf(it.Payload), Metadata: payloadOf(it.Metadata)}
		if it.Claim != nil {
			b.ClaimedBy = it.Claim.String()
		}
		if it.CancelRequestedAt != nil {
			b.Cancel = &cancelBody{RequestedAt: utc(it.CancelRequestedAt), By: it.CancelBy, Reason: it.CancelReason, WasRunning: true}
		}
		j.Item = b
	} else if w := v.Waiting; w != nil {
		j.Item = &itemBody{Queue: w.Queue, Key: w.Key, Tenant: w.Tenant, Priority: w.Priority, MaxAttempts: w.MaxAttempts,
			EnqueuedAt: w.EnqueuedAt.UTC(), Remaining: w.Remaining, Kind: w.Kind, Payload: payloadOf(w.Payload), Metadata: payloadOf(w.Metadata)}
	}
	for i, d := range v.Deaths {
		j.Deaths = append(j.Deaths, deathBody{Death: d.Death.String(), Queue: v.DeathQueues[i], Reason: d.Reason, Attempts: d.Attempts,
			MaxAttempts: d.MaxAttempts, LastError: d.LastError, DiedAt: d.DiedAt.UTC(), Kind: d.Kind, Payload: payloadOf(d.Payload)})
	}
	for _, e := range v.Ended {
		b := endedBody{Queue: e.Queue, Outcome: e.Outcome, EndedAt: e.EndedAt.UTC(), Kind: e.Kind}
		if e.Outcome == store.OutcomeCancelled {
			b.Cancel = &cancelBody{RequestedAt: utc(e.CancelRequestedAt), By: e.CancelBy, Reason: e.CancelReason, WasRunning: e.WasRunning}
		}
		j.Ended = append(j.Ended, b)
	}
	switch {
	case j.Item != nil:
		j.Kind = j.Item.Kind
	case v.State == fleet.StateDead && len(j.Deaths) > 0:
		j.Kind = j.Deaths[0].Kind
	case len(j.Ended) > 0 && j.Ended[0].Outcome == v.State:
		j.Kind = j.Ended[0].Kind
	}
	return j
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// formatItem writes an item for people.
func formatItem(j itemJSON) string {
	var b strings.Builder
	switch {
	case j.State == fleet.StateUnknown:
		fmt.Fprintf(&b, "item %s: not found\n", j.ID)
		return b.String()
	case j.Snoozed && j.State != fleet.StateClaimed:
		fmt.Fprintf(&b, "item %s: %s (snoozed) in queue %q\n", j.ID, j.State, j.Queue)
	default:
		fmt.Fprintf(&b, "item %s: %s in queue %q\n", j.ID, j.State, j.Queue)
	}
	if it := j.Item; it != nil {
		field := func(k, v string) { fmt.Fprintf(&b, "  %-12s %s\n", k+":", v) }
		if j.State == fleet.StateWaiting {
			field("waits for", plural(int(it.Remaining), "prerequisite")+" not yet acked (`crdbwork deps --queue "+it.Queue+" "+j.ID+"`)")
		} else {
			field("attempts", fmt.Sprintf("%d of %d", it.Attempts, it.MaxAttempts))
		}
		if it.Kind != "" {
			field("kind", it.Kind)
		}
		if it.Key != "" {
			field("key", it.Key)
		}
		if it.Tenant != "" {
			field("tenant", it.Tenant)
		}
		field("priority", fmt.Sprint(it.Priority))
		field("enqueued", it.EnqueuedAt.Format(time.RFC3339Nano))
		if it.VestingAt != nil && j.State == fleet.StateScheduled {
			field("due", it.VestingAt.Format(time.RFC3339Nano))
		}
		if it.ClaimedBy != "" {
			field("claimed by", fmt.Sprintf("session %s since %s, lease until %s", it.ClaimedBy, stampOf(it.ClaimedAt), stampOf(it.LeaseUntil)))
		}
		if it.Snoozes > 0 {
			field("snoozed", plural(int(it.Snoozes), "time"))
		}
		if c := it.Cancel; c != nil {
			field("cancel", fmt.Sprintf("asked %s by %s: %s (it ends when its handler stops)", stampOf(c.RequestedAt), orDash(c.By), orDash(c.Reason)))
		}
		if it.LastError != "" {
			field("last error", indent(it.LastError))
		}
		writePayload(&b, "payload", it.Payload)
		if it.Metadata != nil {
			writePayload(&b, "metadata", it.Metadata)
		}
	}
	for _, e := range j.Ended {
		fmt.Fprintf(&b, "ended: %s in queue %q at %s", e.Outcome, e.Queue, e.EndedAt.Format(time.RFC3339Nano))
		if c := e.Cancel; c != nil {
			fmt.Fprintf(&b, " by %s: %s (%s)", orDash(c.By), orDash(c.Reason), map[bool]string{true: "it was running", false: "before it ran"}[c.WasRunning])
		}
		b.WriteString("\n")
		if e.Kind != "" && j.Item == nil {
			fmt.Fprintf(&b, "  %-12s %s\n", "kind:", e.Kind)
		}
	}
	for _, d := range j.Deaths {
		fmt.Fprintf(&b, "death %s in queue %q at %s: %s, %d of %d attempts\n", d.Death, d.Queue, d.DiedAt.Format(time.RFC3339Nano), d.Reason, d.Attempts, d.MaxAttempts)
		if d.Kind != "" && j.Item == nil {
			fmt.Fprintf(&b, "  %-12s %s\n", "kind:", d.Kind)
		}
		if d.LastError != "" {
			fmt.Fprintf(&b, "  %-12s %s\n", "last error:", indent(d.LastError))
		}
		if j.Item == nil {
			writePayload(&b, "payload", d.Payload)
		}
	}
	if j.State != fleet.StateUnknown {
		writeHistory(&b, j)
	}
	return b.String()
}

// writeHistory writes the per-attempt history: one line per attempt
// (number, outcome, start, end, session), its error below it, a stack
// trace line for line as the handler's panic gave it (paths as they are).
func writeHistory(b *strings.Builder, j itemJSON) {
	h := j.History
	switch {
	case !j.HistoryRecorded:
		b.WriteString("history: no history recorded (the item ended under code older than schema version 6)\n")
		return
	case len(h) == 0:
		b.WriteString("history: no attempt yet\n")
		return
	}
	n := 0
	for _, a := range h {
		if a.Outcome != store.AttemptRequeued {
			n++
		}
	}
	fmt.Fprintf(b, "history: %s", plural(n, "attempt"))
	if j.HistoryOmitted {
		b.WriteString(" (the oldest left out: an item keeps its last 20 failed attempts)")
	}
	b.WriteString("\n")
	for _, a := range h {
		if a.Outcome == store.AttemptRequeued {
			fmt.Fprintf(b, "  -- requeued from the %s items at %s; attempts count from 1 again\n", a.From, stampOf(a.EndedAt))
			continue
		}
		session := a.Session
		if session == "" {
			session = "-"
		}
		fmt.Fprintf(b, "  #%-3d %-13s started %s  ended %s  session %s\n", a.Number, a.Outcome, stampOf(a.StartedAt), stampOf(a.EndedAt), session)
		if a.Outcome == store.AttemptLost {
			b.WriteString("       no end recorded: its worker's session ended while it ran (process killed or cut off), or older code ended it\n")
		}
		for _, l := range strings.Split(strings.TrimRight(a.Error, "\n"), "\n") {
			if l != "" || a.Error != "" {
				fmt.Fprintf(b, "       | %s\n", l)
			}
		}
	}
}

func stampOf(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339Nano)
}

// indent keeps a multi-line text (a stack trace) readable under a field.
func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", 15))
}

// writePayload writes a payload: its text (JSON indented) when it is
// UTF-8, else a hex dump of its first 512 bytes.
func writePayload(b *strings.Builder, what string, p *payloadBody) {
	switch {
	case p == nil || p.Size == 0:
		fmt.Fprintf(b, "  %-12s (empty)\n", what+":")
	case p.Base64 != nil:
		n := min(len(p.Base64), 512)
		fmt.Fprintf(b, "  %-12s %s, not UTF-8 text%s:\n", what+":", plural(p.Size, "byte"), map[bool]string{true: " (the first 512)"}[n < p.Size])
		for _, l := range strings.Split(strings.TrimRight(hex.Dump(p.Base64[:n]), "\n"), "\n") {
			fmt.Fprintf(b, "    %s\n", l)
		}
	default:
		text := p.Text
		var buf bytes.Buffer
		if json.Valid([]byte(text)) && json.Indent(&buf, []byte(text), "", "  ") == nil {
			text = buf.String()
		}
		fmt.Fprintf(b, "  %s\n", what+" ("+plural(p.Size, "byte")+"):")
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			fmt.Fprintf(b, "    %s\n", l)
		}
	}
}

// locate says where the item id is, for a command that found it missing
// where it looked (deps on an item that is not waiting): its state and
// queue as crdbwork item reads them, in every queue's ended ids.
func locate(ctx context.Context, db claim.DB, g *globals, id uuid.UUID) (*fleet.ItemView, string, error) {
	queues, err := claim.Queues(ctx, db, g.tables())
	if err != nil {
		return nil, "", err
	}
	r, err := fleet.New(db, g.tables())
	if err != nil {
		return nil, "", err
	}
	v, err := r.Item(ctx, id, queues)
	if err != nil {
		return nil, "", err
	}
	var where string
	switch v.State {
	case fleet.StateUnknown:
		where = "it is nowhere (never enqueued, purged, or past its queue's dedup window)"
	case fleet.StateAcked, fleet.StateCancelled, fleet.StateTaken:
		where = fmt.Sprintf("it ended, %s, in queue %q", v.State, v.Queue)
	case fleet.StateDead:
		where = fmt.Sprintf("it is dead in queue %q", v.Queue)
		if len(v.Deaths) > 0 {
			where += fmt.Sprintf(" (reason %q)", v.Deaths[0].Reason)
		}
	default:
		where = fmt.Sprintf("it is %s in queue %q", v.State, v.Queue)
	}
	return v, where + " (`crdbwork item " + id.String() + "`)", nil
}
