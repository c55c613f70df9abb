package dashboard

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/schedule"
)

// pageNum reads the page number of a request (1 on).
func pageNum(r *http.Request) int {
	p, err := strconv.Atoi(r.URL.Query().Get("page"))
	if err != nil || p < 1 {
		return 1
	}
	return p
}

// pager is a page of a list that is held in memory.
type pager struct {
	Page, Pages, Total int
	Prev, Next         int    // 0: none
	PrevURL, NextURL   string // the query strings of those pages, the request's other parameters kept
}

func paginate(r *http.Request, total, size int) (pager, int, int) {
	pages := max(1, (total+size-1)/size)
	page := min(pageNum(r), pages)
	p := pager{Page: page, Pages: pages, Total: total}
	link := func(n int) string {
		q := r.URL.Query()
		q.Set("page", strconv.Itoa(n))
		return "?" + q.Encode()
	}
	if page > 1 {
		p.Prev, p.PrevURL = page-1, link(page-1)
	}
	if page < pages {
		p.Next, p.NextURL = page+1, link(page+1)
	}
	from := (page - 1) * size
	return p, from, min(total, from+size)
}

// overviewData is the overview page.
type overviewData struct {
	At       time.Time
	Err      string
	Queues   []queueFigures
	Pager    pager
	Filter   string
	Sort     string
	Sessions int64
	Stale    int
	// Expired counts the expired sessions not yet reaped.
	Expired int64
	// MoreQueues: the queues listed are the first fleet.DefaultMaxQueues
	// by name, and there are more.
	MoreQueues bool
	QueuesRead int
	Fleet      []float64
	FleetNow   float64
	Totals     struct{ Unclaimed, Due, Claimed, Dead int64 }
}

func (h *handler) overview(r *http.Request) (string, any, error) {
	snap := h.sampler.current(r.Context())
	d := &overviewData{At: snap.At, Err: snap.Err, Filter: r.URL.Query().Get("q"), Sort: r.URL.Query().Get("sort"), FleetNow: -1}
	var qs []queueFigures
	for _, q := range snap.Queues {
		if d.Filter == "" || strings.Contains(q.Name, d.Filter) {
			qs = append(qs, q)
		}
		d.Totals.Unclaimed += q.Unclaimed
		d.Totals.Due += q.Due
		d.Totals.Claimed += q.Claimed
		d.Totals.Dead += q.Dead
	}
	key := map[string]func(q queueFigures) float64{
		"backlog": func(q queueFigures) float64 { return float64(q.Unclaimed + q.Claimed) },
		"dead":    func(q queueFigures) float64 { return float64(q.Dead) },
		"rate":    func(q queueFigures) float64 { return q.EndRate },
		"oldest": func(q queueFigures) float64 {
			return q.OldestDue().Seconds()
		},
	}[d.Sort]
	if key != nil {
		sort.SliceStable(qs, func(i, j int) bool { return key(qs[i]) > key(qs[j]) })
	}
	var from, to int
	d.Pager, from, to = paginate(r, len(qs), h.opts.PageSize)
	d.Queues = qs[from:to]
	d.Sessions, d.Expired, d.MoreQueues, d.QueuesRead = snap.Live, snap.Expired, snap.MoreQueues, len(snap.Queues)
	for _, s := range snap.Sessions {
		if s.Stale {
			d.Stale++
		}
	}
	for _, p := range h.sampler.fleetRates() {
		d.Fleet = append(d.Fleet, p.Rate)
		d.FleetNow = p.Rate
	}
	return "Queues", d, nil
}

// queueData is one queue's page.
type queueData struct {
	Name string
	// Queue is the queue's state as the fleet's read model reads it
	// (exact counts, by part, by tenant and by kind: the page shows the
	// kinds when the queue has more than one).
	Queue    fleet.Queue
	Figures  *queueFigures
	Holders  []holder
	Limits   []tenantLimit
	Dead     []store.DeadPageRow
	Settings claim.Settings
	// KeepAge and KeepCount say how long and how many dead items the
	// queue keeps (its retention).
	KeepAge, KeepCount string
	// Sequencing is the queue's sequencing (with what a death does to a
	// key); Blocked its first blockedRows blocked keys (read only when the
	// queue is sequenced or holds sequenced items).
	Sequencing sequenceView
	Blocked    []claim.BlockedKey
	// Schedules are the queue's periodic schedules (stored ones, and those
	// in code that fired), the first scheduleRows.
	Schedules []scheduleView
}

// scheduleRows bounds the schedules a queue's page lists.
const scheduleRows = 100

// scheduleView is one schedule on a queue's page.
type scheduleView struct {
	schedule.Info
	// Periods says when it runs ("" for a schedule in code).
	Periods string
}

// schedulesOf reads the schedules of queue for its page.
func (h *handler) schedulesOf(ctx context.Context, queue string) ([]scheduleView, error) {
	list, err := schedule.List(ctx, h.db, h.opts.Tables, queue, scheduleRows)
	if err != nil {
		return nil, err
	}
	out := make([]scheduleView, len(list))
	for i, s := range list {
		v := scheduleView{Info: s}
		switch {
		case !s.Stored:
		case s.Err != nil:
			v.Periods = "cannot run: " + s.Err.Error()
		case s.Schedule.Cron != "":
			v.Periods = "cron " + s.Schedule.Cron
		default:
			v.Periods = "every " + s.Schedule.Every.String()
		}
		out[i] = v
	}
	return out, nil
}

// queueState reads one queue's state through the fleet's read model:
// exact counts (as claim.Queue.Inspect), by part and by tenant.
func (h *handler) queueState(ctx context.Context, name string) (fleet.Queue, error) {
	snap, err := h.fleet.Snapshot(ctx, fleet.Options{Queue: name, Parts: true, Tenants: true, Kinds: true, QueuesOnly: true,
		Timeout: roundTimeout(h.opts)})
	if err != nil {
		return fleet.Queue{}, err
	}
	return snap.Queues[0], nil
}

// blockedRows is how many blocked keys a queue's page lists.
const blockedRows = 20

type holder struct {
	Session uuid.UUID
	Claimed int64
}

type tenantLimit struct {
	Tenant string
	Limit  claim.Limit
}

func (h *handler) queueName(r *http.Request, param string) (string, error) {
	name := r.URL.Query().Get(param)
	if name == "" {
		return "", badRequest("no queue given (?%s=NAME)", param)
	}
	if len(name) > 1000 {
		return "", badRequest("queue name too long")
	}
	return name, nil
}

func (h *handler) queuePage(r *http.Request) (string, any, error) {
	name, err := h.queueName(r, "name")
	if err != nil {
		return "", nil, err
	}
	q, err := h.queue(name)
	if err != nil {
		return "", nil, badRequest("%v", err)
	}
	snap := h.sampler.current(r.Context())
	d := &queueData{Name: name}
	for i := range snap.Queues {
		if snap.Queues[i].Name == name {
			d.Figures = &snap.Queues[i]
		}
	}
	if d.Queue, err = h.queueState(r.Context(), name); err != nil {
		return "", nil, err
	}
	if d.Settings, err = q.Settings(r.Context()); err != nil {
		return "", nil, err
	}
	for s, n := range d.Queue.Holders {
		d.Holders = append(d.Holders, holder{s, n})
	}
	sort.Slice(d.Holders, func(i, j int) bool { return d.Holders[i].Claimed > d.Holders[j].Claimed })
	for t, l := range d.Settings.TenantLimits {
		d.Limits = append(d.Limits, tenantLimit{t, l})
	}
	sort.Slice(d.Limits, func(i, j int) bool { return d.Limits[i].Tenant < d.Limits[j].Tenant })
	d.KeepAge, d.KeepCount = retentionText(d.Settings.Retention)
	err = retry.Do(r.Context(), nil, func(ctx context.Context) error {
		var err error
		d.Dead, err = h.store.DeadWindow(ctx, h.db, name, nil, 10)
		return store.Classify(err)
	})
	if err != nil {
		return "", nil, err
	}
	if d.Schedules, err = h.schedulesOf(r.Context(), name); err != nil {
		return "", nil, err
	}
	d.Sequencing = sequenceView{On: d.Settings.Sequenced, Items: d.Settings.SequencedItems, Hold: d.Settings.SequenceHold}
	if d.Sequencing.On || d.Sequencing.Items || d.Sequencing.Hold {
		if d.Blocked, err = q.BlockedKeys(r.Context(), blockedRows); err != nil {
			return "", nil, err
		}
	}
	return "Queue " + name, d, nil
}

// retentionText says how long and how many dead items a retention keeps.
func retentionText(r claim.Retention) (age, count string) {
	age, count = "no limit", "no limit"
	if !r.NoDeadMaxAge {
		a := r.DeadMaxAge
		if a == 0 {
			a = claim.DefaultDeadMaxAge
		}
		age = dur(a)
	}
	if !r.NoDeadMaxCount {
		n := r.DeadMaxCount
		if n == 0 {
			n = claim.DefaultDeadMaxCount
		}
		count = num(n)
	}
	return age, count
}

// sessionsData is the sessions page.
type sessionsData struct {
	At         time.Time
	Err        string
	Sessions   []sessionRow
	Maps       []partMap
	Pager      pager
	Rebalances []rebalance
	Now        time.Time
}

type sessionRow struct {
	fleet.Session
	Parts  int
	Queues string
}

// partMap is a queue's parts, with their owners and backlogs.
type partMap struct {
	Queue    string
	NumParts int
	Parts    []partCell
	Unowned  int
	Members  int
	// InUse: a session owns one of its parts (workers run the queue in
	// parts mode). Otherwise any session claims any item, and a part
	// nobody owns is no alarm (Unowned stays 0).
	InUse bool
}

type partCell struct {
	Part    int
	Owner   uuid.UUID
	Backlog int64
	Moved   bool // its owner changed within the last few refreshes
}

func (h *handler) sessionsPage(r *http.Request) (string, any, error) {
	snap := h.sampler.current(r.Context())
	d := &sessionsData{At: snap.At, Err: snap.Err, Now: time.Now()}
	byOwner := map[uuid.UUID]int{}
	queuesOf := map[uuid.UUID]map[string]bool{}
	owners := map[string]map[int]uuid.UUID{}
	for _, o := range snap.Owners {
		byOwner[o.Session]++
		if queuesOf[o.Session] == nil {
			queuesOf[o.Session] = map[string]bool{}
		}
		queuesOf[o.Session][o.Queue] = true
		if owners[o.Queue] == nil {
			owners[o.Queue] = map[int]uuid.UUID{}
		}
		owners[o.Queue][o.Part] = o.Session
	}
	for _, in := range snap.Sessions {
		var qs []string
		for q := range queuesOf[in.ID] {
			qs = append(qs, q)
		}
		sort.Strings(qs)
		d.Sessions = append(d.Sessions, sessionRow{Session: in, Parts: byOwner[in.ID], Queues: strings.Join(qs, ", ")})
	}
	// The part maps of the queues that have parts (stored) or owners.
	var names []string
	parts := map[string]int{}
	for _, q := range snap.Queues {
		if q.Stored || owners[q.Name] != nil {
			names = append(names, q.Name)
			parts[q.Name] = q.NumParts
		}
	}
	var from, to int
	d.Pager, from, to = paginate(r, len(names), 20)
	d.Rebalances = h.sampler.rebalances()
	recent := map[partKey]bool{}
	for _, e := range d.Rebalances {
		if time.Since(e.At) < 5*h.opts.Refresh {
			recent[partKey{e.Queue, e.Part}] = true
		}
	}
	if len(d.Rebalances) > 50 {
		d.Rebalances = d.Rebalances[:50]
	}
	for _, n := range names[from:to] {
		m := partMap{Queue: n, NumParts: parts[n]}
		var backlog []int64
		err := retry.Do(r.Context(), nil, func(ctx context.Context) error {
			var err error
			d, err := h.dialect(ctx)
			if err != nil {
				return err
			}
			backlog, err = h.store.PartsBacklog(ctx, h.db, d, n, m.NumParts, h.opts.CountCap)
			return store.Classify(err)
		})
		if err != nil {
			return "", nil, err
		}
		members := map[uuid.UUID]bool{}
		m.InUse = len(owners[n]) > 0
		for p := 0; p < m.NumParts; p++ {
			c := partCell{Part: p, Owner: owners[n][p], Backlog: backlog[p], Moved: recent[partKey{n, p}]}
			if c.Owner == uuid.Nil && m.InUse {
				m.Unowned++
			} else {
				members[c.Owner] = true
			}
			m.Parts = append(m.Parts, c)
		}
		m.Members = len(members)
		d.Maps = append(d.Maps, m)
	}
	return "Sessions and parts", d, nil
}

// itemsQuery is an item search.
type itemsQuery struct {
	Queue, State, Tenant, Key, Error, Reason, After string
	// Kind keeps the items of this kind (claim.NewItem.Kind), exactly.
	Kind string
	// Text is the search box: a row matches when its id, key, tenant or
	// kind starts with it, or its payload holds it (store.ItemsSearch.Text).
	Text string
}

// States of the item search.
var itemStates = []string{"unclaimed", "due", "scheduled", "claimed", "dead", "cancelled"}

type itemsData struct {
	Q       itemsQuery
	Reasons []string
	Queues  []string
	States  []string
	Items   []store.ItemRow
	Dead    []store.DeadPageRow
	// Cancelled are the cancelled items (state "cancelled"), the most
	// recent end first: a cancel keeps them for the queue's dedup window,
	// and they can be requeued.
	Cancelled []claim.CancelledItem
	Scanned   int
	Next      string
	Now       time.Time
	Cap       int
	Window    int
	Filters   bool
	// Counts are the items of each state (itemStates) of the queue, or of
	// every queue, from the overview's last reading (each queue's count
	// capped at Options.CountCap: "≥" when one is).
	Counts []stateCount
}

// stateCount is the count of one state beside the state selector.
type stateCount struct {
	State string
	Count string
}

// stateCounts sums the sampler's figures of queue ("": every queue) by
// state. A count that reached its cap in a queue is a lower bound; the
// scheduled items (unclaimed less due) are unknown then.
func stateCounts(qs []queueFigures, queue string, capAt int64) []stateCount {
	var unclaimed, due, claimed, dead int64
	var capU, capC, capD bool
	for _, q := range qs {
		if queue != "" && q.Name != queue {
			continue
		}
		unclaimed += q.Unclaimed
		due += q.Due
		claimed += q.Claimed
		dead += q.Dead
		capU = capU || q.Unclaimed >= capAt
		capC = capC || q.Claimed >= capAt
		capD = capD || q.Dead >= capAt
	}
	n := func(v int64, atCap bool) string {
		if atCap {
			return "≥" + num(v)
		}
		return num(v)
	}
	scheduled := "?"
	if !capU {
		scheduled = num(unclaimed - due)
	}
	return []stateCount{{"unclaimed", n(unclaimed, capU)}, {"due", n(due, capU)}, {"scheduled", scheduled},
		{"claimed", n(claimed, capC)}, {"dead", n(dead, capD)}}
}

func (h *handler) itemsPage(r *http.Request) (string, any, error) {
	v := r.URL.Query()
	q := itemsQuery{Queue: v.Get("queue"), State: v.Get("state"), Tenant: v.Get("tenant"), Key: v.Get("key"), Kind: v.Get("kind"),
		Error: v.Get("error"), Reason: v.Get("reason"), After: v.Get("after"), Text: strings.TrimSpace(v.Get("q"))}
	if q.State == "" {
		q.State = "unclaimed"
	}
	if len(q.Text) > 200 {
		return "", nil, badRequest("the search text is longer than 200 bytes")
	}
	if id, err := uuid.Parse(q.Text); err == nil && len(q.Text) == 36 {
		// A whole id: its own page (a primary-key read), wherever it is.
		return "", nil, &redirectError{h.path("/item?" + url.Values{"id": {id.String()}}.Encode())}
	}
	d := &itemsData{Q: q, Reasons: claim.Reasons(), States: itemStates, Now: time.Now(), Window: h.opts.ScanWindow}
	snap := h.sampler.current(r.Context())
	for _, f := range snap.Queues {
		d.Queues = append(d.Queues, f.Name)
	}
	d.Counts = stateCounts(snap.Queues, q.Queue, int64(h.opts.CountCap))
	d.Filters = q.Key != "" || q.Kind != "" || q.Error != "" || q.Reason != "" || q.Text != "" || q.State == "due" || q.State == "scheduled" ||
		(q.Tenant != "" && (q.State == "claimed" || q.Queue == ""))
	of := " of " + q.Queue
	if q.Queue == "" {
		of = " of every queue"
	}
	if q.State == "dead" {
		if err := claim.CheckReason(q.Reason); err != nil {
			return "", nil, badRequest("%v", err)
		}
		d.Filters = d.Filters || q.Tenant != ""
		return "Dead items" + of, d, h.searchDead(r, d)
	}
	if q.State == "cancelled" {
		if q.Queue == "" {
			return "Cancelled items", d, nil // listed per queue (the template says so)
		}
		return "Cancelled items of " + q.Queue, d, h.listCancelled(r, d)
	}
	if !contains(itemStates, q.State) {
		return "", nil, badRequest("unknown state %q", q.State)
	}
	return "Items" + of, d, h.searchItems(r, d)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// searchItems reads windows of items from the cursor, keeping the
// matches, until a page is full or the scan window is read. One queue
// without search text reads ItemsPage (a tenant's unclaimed items through
// its own index); every queue, or a search text, ItemsSearchWindow, which
// says of each row whether it matches the text.
func (h *handler) searchItems(r *http.Request, d *itemsData) error {
	q := d.Q
	var after *store.ItemPosition
	if q.After != "" {
		var p store.ItemPosition
		if err := decode(q.After, &p); err != nil {
			return badRequest("bad cursor")
		}
		after = &p
	}
	claimed := q.State == "claimed"
	search := q.Queue == "" || q.Text != ""
	tenant := q.Tenant
	if claimed || search {
		tenant = "" // filtered below: no index of claimed items by tenant
	}
	size := h.opts.PageSize
	for d.Scanned < h.opts.ScanWindow {
		want := size + 1
		if d.Filters {
			want = min(h.opts.ScanWindow-d.Scanned, 500)
		}
		var rows []store.ItemRow
		err := retry.Do(r.Context(), nil, func(ctx context.Context) error {
			var err error
			if search {
				rows, err = h.store.ItemsSearchWindow(ctx, h.db, store.ItemsSearch{Queue: q.Queue, Claimed: claimed,
					Text: q.Text, After: after, Limit: want})
			} else {
				rows, err = h.store.ItemsPage(ctx, h.db, q.Queue, tenant, claimed, after, want)
			}
			return store.Classify(err)
		})
		if err != nil {
			return err
		}
		for _, it := range rows {
			if len(d.Items) == size {
				d.Next = encode(position(d.Items[size-1]))
				return nil
			}
			d.Scanned++
			pos := position(it)
			after = &pos
			if (!search || it.Match) && matchItem(q, it, d.Now) {
				if it.Queue == "" {
					it.Queue = q.Queue
				}
				d.Items = append(d.Items, it)
			}
		}
		if len(rows) < want {
			return nil // the end
		}
	}
	if after != nil {
		d.Next = encode(*after)
	}
	return nil
}

func position(it store.ItemRow) store.ItemPosition {
	p := store.ItemPosition{Queue: it.Queue, Priority: it.Priority, TurnAt: it.TurnAt, Part: it.Part, ID: it.ID}
	if it.LeaseUntil != nil {
		p.LeaseUntil = *it.LeaseUntil
	}
	return p
}

func matchItem(q itemsQuery, it store.ItemRow, now time.Time) bool {
	switch {
	case q.Tenant != "" && it.Tenant != q.Tenant,
		q.Key != "" && it.Key != q.Key,
		q.Kind != "" && it.Kind != q.Kind,
		q.Error != "" && !strings.Contains(it.LastError, q.Error),
		q.State == "due" && it.VestingAt.After(now),
		q.State == "scheduled" && !it.VestingAt.After(now):
		return false
	}
	return true
}

// searchDead is searchItems for the dead items: DeadWindow for one queue
// without search text, DeadSearchWindow otherwise.
func (h *handler) searchDead(r *http.Request, d *itemsData) error {
	q := d.Q
	var after *store.DeadSearchPosition
	if q.After != "" {
		var p store.DeadSearchPosition
		if err := decode(q.After, &p); err != nil {
			return badRequest("bad cursor")
		}
		after = &p
	}
	search := q.Queue == "" || q.Text != ""
	size := h.opts.PageSize
	for d.Scanned < h.opts.ScanWindow {
		want := size + 1
		if d.Filters {
			want = min(h.opts.ScanWindow-d.Scanned, 500)
		}
		var rows []store.DeadPageRow
		err := retry.Do(r.Context(), nil, func(ctx context.Context) error {
			var err error
			if search {
				rows, err = h.store.DeadSearchWindow(ctx, h.db, q.Queue, q.Text, after, want)
				return store.Classify(err)
			}
			var a *store.DeadPosition
			if after != nil {
				a = &store.DeadPosition{DiedAt: after.DiedAt, ID: after.ID, Death: after.Death}
			}
			rows, err = h.store.DeadWindow(ctx, h.db, q.Queue, a, want)
			return store.Classify(err)
		})
		if err != nil {
			return err
		}
		for _, it := range rows {
			if len(d.Dead) == size {
				last := d.Dead[size-1]
				d.Next = encode(store.DeadSearchPosition{Queue: last.Queue, DiedAt: last.DiedAt, ID: last.ID, Death: last.Death})
				return nil
			}
			d.Scanned++
			if it.Queue == "" {
				it.Queue = q.Queue
			}
			after = &store.DeadSearchPosition{Queue: it.Queue, DiedAt: it.DiedAt, ID: it.ID, Death: it.Death}
			if (!search || it.Match) && (q.Tenant == "" || it.Tenant == q.Tenant) && (q.Key == "" || it.Key == q.Key) && (q.Kind == "" || it.Kind == q.Kind) &&
				claim.MatchReason(q.Reason, it.Reason) && (q.Error == "" || strings.Contains(it.LastError, q.Error)) {
				d.Dead = append(d.Dead, it)
			}
		}
		if len(rows) < want {
			return nil
		}
	}
	if after != nil {
		d.Next = encode(*after)
	}
	return nil
}

func encode(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decode(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// itemData is one item's page: the live item, its deaths, or both.
type itemData struct {
	ID       uuid.UUID
	Live     *store.ItemDetail
	Payload  preview
	Metadata preview
	Deaths   []deathView
	Now      time.Time
	Found    bool
	// Waiting is set when the id is a waiting item (enqueued with
	// prerequisites not yet all acked): its queue and what it waits for.
	Waiting *waitingView
	// State and Queue are where the id is (fleet's states: also acked,
	// cancelled or taken, from the queues' ended records); History its
	// attempts in that state, oldest first (the timeline), with
	// HistoryRecorded false for an item that ended under code older than
	// schema version 6, and HistoryOmitted set when older attempts were
	// left out.
	State, Queue    string
	Ended           *store.EndedRow
	History         []attemptView
	HistoryRecorded bool
	HistoryOmitted  bool
}

// attemptView is one attempt of the item page's timeline.
type attemptView struct {
	store.Attempt
	// Lines is the error's first line; Trace the rest (a stack trace,
	// shown preformatted).
	Line, Trace string
}

// waitingView is a waiting item: its queue and dependencies.
type waitingView struct {
	Queue string
	// Kind is its kind ("" for none).
	Kind string
	claim.Dependencies
}

type deathView struct {
	store.DeadItemRow
	Queue   string
	Payload preview
}

// preview is a payload shown to people: text (JSON indented) or hex.
type preview struct {
	Text  string
	Kind  string // "json", "text", "hex", "empty"
	Size  int
	Trunc bool
}

const previewMax = 4096

func makePreview(b []byte) preview {
	p := preview{Size: len(b)}
	switch {
	case len(b) == 0:
		p.Kind = "empty"
		return p
	case json.Valid(b):
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", "  "); err != nil {
			buf.Reset()
			buf.Write(b)
		}
		p.Kind, p.Text = "json", buf.String()
	case utf8.Valid(b):
		p.Kind, p.Text = "text", string(b)
	default:
		n := min(len(b), 512)
		p.Kind, p.Text, p.Trunc = "hex", hex.Dump(b[:n]), n < len(b)
		return p
	}
	if len(p.Text) > previewMax {
		cut := previewMax
		for cut > 0 && !utf8.RuneStart(p.Text[cut]) {
			cut--
		}
		p.Text, p.Trunc = p.Text[:cut], true
	}
	return p
}

func (h *handler) itemPage(r *http.Request) (string, any, error) {
	id, err := uuid.Parse(r.URL.Query().Get("id"))
	if err != nil {
		return "", nil, badRequest("not an item id: %q", r.URL.Query().Get("id"))
	}
	d := &itemData{ID: id, Now: time.Now()}
	err = retry.Do(r.Context(), nil, func(ctx context.Context) error {
		it, ok, err := h.store.ItemsGet(ctx, h.db, id)
		if err != nil {
			return store.Classify(err)
		}
		d.Live = nil
		if ok {
			d.Live = &it
			d.Now = it.Now
		}
		deaths, queues, err := h.store.DeadOfID(ctx, h.db, id, 20)
		if err != nil {
			return store.Classify(err)
		}
		d.Deaths = d.Deaths[:0]
		for i, x := range deaths {
			d.Deaths = append(d.Deaths, deathView{DeadItemRow: x, Queue: queues[i], Payload: makePreview(x.Payload)})
		}
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	if d.Live != nil {
		d.Payload, d.Metadata = makePreview(d.Live.Payload), makePreview(d.Live.Metadata)
	} else if err := h.readWaiting(r.Context(), d); err != nil {
		return "", nil, err
	}
	if err := h.readHistory(r.Context(), d); err != nil {
		return "", nil, err
	}
	d.Found = d.Live != nil || len(d.Deaths) > 0 || d.Waiting != nil || d.Ended != nil
	return "Item " + id.String(), d, nil
}

// readHistory sets where d.ID is and its attempts' timeline (fleet's
// item view, with the ended records of every queue: one primary-key
// lookup per queue).
func (h *handler) readHistory(ctx context.Context, d *itemData) error {
	queues, err := claim.Queues(ctx, h.db, h.opts.Tables)
	if err != nil {
		return err
	}
	v, err := fleet.ReadItem(ctx, h.store, h.db, d.ID, queues)
	if err != nil {
		return err
	}
	d.State, d.Queue, d.HistoryRecorded, d.HistoryOmitted = v.State, v.Queue, v.HistoryRecorded, v.HistoryOmitted
	if len(v.Ended) > 0 && v.Live == nil && v.Waiting == nil {
		d.Ended = &v.Ended[0]
	}
	if d.Waiting != nil && v.Waiting != nil {
		d.Waiting.Kind = v.Waiting.Kind
	}
	d.History = d.History[:0]
	for _, a := range v.History {
		line, trace, _ := strings.Cut(a.Error, "\n")
		d.History = append(d.History, attemptView{Attempt: a, Line: line, Trace: trace})
	}
	return nil
}

// readWaiting sets d.Waiting if d.ID is a waiting item: its queue (a
// primary-key read) and its dependencies (claim.Queue.Dependencies: the
// prerequisites it still waits for, and up to 20 of its dependents).
func (h *handler) readWaiting(ctx context.Context, d *itemData) error {
	var queue string
	var ok bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		queue, ok, err = h.store.ItemsDepsWaitingQueue(ctx, h.db, d.ID)
		return store.Classify(err)
	})
	if err != nil || !ok {
		return err
	}
	q, err := h.queue(queue)
	if err != nil {
		return err
	}
	deps, err := q.Dependencies(ctx, d.ID, 20)
	if err != nil {
		return err
	}
	if deps.Waiting { // not released between the two reads
		d.Waiting = &waitingView{Queue: queue, Dependencies: deps}
	}
	return nil
}

// tenantsData is the tenants page of a queue.
type tenantsData struct {
	Queue    string
	Fair     []string // the fair queues
	Tenants  []tenantRow
	Settings claim.Settings
	Now      time.Time
}

type tenantRow struct {
	Tenant         string
	Unclaimed, Due int64
	Wait           time.Duration // how long its next item has been due (0: none due)
	Queued         bool          // it has an unclaimed item
	Limit          *claim.Limit
}

func (h *handler) tenantsPage(r *http.Request) (string, any, error) {
	snap := h.sampler.current(r.Context())
	d := &tenantsData{Queue: r.URL.Query().Get("queue"), Now: time.Now()}
	for _, q := range snap.Queues {
		if q.Fair {
			d.Fair = append(d.Fair, q.Name)
		}
	}
	if d.Queue == "" {
		if len(d.Fair) == 0 {
			return "Tenants", d, nil
		}
		d.Queue = d.Fair[0]
	}
	if !contains(d.Fair, d.Queue) {
		d.Fair = append([]string{d.Queue}, d.Fair...) // not fair, or set fair since the last reading
	}
	q, err := h.queue(d.Queue)
	if err != nil {
		return "", nil, badRequest("%v", err)
	}
	fs, err := h.fleet.Snapshot(r.Context(), fleet.Options{Queue: d.Queue, Tenants: true, QueuesOnly: true, Timeout: roundTimeout(h.opts)})
	if err != nil {
		return "", nil, err
	}
	tenants := fs.Queues[0].Tenants
	if d.Settings, err = q.Settings(r.Context()); err != nil {
		return "", nil, err
	}
	tenantLimits := d.Settings.TenantLimits
	var names []string
	for _, t := range tenants {
		names = append(names, t.Tenant)
	}
	var heads []store.TenantHead
	err = retry.Do(r.Context(), nil, func(ctx context.Context) error {
		var err error
		dialect, err := h.dialect(ctx)
		if err != nil {
			return err
		}
		heads, err = h.store.ItemsTenantHeads(ctx, h.db, dialect, d.Queue, names)
		return store.Classify(err)
	})
	if err != nil {
		return "", nil, err
	}
	byName := map[string]store.TenantHead{}
	for _, hd := range heads {
		byName[hd.Tenant] = hd
	}
	for _, t := range tenants {
		row := tenantRow{Tenant: t.Tenant, Unclaimed: t.Unclaimed, Due: t.Due}
		if hd, ok := byName[t.Tenant]; ok && hd.Head != nil {
			row.Queued = true
			row.Wait = max(0, hd.Now.Sub(*hd.Head))
		}
		if l, ok := tenantLimits[t.Tenant]; ok {
			row.Limit = &l
		}
		d.Tenants = append(d.Tenants, row)
	}
	return "Tenants of " + d.Queue, d, nil
}

// auditData is a page of the audit list.
type auditData struct {
	Rows []store.AuditRow
	Next string
}

func (h *handler) auditPage(r *http.Request) (string, any, error) {
	d := &auditData{}
	var after *store.AuditRow
	if a := r.URL.Query().Get("after"); a != "" {
		var p store.AuditRow
		if err := decode(a, &p); err != nil {
			return "", nil, badRequest("bad cursor")
		}
		after = &p
	}
	size := h.opts.PageSize
	err := retry.Do(r.Context(), nil, func(ctx context.Context) error {
		var err error
		d.Rows, err = h.store.AuditPage(ctx, h.db, after, size+1)
		return store.Classify(err)
	})
	if err != nil {
		return "", nil, err
	}
	if len(d.Rows) > size {
		d.Rows = d.Rows[:size]
		last := d.Rows[size-1]
		d.Next = encode(store.AuditRow{At: last.At, ID: last.ID})
	}
	return "Audit", d, nil
}

// sequenceView is a queue's sequencing as the queue page shows it
// (claim.Settings: Sequenced, SequencedItems, SequenceHold).
type sequenceView struct{ On, Items, Hold bool }

// listCancelled reads a page of the queue's cancelled items (the filters
// do not apply: the list is by time).
func (h *handler) listCancelled(r *http.Request, d *itemsData) error {
	q, err := h.queue(d.Q.Queue)
	if err != nil {
		return err
	}
	page, err := q.CancelledItems(r.Context(), claim.CancelledQuery{After: d.Q.After, Limit: h.opts.PageSize, Kind: d.Q.Kind})
	if err != nil {
		return err
	}
	d.Cancelled, d.Next = page.Items, page.Next
	return nil
}
