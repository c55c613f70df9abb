package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/fleet"
	crsql "github.com/crdbwork/crdbwork/sql"
)

type sessionStatus struct {
	ID                    string  `json:"id"`
	Name                  string  `json:"name"`
	Host                  string  `json:"host"`
	PID                   int64   `json:"pid"`
	CreatedAt             string  `json:"created_at"`
	HeartbeatAt           string  `json:"heartbeat_at"`
	AgeSeconds            float64 `json:"age_seconds"`
	SinceHeartbeatSeconds float64 `json:"since_heartbeat_seconds"`
	ExpirySeconds         float64 `json:"expiry_seconds"`
	Parts                 string  `json:"parts"` // owned parts of --queue, as ranges ("0-3,8")
	NumParts              int     `json:"num_parts"`
	// Claimed is the number of items of the queue the session holds now.
	Claimed int64 `json:"claimed"`
	// Acked, Failed and InFlight are the session's counters as of its last
	// heartbeat: items acked and failed (nacked or dead-lettered) since it
	// started, handlers running.
	Acked    int64 `json:"acked"`
	Failed   int64 `json:"failed"`
	InFlight int64 `json:"in_flight"`
	// Stale: no heartbeat for more than two of the longest heartbeat
	// intervals its expiry allows (expiry / 3): probably dead, not yet
	// expired.
	Stale bool `json:"stale"`
}

type ownerStatus struct {
	Session string `json:"session"`
	Name    string `json:"name,omitempty"`
	Parts   string `json:"parts"`
	Count   int    `json:"count"`
}

// queueMembers are the sessions that work one queue (its members, which
// share its parts and limits) and the parts each owns.
type queueMembers struct {
	Queue   string         `json:"queue"`
	Members []memberStatus `json:"members"`
}

type memberStatus struct {
	Session string `json:"session"`
	Name    string `json:"name,omitempty"`
	// Joined: the session joined the queue. A live session that owns
	// parts of the queue without having joined it (code older than queue
	// membership) counts as a member too.
	Joined bool `json:"joined"`
	// Live: the session is live; an expired session's rows stay until a
	// peer reaps it, and it counts in no division meanwhile.
	Live     bool   `json:"live"`
	Parts    string `json:"parts"` // owned parts of the queue, as ranges ("0-3,8")
	NumParts int    `json:"num_parts"`
}

type backlogRow struct {
	Queue     string `json:"queue"`
	Part      int64  `json:"part"`
	Unclaimed int64  `json:"unclaimed"`
	Vested    int64  `json:"vested"`
	Claimed   int64  `json:"claimed"`
}

type backlogTotal struct {
	Queue     string `json:"queue"`
	Items     int64  `json:"items"`
	Unclaimed int64  `json:"unclaimed"`
	Vested    int64  `json:"vested"`
	Claimed   int64  `json:"claimed"`
}

// settingsJSON are a queue's settings other than its limits.
type settingsJSON struct {
	Fair              bool    `json:"fair"`
	AtMostOnce        bool    `json:"at_most_once"`
	DedupWindowSecond float64 `json:"dedup_window_seconds"`
	// Sequenced: items enqueued with a key run one at a time per key, in
	// enqueue order (crdbwork sequence; docs/sequences.md). SequencedItems:
	// the queue holds sequenced items (they keep their order even after
	// sequencing is turned off).
	Sequenced      bool `json:"sequenced"`
	SequencedItems bool `json:"sequenced_items"`
	// SequenceOnDeath is what a death of a sequenced item does to its key:
	// "advance" or "hold" (crdbwork sequence hold).
	SequenceOnDeath string `json:"sequence_on_death"`
}

// kindRow is one kind's items (claim.NewItem.Kind; "" for the items
// without one): unclaimed, of which due (past its vesting time; the oldest
// due for OldestDueSeconds), claimed and dead.
type kindRow struct {
	Kind             string  `json:"kind"`
	Unclaimed        int64   `json:"unclaimed"`
	Due              int64   `json:"due"`
	OldestDueSeconds float64 `json:"oldest_due_seconds"`
	Claimed          int64   `json:"claimed"`
	Dead             int64   `json:"dead"`
}

// tenantRow is one tenant's backlog.
type tenantRow struct {
	Tenant    string `json:"tenant"`
	Unclaimed int64  `json:"unclaimed"`
	Due       int64  `json:"due"`
}

type status struct {
	Engine   string `json:"engine"`
	Queue    string `json:"queue"`
	NumParts int    `json:"num_parts"`
	// Known: the queue has a stored row, items, dead or waiting items,
	// ended ids or schedules; a queue nobody has used is probably a
	// mistyped --queue.
	Known bool `json:"known"`
	// LastActivity is the latest of LastEnded (the latest end of an item
	// the queue remembers for its dedup window: acked, dead, cancelled,
	// taken), LastDied (its latest death) and ScheduleMarked (the latest
	// period one of its Schedules enqueued), RFC 3339; "" for none.
	LastActivity   string `json:"last_activity"`
	LastEnded      string `json:"last_ended"`
	LastDied       string `json:"last_died"`
	ScheduleMarked string `json:"schedule_marked"`
	Schedules      int64  `json:"schedules"`
	// PartsStored: the queue has a stored part count (else it has 1, the
	// count of a queue nobody set up).
	PartsStored bool `json:"parts_stored"`
	// Paused: claims of the queue return nothing (crdbwork pause / resume).
	Paused bool `json:"paused"`
	// OldestDueSeconds is the age of the queue's oldest unclaimed item that
	// is due (now minus its vesting time, database clock); 0 if none.
	OldestDueSeconds float64         `json:"oldest_due_seconds"`
	Sessions         []sessionStatus `json:"sessions"`
	PartOwners       []ownerStatus   `json:"part_owners"`
	// UnownedParts are the parts nobody owns, when the queue's parts are
	// in use (PartsInUse: a session owns one of them, i.e. workers run it
	// in parts mode); "" otherwise, where any session claims any item.
	UnownedParts string         `json:"unowned_parts"`
	PartsInUse   bool           `json:"parts_in_use"`
	Backlog      []backlogRow   `json:"backlog"`
	Queues       []backlogTotal `json:"queues"`
	Dead         int64          `json:"dead"`
	// Snoozed counts unclaimed items a handler snoozed; Cancelling counts
	// running items whose cancel was asked for and which have not ended
	// (docs/cancel-and-snooze.md).
	Snoozed    int64 `json:"snoozed"`
	Cancelling int64 `json:"cancelling"`
	// Waiting counts the items that wait for prerequisites (NewItem.After;
	// docs/dependencies.md), kept out of the backlog until released.
	Waiting int64 `json:"waiting"`
	// ItemsPerSecond is the throughput over the last few seconds (--watch
	// only; -1 until two reads are in).
	ItemsPerSecond float64 `json:"items_per_second,omitempty"`
	// Limits are the queue's stored fleet-wide limits (crdbwork limit).
	Limits *limitsJSON `json:"limits"`
	// Settings are the queue's other settings.
	Settings settingsJSON `json:"settings"`
	// Tenants are the tenants with the most unclaimed items (at most
	// claim.InspectTenants), most first.
	Tenants []tenantRow `json:"tenants"`
	// Kinds are the queue's items by kind, at most fleet.MaxKinds, the
	// most unclaimed first (then claimed, dead, by name); MoreKinds: the
	// queue has more kinds. Read with --queue (not with --watch) and with
	// --by-kind; null when not read.
	Kinds     []kindRow `json:"kinds"`
	MoreKinds bool      `json:"more_kinds,omitempty"`
	// QueueMembers lists every queue that has members or owned parts,
	// by name, with its members (live or not yet reaped) by session id.
	QueueMembers []queueMembers `json:"queue_members"`
	// Progress lists the items that reported a progress, the most recent
	// report first (at most claim.DefaultProgressing), and Retention the
	// queue's retention of dead items (progress.go).
	Progress  []progressRow `json:"progress"`
	Retention retentionJSON `json:"retention"`

	now       time.Time // the database clock of the reading
	showKinds bool      // --by-kind: show Kinds even if the queue has one kind
}

// stamp writes a time for JSON: RFC 3339 in UTC, "" for nil.
func stamp(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ago says how long before now the RFC 3339 time s was, for people
// ("3h12m ago", "-" for none).
func ago(s string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if s == "" || err != nil {
		return "-"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
	case d >= time.Hour:
		return d.Truncate(time.Minute).String() + " ago"
	default:
		return d.Truncate(time.Second).String() + " ago"
	}
}

// readStatus renders the status of one queue of the fleet's snapshot:
// its figures, parts, owners, sessions and members from snap, and what
// the fleet does not hold (settings, tenant limits, retention, sequencing,
// progress) through claim.Queue.
func readStatus(ctx context.Context, db claim.DB, tables crsql.Tables, engine string, snap *fleet.Snapshot, fq *fleet.Queue) (*status, error) {
	queue := fq.Name
	s := &status{Engine: engine, Queue: queue, Sessions: []sessionStatus{},
		PartOwners: []ownerStatus{}, Backlog: []backlogRow{}, Queues: []backlogTotal{}, QueueMembers: []queueMembers{}, Tenants: []tenantRow{},
		Progress: []progressRow{}}
	q, err := claim.New(db, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return nil, err
	}
	for _, p := range fq.Parts {
		if p.Unclaimed+p.Claimed > 0 {
			s.Backlog = append(s.Backlog, backlogRow{Queue: queue, Part: int64(p.Part), Unclaimed: p.Unclaimed, Vested: p.Due, Claimed: p.Claimed})
		}
	}
	if fq.HasItems() {
		s.Queues = append(s.Queues, backlogTotal{Queue: queue, Items: fq.Unclaimed + fq.Claimed,
			Unclaimed: fq.Unclaimed, Vested: fq.Due, Claimed: fq.Claimed})
	}
	s.NumParts, s.Paused, s.Dead = fq.NumParts, fq.Paused, fq.Dead
	s.Snoozed, s.Cancelling, s.Waiting = fq.Snoozed, fq.Cancelling, fq.Waiting
	s.OldestDueSeconds = fq.OldestDue().Seconds()
	s.PartsStored = fq.Stored
	s.Known = fq.Known()
	s.LastActivity, s.LastEnded, s.LastDied, s.ScheduleMarked = stamp(fq.LastActivity()), stamp(fq.LastEnded), stamp(fq.LastDied), stamp(fq.ScheduleMarked)
	s.Schedules = fq.Schedules
	s.now = fq.Now
	settings, err := q.Settings(ctx)
	if err != nil {
		return nil, err
	}
	s.Limits = &limitsJSON{MaxInFlight: settings.MaxInFlight, Rate: settings.Rate,
		TenantMaxInFlight: settings.TenantMaxInFlight, TenantRate: settings.TenantRate, Tenants: map[string]limitJSON{}}
	for t, l := range settings.TenantLimits {
		s.Limits.Tenants[t] = limitJSON{MaxInFlight: l.MaxInFlight, Rate: l.Rate}
	}
	s.Settings = settingsJSON{Fair: settings.Fair, AtMostOnce: settings.AtMostOnce, DedupWindowSecond: settings.DedupWindow.Seconds()}
	s.Settings.Sequenced, s.Settings.SequencedItems, s.Settings.SequenceOnDeath = settings.Sequenced, settings.SequencedItems, onDeath(settings.SequenceHold)
	for _, t := range fq.Tenants {
		s.Tenants = append(s.Tenants, tenantRow{Tenant: t.Tenant, Unclaimed: t.Unclaimed, Due: t.Due})
	}
	if fq.Kinds != nil {
		s.Kinds, s.MoreKinds = []kindRow{}, fq.MoreKinds
		for _, k := range fq.Kinds {
			r := kindRow{Kind: k.Kind, Unclaimed: k.Unclaimed, Due: k.Due, Claimed: k.Claimed, Dead: k.Dead}
			if k.OldestDueAt != nil {
				r.OldestDueSeconds = max(0, fq.Now.Sub(*k.OldestDueAt)).Seconds()
			}
			s.Kinds = append(s.Kinds, r)
		}
	}
	s.Retention = retentionOf(settings.Retention)
	if s.Progress, err = readProgress(ctx, q); err != nil {
		return nil, err
	}

	ownerNames := map[uuid.UUID]string{}
	for _, in := range snap.Sessions {
		ownerNames[in.ID] = in.Name
	}
	// Part owners.
	byOwner := map[uuid.UUID][]int{}
	owned := map[int]bool{}
	var order []uuid.UUID
	for _, o := range snap.Owners {
		if o.Queue != queue {
			continue
		}
		if _, ok := byOwner[o.Session]; !ok {
			order = append(order, o.Session)
		}
		byOwner[o.Session] = append(byOwner[o.Session], o.Part)
		owned[o.Part] = true
	}
	for _, id := range order {
		s.PartOwners = append(s.PartOwners, ownerStatus{Session: id.String(), Name: ownerNames[id],
			Parts: ranges(byOwner[id]), Count: len(byOwner[id])})
	}
	// Parts nobody owns matter only where sessions work the queue in parts
	// mode: without parts any session claims any item.
	s.PartsInUse = len(owned) > 0
	var unowned []int
	for p := 0; p < s.NumParts && s.PartsInUse; p++ {
		if !owned[p] {
			unowned = append(unowned, p)
		}
	}
	s.UnownedParts = ranges(unowned)
	s.Sessions = sessionRows(snap.Sessions, byOwner, fq.Holders)
	s.QueueMembers = readMembers(snap)
	return s, nil
}

// readQueueStatus reads the status of one queue (readStatus of a
// snapshot of that queue).
func readQueueStatus(ctx context.Context, db claim.DB, tables crsql.Tables, queue string) (*status, error) {
	r, err := fleet.New(db, tables)
	if err != nil {
		return nil, err
	}
	snap, err := r.Snapshot(ctx, fleet.Options{Queue: queue, Parts: true, Tenants: true})
	if err != nil {
		return nil, err
	}
	return readStatus(ctx, db, tables, cli.EngineName(ctx, db), snap, &snap.Queues[0])
}

// sessionRows describes the live sessions, with the parts each owns
// (byOwner) and the items each holds (claimedBy).
func sessionRows(sessions []fleet.Session, byOwner map[uuid.UUID][]int, claimedBy map[uuid.UUID]int64) []sessionStatus {
	out := []sessionStatus{}
	for _, in := range sessions {
		out = append(out, sessionStatus{
			ID: in.ID.String(), Name: in.Name, Host: in.Host, PID: in.PID,
			CreatedAt: in.CreatedAt.UTC().Format(time.RFC3339Nano), HeartbeatAt: in.HeartbeatAt.UTC().Format(time.RFC3339Nano),
			AgeSeconds: in.Age.Seconds(), SinceHeartbeatSeconds: in.SinceHeartbeat.Seconds(), ExpirySeconds: in.Expiry.Seconds(),
			Parts: ranges(byOwner[in.ID]), NumParts: len(byOwner[in.ID]),
			Claimed: claimedBy[in.ID],
			Acked:   in.Reported.Acked, Failed: in.Reported.Failed, InFlight: in.Reported.InFlight,
			Stale: in.Stale,
		})
	}
	return out
}

// readMembers returns every queue's members and part owners of the
// snapshot, by queue and session.
func readMembers(snap *fleet.Snapshot) []queueMembers {
	type key struct {
		queue string
		id    uuid.UUID
	}
	members := map[key]*memberStatus{}
	names, alive := map[uuid.UUID]string{}, map[uuid.UUID]bool{}
	for _, in := range snap.Sessions {
		names[in.ID], alive[in.ID] = in.Name, true
	}
	member := func(q string, id uuid.UUID) *memberStatus {
		m := members[key{q, id}]
		if m == nil {
			m = &memberStatus{Session: id.String(), Name: names[id], Live: alive[id]}
			members[key{q, id}] = m
		}
		return m
	}
	for _, j := range snap.Members {
		member(j.Queue, j.Session).Joined = true
	}
	parts := map[key][]int{}
	for _, o := range snap.Owners {
		member(o.Queue, o.Session)
		parts[key{o.Queue, o.Session}] = append(parts[key{o.Queue, o.Session}], o.Part)
	}
	keys := make([]key, 0, len(members))
	for k := range members {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].queue != keys[j].queue {
			return keys[i].queue < keys[j].queue
		}
		return keys[i].id.String() < keys[j].id.String()
	})
	out := []queueMembers{}
	for _, k := range keys {
		m := members[k]
		m.Parts, m.NumParts = ranges(parts[k]), len(parts[k])
		if n := len(out); n == 0 || out[n-1].Queue != k.queue {
			out = append(out, queueMembers{Queue: k.queue})
		}
		out[len(out)-1].Members = append(out[len(out)-1].Members, *m)
	}
	return out
}

// ranges writes sorted parts compactly: [0 1 2 3 8] is "0-3,8".
func ranges(parts []int) string {
	if len(parts) == 0 {
		return ""
	}
	ps := append([]int(nil), parts...)
	sort.Ints(ps)
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ps[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ps[j]))
		}
		i = j + 1
	}
	return b.String()
}

func cmdStatus(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var watch, byKind bool
	var interval time.Duration
	f := prog.NewFlagSet(name, `Shows the state of --queue, or of every queue without it: parts, backlog
(unclaimed, due = unclaimed and past its vesting time, claimed) by part, by
tenant and by kind, the age of the oldest due item, dead items, pause,
settings and limits; the live sessions (items acked and handlers running as of their last
heartbeat, items held now, parts owned, and a ! after the heartbeat age of a
session that has missed two heartbeats and is probably dead), the parts nobody
owns, and which sessions work which queue. With --json: one object (with
--queue) or {"engine", "queues": [one object per queue]}.

The items by kind (unclaimed, due, the oldest due, claimed and dead for each
kind, the 20 with the most unclaimed items) show which kind backs up: with
--queue when its items have more than one kind, for every queue with
--by-kind. They read each queue's whole backlog and dead items.

With --watch it redraws every --interval until Ctrl-C (plain snapshots, one
after another, when stdout is not a terminal), adding the throughput over the
last few seconds.`)
	g.register(f, "the queue to show (default: every queue)")
	f.BoolVar(&watch, "watch", false, "redraw every --interval until interrupted")
	f.BoolVar(&byKind, "by-kind", false, "show the items by kind of every queue (with --queue: even of a single kind; with --watch: at each redraw)")
	f.DurationVar(&interval, "interval", 2*time.Second, false, "time between redraws with --watch")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	pool, err := g.open(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	if g.queue != "" {
		if err := requireQueue(ctx, pool, g.tables(), g.queue); err != nil {
			return err
		}
	}
	if watch {
		return watchStatus(ctx, pool, &g, interval, byKind, out)
	}
	text, v, err := readAll(ctx, pool, &g, nil, byKind)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if g.json {
		return cli.PrintJSON(out, v)
	}
	out.Printf("%s", text)
	return nil
}

// allStatus is status without --queue, as JSON.
type allStatus struct {
	Engine string    `json:"engine"`
	Queues []*status `json:"queues"`
	// Sessions are the live sessions; their parts (Parts is "") and
	// claimed items are counted over every queue.
	Sessions []sessionStatus `json:"sessions"`
	// QueueMembers lists every queue's members.
	QueueMembers []queueMembers `json:"queue_members"`
	// MoreQueues: there are more queues than the fleet.DefaultMaxQueues
	// listed (by name). LiveSessions counts the live sessions, all of
	// them: Sessions lists the first fleet.DefaultMaxSessions by id.
	MoreQueues   bool  `json:"more_queues"`
	LiveSessions int64 `json:"live_sessions"`
	// ExpiredSessions counts the expired sessions no peer has reaped yet:
	// their parts and claims wait for the reap.
	ExpiredSessions int64 `json:"expired_sessions"`
}

// readAll reads the status of --queue, or of every queue, from one
// snapshot of the fleet, and renders it for people; v is what --json
// prints. tp, if not nil, adds the throughput (of --queue, or of the
// first queue: the sessions are the same). The items by kind are read
// with byKind (--by-kind), and of --queue without tp (not at each redraw
// of --watch).
func readAll(ctx context.Context, db claim.DB, g *globals, tp *fleet.AckRate, byKind bool) (string, any, error) {
	r, err := fleet.New(db, g.tables())
	if err != nil {
		return "", nil, err
	}
	snap, err := r.Snapshot(ctx, fleet.Options{Queue: g.queue, Parts: true, Tenants: true, Kinds: byKind || (g.queue != "" && tp == nil)})
	if err != nil {
		return "", nil, err
	}
	all := &allStatus{Engine: cli.EngineName(ctx, db), Queues: []*status{}, MoreQueues: snap.MoreQueues, LiveSessions: snap.LiveSessions,
		ExpiredSessions: snap.ExpiredSessions}
	holders := map[uuid.UUID]int64{}
	for i := range snap.Queues {
		s, err := readStatus(ctx, db, g.tables(), all.Engine, snap, &snap.Queues[i])
		if err != nil {
			return "", nil, err
		}
		s.showKinds = byKind
		all.Queues = append(all.Queues, s)
		for id, n := range snap.Queues[i].Holders {
			holders[id] += n
		}
	}
	if g.queue == "" {
		byOwner := map[uuid.UUID][]int{}
		for _, o := range snap.Owners {
			byOwner[o.Session] = append(byOwner[o.Session], o.Part)
		}
		all.Sessions = sessionRows(snap.Sessions, byOwner, holders)
		for i := range all.Sessions {
			all.Sessions[i].Parts = "" // parts of several queues: a count only
		}
		all.QueueMembers = readMembers(snap)
	}
	var b strings.Builder
	if tp != nil {
		rate := tp.Add(time.Now(), snap.Sessions)
		if g.queue != "" {
			all.Queues[0].ItemsPerSecond = rate
		}
		if rate >= 0 {
			fmt.Fprintf(&b, "throughput: %.0f items/s acked over the last %v (from the sessions' heartbeats)\n", rate, tp.Span().Round(time.Second))
		}
	}
	if g.queue != "" {
		b.WriteString(formatStatus(all.Queues[0], tp != nil))
		return b.String(), all.Queues[0], nil
	}
	b.WriteString(formatAll(all, tp != nil))
	return b.String(), all, nil
}

// formatAll writes every queue's status for people: one line per queue,
// then the sessions and members once.
func formatAll(all *allStatus, compact bool) string {
	var b strings.Builder
	if len(all.Queues) == 0 {
		fmt.Fprintf(&b, "no queues on %s: the crdbwork tables hold no queue row, item, dead or waiting item, ended id or schedule\n\n", all.Engine)
		writeSessions(&b, all.Sessions, compact, true)
		return b.String()
	}
	fmt.Fprintf(&b, "%s on %s (crdbwork status --queue NAME for one)\n", plural(len(all.Queues), "queue"), all.Engine)
	if all.MoreQueues {
		fmt.Fprintf(&b, "(the first %d by name: there are more)\n", len(all.Queues))
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tPARTS\tUNCLAIMED\tDUE\tOLDEST DUE\tCLAIMED\tDEAD\tMEMBERS\tLAST ACTIVITY\tSTATE")
	for _, s := range all.Queues {
		var unclaimed, due, claimed int64
		for _, t := range s.Queues {
			unclaimed, due, claimed = t.Unclaimed, t.Vested, t.Claimed
		}
		members := 0
		for _, m := range s.QueueMembers {
			if m.Queue == s.Queue {
				members = len(m.Members)
			}
		}
		state := []string{}
		if s.Paused {
			state = append(state, "PAUSED")
		}
		if s.Settings.Fair {
			state = append(state, "fair")
		}
		if s.Settings.Sequenced {
			state = append(state, "sequenced")
		}
		if s.Limits != nil && !s.Limits.none() {
			state = append(state, "limited")
		}
		if s.Waiting > 0 {
			state = append(state, fmt.Sprintf("waiting=%d", s.Waiting))
		}
		oldest := "-"
		if due > 0 {
			oldest = round(secs(s.OldestDueSeconds)).String()
		}
		if s.Schedules > 0 {
			state = append(state, plural(int(s.Schedules), "schedule"))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%s\t%s\n", s.Queue, s.NumParts, unclaimed, due, oldest, claimed, s.Dead, members,
			ago(s.LastActivity, s.now), orDash(strings.Join(state, ",")))
	}
	tw.Flush()
	writeKindsAll(&b, all.Queues)
	b.WriteString("\n")
	writeSessions(&b, all.Sessions, compact, true)
	if more := all.LiveSessions - int64(len(all.Sessions)); more > 0 {
		fmt.Fprintf(&b, "(%s not listed)\n", plural(int(more), "more live session"))
	}
	if all.ExpiredSessions > 0 {
		fmt.Fprintf(&b, "%s not yet reaped (their parts and claims wait for a live peer's reap)\n", plural(int(all.ExpiredSessions), "expired session"))
	}
	writeMembers(&b, all.QueueMembers, compact)
	return b.String()
}

// throughputWindow is how far back status --watch looks for its rate.
const throughputWindow = 10 * time.Second

// watchStatus redraws the status every interval until ctx ends. Read
// errors are shown in place of the status and retried: a watch outlives a
// database restart.
func watchStatus(ctx context.Context, db claim.DB, g *globals, interval time.Duration, byKind bool, out *cli.Console) error {
	tty := cli.IsTerminal(out.Stdout()) && !g.json
	tp := fleet.AckRate{Window: throughputWindow}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, 5*time.Second))
		text, v, err := readAll(rctx, db, g, &tp, byKind)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		switch {
		case err != nil:
			text = fmt.Sprintf("cannot read the status: %s\n", cli.OneLine(err.Error()))
		case g.json:
			b, _ := json.Marshal(v)
			text = string(b) + "\n"
		}
		if tty {
			header := fmt.Sprintf("crdbwork status --watch: every %v, %s (Ctrl-C to stop)\n", interval, now.Format("15:04:05"))
			out.Redraw(header + text)
		} else if g.json {
			out.Printf("%s", text)
		} else {
			out.Printf("--- %s\n%s", now.Format(time.RFC3339), text)
		}
		select {
		case <-ctx.Done():
			if tty {
				out.Printf("\n")
			}
			return nil
		case <-t.C:
		}
	}
}

// formatStatus writes the status for people. compact leaves out the
// backlog by part (for --watch, which must fit a screen).
func formatStatus(s *status, compact bool) string {
	var b strings.Builder
	var unclaimed, due, claimed int64
	for _, t := range s.Queues {
		if t.Queue == s.Queue {
			unclaimed, due, claimed = t.Unclaimed, t.Vested, t.Claimed
		}
	}
	fmt.Fprintf(&b, "queue %q on %s: %s, %s", s.Queue, s.Engine, plural(s.NumParts, "part"), plural(int(s.Dead), "dead item"))
	if s.Paused {
		b.WriteString(", PAUSED (nothing is claimed; `crdbwork resume` ends it)")
	}
	b.WriteString("\n")
	if s.Waiting > 0 {
		fmt.Fprintf(&b, "waiting: %s for prerequisites (`crdbwork deps ID` shows one)\n", verb(int(s.Waiting), "item waits", "items wait"))
	}
	if s.LastActivity != "" || s.Schedules > 0 {
		fmt.Fprintf(&b, "last activity: %s (last end %s, last death %s", ago(s.LastActivity, s.now), ago(s.LastEnded, s.now), ago(s.LastDied, s.now))
		if s.Schedules > 0 {
			fmt.Fprintf(&b, "; %s, last period enqueued %s", plural(int(s.Schedules), "schedule"), ago(s.ScheduleMarked, s.now))
		}
		b.WriteString(")\n")
	}
	fmt.Fprintf(&b, "backlog: %d unclaimed, %d due", unclaimed, due)
	if due > 0 {
		age := secs(s.OldestDueSeconds)
		if age >= time.Second {
			age = age.Round(100 * time.Millisecond)
		}
		fmt.Fprintf(&b, " (oldest due for %s)", round(age))
	}
	fmt.Fprintf(&b, ", %d claimed", claimed)
	if s.Snoozed > 0 {
		fmt.Fprintf(&b, ", %d snoozed", s.Snoozed)
	}
	if s.Cancelling > 0 {
		fmt.Fprintf(&b, ", %d cancelling (asked to stop)", s.Cancelling)
	}
	b.WriteString("\n")
	if s.Limits != nil && !s.Limits.none() {
		b.WriteString(s.Limits.format())
	}
	if len(s.Tenants) > 0 && !compact {
		b.WriteString("tenants (most unclaimed first):")
		for _, t := range s.Tenants {
			fmt.Fprintf(&b, " %s %d (%d due);", t.Tenant, t.Unclaimed, t.Due)
		}
		b.WriteString("\n")
	}
	if s.Settings.Fair || s.Settings.AtMostOnce || s.Settings.Sequenced {
		fmt.Fprintf(&b, "settings: fair %v, at most once %v, sequenced %v", s.Settings.Fair, s.Settings.AtMostOnce, s.Settings.Sequenced)
		if s.Settings.Sequenced || s.Settings.SequencedItems {
			fmt.Fprintf(&b, " (on a death: %s)", s.Settings.SequenceOnDeath)
		}
		b.WriteString("\n")
	}
	if s.Settings.SequencedItems && !s.Settings.Sequenced {
		b.WriteString("sequencing: off, but sequenced items remain: they keep one item in flight per key, in order, until they end\n")
	}
	if s.Retention != retentionOf(claim.Retention{DeadMaxAge: claim.DefaultDeadMaxAge, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}) {
		fmt.Fprintf(&b, "retention: %s\n", s.Retention.format())
	}
	if !s.Known {
		fmt.Fprintf(&b, "warning: queue %q has no stored row, no items, no dead or waiting items, no ended ids and no schedules\n", s.Queue)
	}
	b.WriteString("\n")
	writeSessions(&b, s.Sessions, compact, false)
	writeOwners(&b, s)
	writeMembers(&b, s.QueueMembers, compact)
	writeProgress(&b, s.Progress, compact)
	b.WriteString("\n")
	if len(s.Kinds) > 1 || (s.showKinds && s.Kinds != nil) {
		writeKinds(&b, s)
		b.WriteString("\n")
	}
	if len(s.Backlog) == 0 {
		fmt.Fprintf(&b, "backlog: queue %q has no items\n", s.Queue)
		return b.String()
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	if compact {
		fmt.Fprintln(tw, "QUEUE\tUNCLAIMED\tDUE\tCLAIMED")
		for _, t := range s.Queues {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", t.Queue, t.Unclaimed, t.Vested, t.Claimed)
		}
		tw.Flush()
		return b.String()
	}
	b.WriteString("backlog (due: unclaimed and past its vesting time)\n")
	fmt.Fprintln(tw, "QUEUE\tPART\tUNCLAIMED\tDUE\tCLAIMED")
	for _, r := range s.Backlog {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", r.Queue, r.Part, r.Unclaimed, r.Vested, r.Claimed)
	}
	for _, t := range s.Queues {
		fmt.Fprintf(tw, "%s\tall\t%d\t%d\t%d\n", t.Queue, t.Unclaimed, t.Vested, t.Claimed)
	}
	tw.Flush()
	return b.String()
}

// kindHeader is the header of the tables of items by kind.
const kindHeader = "KIND\tUNCLAIMED\tDUE\tOLDEST DUE\tCLAIMED\tDEAD"

// kindCells writes one kind's cells of a table of items by kind.
func kindCells(k kindRow) string {
	name := k.Kind
	if name == "" {
		name = "(none)"
	}
	oldest := "-"
	if k.Due > 0 {
		oldest = round(secs(k.OldestDueSeconds)).String()
	}
	return fmt.Sprintf("%s\t%d\t%d\t%s\t%d\t%d", cli.Fit(name, 30), k.Unclaimed, k.Due, oldest, k.Claimed, k.Dead)
}

// writeKinds writes one queue's items by kind.
func writeKinds(b *strings.Builder, s *status) {
	if len(s.Kinds) == 0 {
		fmt.Fprintf(b, "by kind: queue %q has no items and no dead items\n", s.Queue)
		return
	}
	b.WriteString("by kind (the most unclaimed first; (none): items without a kind)\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, kindHeader)
	for _, k := range s.Kinds {
		fmt.Fprintln(tw, kindCells(k))
	}
	tw.Flush()
	if s.MoreKinds {
		fmt.Fprintf(b, "(the first %d kinds: there are more)\n", len(s.Kinds))
	}
}

// writeKindsAll writes every queue's items by kind (--by-kind), one line
// per queue and kind.
func writeKindsAll(b *strings.Builder, queues []*status) {
	if len(queues) == 0 || !queues[0].showKinds {
		return
	}
	b.WriteString("\nby kind (each queue's, the most unclaimed first; (none): items without a kind)\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\t"+kindHeader)
	var more []string
	for _, s := range queues {
		for _, k := range s.Kinds {
			fmt.Fprintf(tw, "%s\t%s\n", s.Queue, kindCells(k))
		}
		if s.MoreKinds {
			more = append(more, s.Queue)
		}
	}
	tw.Flush()
	if len(more) > 0 {
		fmt.Fprintf(b, "(the first %d kinds of %s: there are more)\n", fleet.MaxKinds, strings.Join(more, ", "))
	}
}

// writeSessions writes the live sessions: counters, heartbeat age, items
// held and parts owned, of one queue or (allQueues) of every queue.
func writeSessions(b *strings.Builder, sessions []sessionStatus, compact, allQueues bool) {
	stale := 0
	for _, ss := range sessions {
		if ss.Stale {
			stale++
		}
	}
	fmt.Fprintf(b, "%s", plural(len(sessions), "live session"))
	if stale > 0 {
		fmt.Fprintf(b, " (%d STALE, its BEAT marked !: missed heartbeats, probably dead)", stale)
	}
	b.WriteString("\n")
	if len(sessions) == 0 {
		return
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tNAME\tPID\tAGE\tBEAT\tACKED\tRUN\tCLAIMED\tPARTS")
	for _, ss := range sessions {
		hb := secs(ss.SinceHeartbeatSeconds).Round(10 * time.Millisecond).String()
		if ss.Stale {
			hb += "!"
		}
		parts := partList(ss.Parts)
		if allQueues {
			parts = strconv.Itoa(ss.NumParts)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", ss.ID[:8], cli.Fit(orDash(ss.Name), 15), ss.PID,
			round(secs(ss.AgeSeconds)).Round(time.Second), hb, ss.Acked, ss.InFlight, ss.Claimed, parts)
	}
	tw.Flush()
	if !compact {
		what := "of the queue"
		if allQueues {
			what = "of every queue"
		}
		fmt.Fprintf(b, "(BEAT: time since its last heartbeat; ACKED and RUN: items acked since it started and handlers\nrunning, as of that heartbeat; CLAIMED: items %s it holds now; PARTS: parts %[1]s it owns)\n", what)
	}
}

// partList writes a part list for a table cell: "none" when empty, so that
// it cannot be read as part 0.
func partList(r string) string {
	if r == "" {
		return "none"
	}
	return r
}

// writeOwners writes the parts held by expired sessions and the parts
// owned by nobody, naming the parts so that "0" can only mean part 0.
func writeOwners(b *strings.Builder, s *status) {
	live := map[string]bool{}
	for _, ss := range s.Sessions {
		live[ss.ID] = true
	}
	for _, o := range s.PartOwners {
		if !live[o.Session] {
			fmt.Fprintf(b, "parts %s of %q: held by expired session %s (until a peer reaps it)\n", o.Parts, s.Queue, o.Session[:8])
		}
	}
	switch {
	case !s.PartsInUse && s.NumParts > 1:
		fmt.Fprintf(b, "parts of %q: not in use (%d parts, no session owns one: sessions without parts claim any item)\n", s.Queue, s.NumParts)
		return
	case !s.PartsInUse:
		fmt.Fprintf(b, "parts of %q: not in use (any session claims any item)\n", s.Queue)
		return
	case s.UnownedParts == "":
		fmt.Fprintf(b, "parts of %q owned by nobody: none\n", s.Queue)
		return
	}
	n := 0
	for _, r := range strings.Split(s.UnownedParts, ",") {
		lo, hi, found := strings.Cut(r, "-")
		a, _ := strconv.Atoi(lo)
		z := a
		if found {
			z, _ = strconv.Atoi(hi)
		}
		n += z - a + 1
	}
	word := "parts"
	if n == 1 {
		word = "part"
	}
	fmt.Fprintf(b, "parts of %q owned by nobody: %d (%s %s)\n", s.Queue, n, word, s.UnownedParts)
}

// writeMembers writes which sessions work which queue and own which of
// its parts.
func writeMembers(b *strings.Builder, queues []queueMembers, compact bool) {
	if len(queues) == 0 {
		b.WriteString("queues worked: none (no session has joined a queue)\n")
		return
	}
	b.WriteString("\nqueues worked")
	if !compact {
		b.WriteString(" (each queue's parts and limits are shared by its live members only)")
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSESSION\tNAME\tPARTS")
	for _, q := range queues {
		for _, m := range q.Members {
			id := m.Session[:8]
			switch {
			case !m.Live:
				id += " (expired)"
			case !m.Joined:
				id += " (not joined: older code)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", q.Queue, id, cli.Fit(orDash(m.Name), 15), partList(m.Parts))
		}
	}
	tw.Flush()
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// round shortens a duration for people.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}

// plural writes a count and its noun, in the plural unless it is 1: "1
// queue", "2 queues", "0 dead items".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// verb is plural for a noun and its verb, one and many given whole: "1
// item waits", "3 items wait".
func verb(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
