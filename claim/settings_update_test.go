package claim_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// TestUpdateSettingsOneCallReadBackByOne changes every stored setting of a
// queue in one UpdateSettings, reads all of them back with one Settings,
// and checks that a zero field leaves its setting alone and that an update
// with one bad field stores nothing of it.
func TestUpdateSettingsOneCallReadBackByOne(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "settings"})
	other := newQueue(t, pool, claim.Options{Queue: "untouched"})

	// Never configured: the documented zero values.
	s, err := q.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	def := claim.Retention{DeadMaxAge: claim.DefaultDeadMaxAge, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}
	if want := (claim.Settings{Retention: def, TenantLimits: map[string]claim.Limit{}, Parts: 1}); !reflect.DeepEqual(s, want) {
		t.Fatalf("Settings of a new queue = %+v, want %+v", s, want)
	}

	all := claim.SettingsUpdate{
		Parts:        4,
		Policy:       &claim.Policy{Fair: true, MaxInFlight: 7, Rate: 2.5, TenantMaxInFlight: 2, DedupWindow: time.Hour},
		Paused:       claim.On,
		Retention:    &claim.Retention{DeadMaxAge: 7 * 24 * time.Hour, DeadMaxCount: 1000, HistoryWindow: 48 * time.Hour},
		Sequenced:    claim.On,
		SequenceHold: claim.On,
		TenantLimits: map[string]*claim.Limit{"acme": {MaxInFlight: 3}, "free": {}},
	}
	if err := q.UpdateSettings(ctx, all); err != nil {
		t.Fatal(err)
	}
	want := claim.Settings{Policy: *all.Policy, Paused: true, Retention: *all.Retention, Sequenced: true, SequenceHold: true,
		TenantLimits: map[string]claim.Limit{"acme": {MaxInFlight: 3}, "free": {}}, Parts: 4}
	if s, err = q.Settings(ctx); err != nil || !reflect.DeepEqual(s, want) {
		t.Fatalf("Settings after the update = %+v, %v\nwant %+v", s, err, want)
	}

	// The zero update changes nothing; one field changes that field only.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{}); err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.Off, TenantLimits: map[string]*claim.Limit{"free": nil}}); err != nil {
		t.Fatal(err)
	}
	want.Paused, want.TenantLimits = false, map[string]claim.Limit{"acme": {MaxInFlight: 3}}
	if s, err = q.Settings(ctx); err != nil || !reflect.DeepEqual(s, want) {
		t.Fatalf("Settings after resuming = %+v, %v\nwant %+v", s, err, want)
	}

	// Bad input: refused before anything is stored, even the valid fields
	// of the same update (Paused and Parts come before the bad one).
	for name, bad := range map[string]claim.SettingsUpdate{
		"parts":        {Paused: claim.On, Parts: -1},
		"too many":     {Paused: claim.On, Parts: 1 << 20},
		"policy":       {Paused: claim.On, Policy: &claim.Policy{MaxInFlight: -1}},
		"retention":    {Paused: claim.On, Retention: &claim.Retention{DeadMaxAge: time.Millisecond}},
		"toggle":       {Paused: claim.On, Sequenced: claim.Toggle(7)},
		"tenant":       {Paused: claim.On, TenantLimits: map[string]*claim.Limit{"": {MaxInFlight: 1}}},
		"tenant limit": {Parts: 2, TenantLimits: map[string]*claim.Limit{"x": {Rate: math.NaN()}}},
	} {
		if err := q.UpdateSettings(ctx, bad); err == nil {
			t.Errorf("%s: UpdateSettings(%+v) = nil, want an error", name, bad)
		}
	}
	if s, err = q.Settings(ctx); err != nil || !reflect.DeepEqual(s, want) {
		t.Fatalf("Settings after refused updates = %+v, %v\nwant %+v", s, err, want)
	}
	// The other queue kept its defaults.
	if s, err := other.Settings(ctx); err != nil || s.Paused || s.Parts != 1 || len(s.TenantLimits) != 0 || s.Fair {
		t.Fatalf("the other queue's settings = %+v, %v", s, err)
	}
}

// TestUpdateSettingsPartsMovesItems lowers the part count through
// UpdateSettings: the items of the removed parts move into the parts left,
// as partition.SetParts moves them, and a worker's claim finds them.
func TestUpdateSettingsPartsMovesItems(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "moving"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Parts: 8}); err != nil {
		t.Fatal(err)
	}
	var items []claim.NewItem
	for i := range 32 {
		items = append(items, claim.NewItem{Key: uuid.NewString(), Payload: []byte{byte(i)}})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'moving' AND part >= 2`); n == 0 {
		t.Fatal("no item landed in parts 2-7: the test shows nothing")
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Parts: 2}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'moving' AND part >= 2`); n != 0 {
		t.Fatalf("%d items left in removed parts", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'moving'`); n != 32 {
		t.Fatalf("%d items after the move, want 32", n)
	}
	if s, err := q.Settings(ctx); err != nil || s.Parts != 2 {
		t.Fatalf("Settings.Parts = %d, %v; want 2", s.Parts, err)
	}
}

// TestRequeueOptionsSelectOneShape requeues through the one Requeue: one
// id, one given death, by filter, and everything (All), and refuses
// options that select nothing or two ways at once.
func TestRequeueOptionsSelectOneShape(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "rq"})
	s := startSession(t, ctx, pool)
	kill := func(tenant string) uuid.UUID {
		t.Helper()
		res, err := q.Enqueue(ctx, claim.NewItem{Tenant: tenant, Payload: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %v %v", got, err)
		}
		if _, err := q.Nack(ctx, got[0], claim.Permanent(errors.New("no"))); err != nil {
			t.Fatal(err)
		}
		return res.IDs[0]
	}
	a, b, c, d := kill("t1"), kill("t1"), kill("t2"), kill("t3")

	for name, bad := range map[string]claim.RequeueOptions{
		"nothing":          {},
		"death without id": {Death: uuid.New()},
		"id and filter":    {ID: a, Filter: claim.DeadFilter{Tenant: "t1"}},
		"id and all":       {ID: a, All: true},
		"all and filter":   {All: true, Filter: claim.DeadFilter{Tenant: "t1"}},
	} {
		if res, err := q.Requeue(ctx, bad); err == nil || res.Requeued != 0 {
			t.Errorf("%s: Requeue = %+v, %v; want an error and nothing moved", name, res, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'rq'`); n != 4 {
		t.Fatalf("%d dead items after refused requeues, want 4", n)
	}

	// One id; then again: nothing left to move.
	if res, err := q.Requeue(ctx, claim.RequeueOptions{ID: d}); err != nil || res.Requeued != 1 {
		t.Fatalf("Requeue(ID) = %+v, %v; want 1", res, err)
	}
	if res, err := q.Requeue(ctx, claim.RequeueOptions{ID: uuid.New()}); err != nil || res.Requeued != 0 {
		t.Fatalf("Requeue(an unknown ID) = %+v, %v; want 0", res, err)
	}
	// One given death.
	page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: claim.DeadFilter{Tenant: "t2"}})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != c {
		t.Fatalf("t2's dead items = %+v, %v", page, err)
	}
	if res, err := q.Requeue(ctx, claim.RequeueOptions{ID: c, Death: page.Items[0].Death}); err != nil || res.Requeued != 1 {
		t.Fatalf("Requeue(ID, Death) = %+v, %v; want 1", res, err)
	}
	// By filter, with progress.
	var pages int
	res, err := q.Requeue(ctx, claim.RequeueOptions{Filter: claim.DeadFilter{Tenant: "t1"}, Progress: func(claim.RequeueResult) { pages++ }})
	if err != nil || res.Requeued != 2 || pages == 0 {
		t.Fatalf("Requeue(Filter) = %+v, %v after %d progress calls; want 2 requeued", res, err, pages)
	}
	for _, id := range []uuid.UUID{a, b, c, d} {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id); n != 1 {
			t.Fatalf("item %s is not back in the items table", id)
		}
	}
	// All: the dead item of another kill.
	e := kill("t4")
	if res, err := q.Requeue(ctx, claim.RequeueOptions{All: true}); err != nil || res.Requeued != 1 {
		t.Fatalf("Requeue(All) = %+v, %v; want 1", res, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, e); n != 1 {
		t.Fatal("Requeue(All) left the dead item")
	}
}

// TestDeadQueryCountAndDefaultLimit counts the matching deaths with the
// page (DeadQuery.Count) and pages through the cancelled items with their
// cursor.
func TestDeadQueryCountAndCancelledPages(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "lists"})
	s := startSession(t, ctx, pool)
	for i := range 5 {
		if _, err := q.Enqueue(ctx, claim.NewItem{Tenant: map[bool]string{true: "even", false: "odd"}[i%2 == 0]}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("claim: %d items, %v", len(got), err)
	}
	for _, it := range got {
		if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("no"))); err != nil {
			t.Fatal(err)
		}
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: claim.DeadFilter{Tenant: "even"}, Limit: 1, Count: true})
	if err != nil || page.Count != 3 || len(page.Items) != 1 || page.Next == "" {
		t.Fatalf("DeadItems(even, Limit 1, Count) = %d items, count %d, next %q, %v; want 1, 3, a cursor", len(page.Items), page.Count, page.Next, err)
	}
	if page, err := q.DeadItems(ctx, claim.DeadQuery{}); err != nil || page.Count != 0 || len(page.Items) != 5 || page.Next != "" {
		t.Fatalf("DeadItems(zero query) = %d items, count %d, next %q, %v; want 5, not counted, the last page", len(page.Items), page.Count, page.Next, err)
	}

	// Cancelled items: five unclaimed ones, in pages of two.
	var ids []uuid.UUID
	for range 5 {
		res, err := q.Enqueue(ctx, claim.NewItem{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := q.CancelItem(ctx, res.IDs[0], claim.CancelOptions{By: "test"}); err != nil || !r.Found || r.Running {
			t.Fatalf("CancelItem = %+v, %v", r, err)
		}
		ids = append(ids, res.IDs[0])
	}
	seen := map[uuid.UUID]bool{}
	pages := 0
	for query := (claim.CancelledQuery{Limit: 2}); ; pages++ {
		p, err := q.CancelledItems(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Items) > 2 {
			t.Fatalf("a page of %d items, want at most 2", len(p.Items))
		}
		for _, it := range p.Items {
			if seen[it.ID] || it.By != "test" {
				t.Fatalf("cancelled item %+v listed twice or without its author", it)
			}
			seen[it.ID] = true
		}
		if p.Next == "" {
			break
		}
		query.After = p.Next
	}
	if len(seen) != 5 || pages != 2 {
		t.Fatalf("paged through %d cancelled items in %d pages, want 5 in 3", len(seen), pages+1)
	}
	if _, err := q.CancelledItems(ctx, claim.CancelledQuery{After: "nonsense"}); !errors.Is(err, claim.ErrBadCursor) {
		t.Fatalf("a bad cursor: %v, want ErrBadCursor", err)
	}
	if _, err := q.CancelledItems(ctx, claim.CancelledQuery{Limit: -1}); err == nil {
		t.Fatal("a negative limit: no error")
	}
}

// TestMaintenanceIsNotQueueAPI: the maintenance that only a worker runs is
// reached through internal/queuemaint, and claim.Queue has none of it.
func TestMaintenanceIsNotQueueAPI(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[*claim.Queue]()
	for _, name := range []string{"Reap", "PruneDead", "PruneEnded", "RefreshStatistics", "CancelChannel", "ClaimsSequenced"} {
		if _, ok := typ.MethodByName(name); ok {
			t.Errorf("claim.Queue has %s: maintenance belongs to internal/queuemaint", name)
		}
	}
	if n := typ.NumMethod(); n > 35 {
		t.Errorf("claim.Queue has %d methods, the API's bound is 35", n)
	}
	pool := setup(t)
	q := newQueue(t, pool, claim.Options{Queue: "maint"})
	if st, err := queuemaint.For(q).Reap(context.Background()); err != nil || st != (queuemaint.ReapStats{}) {
		t.Fatalf("Reap of an empty queue = %+v, %v", st, err)
	}
	defer func() {
		if recover() == nil {
			t.Error("queuemaint.For of something else did not panic")
		}
	}()
	queuemaint.For(struct{}{})
}

// TestItemsPagesAndItemLooksUp lists a queue's unclaimed items in claim
// order, page by page, its claimed ones, one tenant's, and looks items up
// by id (not another queue's).
func TestItemsPagesAndItemLooksUp(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "listed"})
	other := newQueue(t, pool, claim.Options{Queue: "elsewhere"})
	var items []claim.NewItem
	for i := range 7 {
		items = append(items, claim.NewItem{Priority: i % 3, Tenant: map[bool]string{true: "a", false: "b"}[i < 3],
			Payload: []byte{byte(i)}, Metadata: []byte("m")})
	}
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	elsewhere, err := other.Enqueue(ctx, claim.NewItem{Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}

	// Pages of 3 of the unclaimed items: every item once, in claim order.
	var listed []claim.ItemInfo
	pages := 0
	for query := (claim.ItemQuery{Limit: 3}); ; {
		p, err := q.Items(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		listed = append(listed, p.Items...)
		if p.Next == "" {
			break
		}
		query.After = p.Next
	}
	if len(listed) != 7 || pages != 3 {
		t.Fatalf("listed %d items in %d pages, want 7 in 3", len(listed), pages)
	}
	seen := map[uuid.UUID]bool{}
	for i, it := range listed {
		if seen[it.ID] || it.Claimed || it.Payload != nil || it.PayloadSize != 1 {
			t.Fatalf("item %d: %+v (listed twice, claimed, or with its payload)", i, it)
		}
		seen[it.ID] = true
		if i > 0 && it.Priority < listed[i-1].Priority {
			t.Fatalf("item %d has priority %d after %d: not claim order", i, it.Priority, listed[i-1].Priority)
		}
	}
	// One tenant's.
	if p, err := q.Items(ctx, claim.ItemQuery{Tenant: "a"}); err != nil || len(p.Items) != 3 || p.Next != "" {
		t.Fatalf("tenant a's items: %d, next %q, %v; want 3", len(p.Items), p.Next, err)
	}
	// Claim two: they are listed as claimed, with their lease.
	s := startSession(t, ctx, pool)
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %v %v", got, err)
	}
	p, err := q.Items(ctx, claim.ItemQuery{Claimed: true, Limit: 1})
	if err != nil || len(p.Items) != 1 || !p.Items[0].Claimed || p.Items[0].LeaseUntil.IsZero() || p.Next == "" {
		t.Fatalf("claimed items, page 1: %+v, %v", p, err)
	}
	p2, err := q.Items(ctx, claim.ItemQuery{Claimed: true, Limit: 1, After: p.Next})
	if err != nil || len(p2.Items) != 1 || p2.Items[0].ID == p.Items[0].ID || p2.Next != "" {
		t.Fatalf("claimed items, page 2: %+v, %v", p2, err)
	}
	if p, err := q.Items(ctx, claim.ItemQuery{}); err != nil || len(p.Items) != 5 {
		t.Fatalf("unclaimed items after the claim: %d, %v; want 5", len(p.Items), err)
	}

	// Bad input.
	for name, bad := range map[string]claim.ItemQuery{
		"negative limit":    {Limit: -1},
		"claimed by tenant": {Claimed: true, Tenant: "a"},
		"another cursor":    {After: p.Next}, // a claimed page's cursor for unclaimed items
		"nonsense":          {After: "nonsense"},
	} {
		if _, err := q.Items(ctx, bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}

	// Lookups.
	it, err := q.Item(ctx, res.IDs[4])
	if err != nil || it.ID != res.IDs[4] || string(it.Payload) != "\x04" || string(it.Metadata) != "m" || it.Tenant != "b" {
		t.Fatalf("Item = %+v, %v", it, err)
	}
	if _, err := q.Item(ctx, elsewhere.IDs[0]); !errors.Is(err, claim.ErrItemNotFound) {
		t.Fatalf("Item of another queue's item: %v; want ErrItemNotFound", err)
	}
	if _, err := q.Item(ctx, uuid.New()); !errors.Is(err, claim.ErrItemNotFound) {
		t.Fatalf("Item of an unknown id: %v; want ErrItemNotFound", err)
	}
}
