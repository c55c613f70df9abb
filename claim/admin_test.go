package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// adminDeath is one seeded death.
type adminDeath struct {
	id, death uuid.UUID
	queue     string
	tenant    string // "" for none
	reason    string
	lastError string
	diedAt    time.Time
}

// seedDeaths inserts the deaths as rows of the dead items table.
func seedDeaths(t *testing.T, pool *pgxpool.Pool, deaths []adminDeath) {
	t.Helper()
	for _, d := range deaths {
		var tenant *string
		if d.tenant != "" {
			tenant = &d.tenant
		}
		if _, err := pool.Exec(context.Background(), `INSERT INTO crdbwork_dead_items
			(id, death, queue, part, priority, attempts, max_attempts, payload, last_error, enqueued_at, died_at, tenant, reason)
			VALUES ($1, $2, $3, 0, 0, 1, 1, '\x00'::BYTEA, $4, $5, $5, $6, $7)`,
			d.id, d.death, d.queue, d.lastError, d.diedAt, tenant, d.reason); err != nil {
			t.Fatal(err)
		}
	}
}

// adminSeed makes 40 deaths of queue q (some at the same instant, one id
// dead twice; tenants a, b and none; reasons failed and permanent; some
// errors with "disk full") and 6 of queue other.
func adminSeed(t *testing.T, pool *pgxpool.Pool) []adminDeath {
	base := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
	var out []adminDeath
	twice := uuid.New()
	for i := range 40 {
		d := adminDeath{id: uuid.New(), death: uuid.New(), queue: "q", reason: claim.ReasonFailed,
			lastError: fmt.Sprintf("attempt %d: timeout", i), diedAt: base.Add(time.Duration(i/3) * time.Second)}
		switch i % 3 {
		case 0:
			d.tenant = "a"
		case 1:
			d.tenant = "b"
		}
		if i%4 == 0 {
			d.reason = claim.ReasonPermanent
		}
		if i%5 == 0 {
			d.lastError = fmt.Sprintf("write %d: disk full", i)
		}
		if i == 7 || i == 30 {
			d.id = twice
		}
		out = append(out, d)
	}
	for i := range 6 {
		out = append(out, adminDeath{id: uuid.New(), death: uuid.New(), queue: "other", tenant: "a", reason: claim.ReasonFailed,
			lastError: "disk full", diedAt: base.Add(time.Duration(i) * time.Second)})
	}
	seedDeaths(t, pool, out)
	return out
}

// want returns the deaths of queue that match f, in DeadItems' order.
func wantDeaths(deaths []adminDeath, queue string, f claim.DeadFilter) []adminDeath {
	var out []adminDeath
	for _, d := range deaths {
		if d.queue == queue && (f.Tenant == "" || d.tenant == f.Tenant) && (f.Reason == "" || d.reason == f.Reason) &&
			(f.ErrorContains == "" || strings.Contains(d.lastError, f.ErrorContains)) {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.diedAt.Equal(b.diedAt) {
			return a.diedAt.After(b.diedAt)
		}
		if a.id != b.id {
			return strings.Compare(a.id.String(), b.id.String()) > 0
		}
		return strings.Compare(a.death.String(), b.death.String()) > 0
	})
	return out
}

// pageAll pages through DeadItems with pages of limit.
func pageAll(t *testing.T, q *claim.Queue, f claim.DeadFilter, limit int) []claim.DeadItem {
	t.Helper()
	var all []claim.DeadItem
	query := claim.DeadQuery{DeadFilter: f, Limit: limit}
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("more than 100 pages")
		}
		page, err := q.DeadItems(context.Background(), query)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > limit {
			t.Fatalf("a page of %d items, limit %d", len(page.Items), limit)
		}
		all = append(all, page.Items...)
		if page.Next == "" {
			return all
		}
		if len(page.Items) != limit {
			t.Fatalf("a page of %d items (limit %d) with a next cursor", len(page.Items), limit)
		}
		query.After = page.Next
	}
}

// DeadItems pages through every filter's matches with no gap and no repeat,
// in order, across deaths at the same instant; DeadCount counts them; other
// queues' deaths never show.
func TestAdminDeadItemsFilterPageCount(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	deaths := adminSeed(t, pool)
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	for _, f := range []claim.DeadFilter{
		{},
		{Tenant: "a"},
		{Reason: claim.ReasonPermanent},
		{ErrorContains: "disk full"},
		{Tenant: "b", Reason: claim.ReasonFailed},
		{Tenant: "a", ErrorContains: "disk"},
		{Tenant: "nobody"},
	} {
		exp := wantDeaths(deaths, "q", f)
		n, err := deadCount(q.DeadItems(ctx, claim.DeadQuery{DeadFilter: f, Count: true, Limit: 1}))
		if err != nil || n != int64(len(exp)) {
			t.Errorf("DeadCount(%+v) = %d, %v; want %d", f, n, err, len(exp))
		}
		for _, limit := range []int{1, 4, 7, 100} {
			got := pageAll(t, q, f, limit)
			if len(got) != len(exp) {
				t.Errorf("filter %+v, pages of %d: %d items, want %d", f, limit, len(got), len(exp))
				continue
			}
			for i := range got {
				if got[i].ID != exp[i].id || got[i].Death != exp[i].death || got[i].Queue != "q" {
					t.Errorf("filter %+v, pages of %d: item %d is %s/%s, want %s/%s", f, limit, i, got[i].ID, got[i].Death, exp[i].id, exp[i].death)
					break
				}
			}
		}
	}
	if all := wantDeaths(deaths, "q", claim.DeadFilter{}); len(all) != 40 {
		t.Fatalf("the seed has %d deaths of q, want 40", len(all))
	}

	// A requeue between pages: the pages after it hold the rest, once.
	page, err := q.DeadItems(ctx, claim.DeadQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	exp := wantDeaths(deaths, "q", claim.DeadFilter{})
	victim := exp[15] // on the second page
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: victim.id, Death: victim.death})); err != nil || !ok {
		t.Fatalf("requeueing %s: %v %v", victim.id, ok, err)
	}
	seen := map[uuid.UUID]bool{}
	for _, d := range page.Items {
		seen[d.Death] = true
	}
	for query := (claim.DeadQuery{Limit: 10, After: page.Next}); query.After != ""; {
		p, err := q.DeadItems(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Items {
			if seen[d.Death] {
				t.Fatalf("death %s listed twice", d.Death)
			}
			seen[d.Death] = true
		}
		query.After = p.Next
	}
	if len(seen) != 39 || seen[victim.death] {
		t.Errorf("paged through %d deaths (the requeued one listed: %v), want the other 39", len(seen), seen[victim.death])
	}

	// Bad input.
	if _, err := q.DeadItems(ctx, claim.DeadQuery{Limit: 10, After: "not-a-cursor"}); !errors.Is(err, claim.ErrBadCursor) {
		t.Errorf("a bad cursor: %v, want ErrBadCursor", err)
	}
	if _, err := q.DeadItems(ctx, claim.DeadQuery{Limit: -1}); err == nil {
		t.Error("a negative limit: no error")
	}
}

// RequeueWhere requeues the newest death of each matching id once, skips
// live ids, leaves the other deaths and queues alone, and reports progress.
func TestAdminRequeueWhere(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	deaths := adminSeed(t, pool)
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	f := claim.DeadFilter{Tenant: "a"}
	match := wantDeaths(deaths, "q", f)
	ids := map[uuid.UUID]bool{}
	for _, d := range match {
		ids[d.id] = true
	}
	// One matching id is live: enqueued again.
	live := match[len(match)-1].id
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: live, Payload: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	var calls int
	res, err := q.Requeue(ctx, claim.RequeueOptions{Filter: f, Progress: func(claim.RequeueResult) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != len(ids)-1 || res.Live != 1 || calls == 0 {
		t.Errorf("RequeueWhere = %+v after %d progress calls; want %d requeued, 1 live", res, calls, len(ids)-1)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'q'`); n != len(ids) {
		t.Errorf("%d items in q, want %d (the requeued and the live one)", n, len(ids))
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'q' AND tenant = 'a'`); n != 1 {
		t.Errorf("%d deaths of tenant a left, want 1 (the live id's)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'q' AND (tenant IS NULL OR tenant <> 'a')`); n != len(wantDeaths(deaths, "q", claim.DeadFilter{}))-len(match) {
		t.Errorf("%d other deaths of q left, want %d", n, len(wantDeaths(deaths, "q", claim.DeadFilter{}))-len(match))
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'other'`); n != 6 {
		t.Errorf("%d deaths of queue other left, want 6", n)
	}
	// Nothing matches now but the live id.
	res, err = q.Requeue(ctx, claim.RequeueOptions{Filter: f})
	if err != nil || res.Requeued != 0 || res.Live != 1 {
		t.Errorf("again: %+v, %v; want nothing requeued, 1 live", res, err)
	}
}

// Purge deletes every row of its queue, in batches, and no other queue's;
// PurgePlan counted them beforehand.
func TestAdminPurge(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	seedDeaths(t, pool, []adminDeath{
		{id: uuid.New(), death: uuid.New(), queue: "q", reason: "failed", diedAt: time.Now()},
		{id: uuid.New(), death: uuid.New(), queue: "other", reason: "failed", diedAt: time.Now()},
	})
	fill := func(name string, n int) *claim.Queue {
		q := newQueue(t, pool, claim.Options{Queue: name})
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true, MaxInFlight: 5, DedupWindow: time.Hour}}); err != nil {
			t.Fatal(err)
		}
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"a": &claim.Limit{MaxInFlight: 2}}}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i += 500 {
			if _, err := q.Enqueue(ctx, payloads(min(500, n-i))...); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, 0)`, s.ID(), name); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) SELECT $1, gen_random_uuid(), 'acked' FROM generate_series(1, 1500)`, name); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_schedules (queue, name, last_period) VALUES ($1, 'nightly', now())`, name); err != nil {
			t.Fatal(err)
		}
		if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3}); err != nil || len(got) != 3 {
			t.Fatalf("claim: %d, %v", len(got), err)
		}
		return q
	}
	q := fill("q", 2300)
	fill("other", 700)
	rows := func(queue string) map[string]int {
		m := map[string]int{}
		for _, tb := range []string{"items", "dead_items", "ended", "session_parts", "tenant_limits", "schedules"} {
			m[tb] = count(t, pool, `SELECT count(*) FROM crdbwork_`+tb+` WHERE queue = $1`, queue)
		}
		m["queues"] = count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE name = $1`, queue)
		return m
	}
	otherBefore := rows("other")
	plan, err := q.Purge(ctx, claim.PurgeOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	wantPlan := claim.PurgeCounts{Items: 2300, Dead: 1, Ended: 1500, OwnedParts: 1, TenantLimits: 1, Schedules: 1, Stored: true}
	if plan != wantPlan {
		t.Errorf("PurgePlan = %+v, want %+v", plan, wantPlan)
	}
	var mu sync.Mutex
	var seen []claim.PurgeCounts
	done, err := q.Purge(ctx, claim.PurgeOptions{Progress: func(c claim.PurgeCounts) { mu.Lock(); seen = append(seen, c); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if done != wantPlan {
		t.Errorf("Purge = %+v, want %+v", done, wantPlan)
	}
	if len(seen) < 4 { // 3 batches of items, 2 of ended ids, 1 of dead items, the end
		t.Errorf("%d progress calls, want a call per batch (at least 4)", len(seen))
	}
	for tb, n := range rows("q") {
		if n != 0 {
			t.Errorf("%d rows of q left in %s", n, tb)
		}
	}
	if after := rows("other"); !equalCounts(after, otherBefore) {
		t.Errorf("queue other changed: %v, was %v", after, otherBefore)
	}
	if ok, err := claim.QueueExists(ctx, pool, crsql.Tables{}, "q"); err != nil || ok {
		t.Errorf("QueueExists(q) after the purge = %v, %v", ok, err)
	}
	if ok, err := claim.QueueExists(ctx, pool, crsql.Tables{}, "other"); err != nil || !ok {
		t.Errorf("QueueExists(other) = %v, %v", ok, err)
	}
	owners, err := claim.PartOwners(ctx, pool, crsql.Tables{}, "")
	if err != nil || len(owners) != 1 || owners[0].Queue != "other" || owners[0].Session != s.ID() || owners[0].Part != 0 {
		t.Errorf("PartOwners = %+v, %v; want part 0 of other", owners, err)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// WaitDrained returns ctx's error while items are left, and nil once none
// is (claimed items count).
func TestAdminWaitDrained(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	enq, err := q.Enqueue(ctx, payloads(3)...)
	if err != nil {
		t.Fatal(err)
	}
	ids := enq.IDs
	held, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(held) != 1 {
		t.Fatal(held, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = q.WaitDrained(short, 20*time.Millisecond)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDrained with items left: %v, want the deadline", err)
	}
	result := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() { result <- q.WaitDrained(wctx, 20*time.Millisecond) }()
	for _, id := range ids {
		if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{})); err != nil || !ok {
			t.Fatalf("cancel %s: %v %v", id, ok, err)
		}
	}
	// The claimed item ends when its holder (a worker) ends it.
	if err := q.EndCancelled(ctx, held[0]); err != nil {
		t.Fatal(err)
	}
	if err := await.Recv(t, "WaitDrained to return once the queue drained", result); err != nil {
		t.Fatalf("WaitDrained after the queue drained: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	// A drained queue returns at once; so does one that never existed.
	for _, name := range []string{"q", "never"} {
		if err := newQueue(t, pool, claim.Options{Queue: name}).WaitDrained(wctx, time.Second); err != nil {
			t.Errorf("WaitDrained(%s): %v", name, err)
		}
	}
}
