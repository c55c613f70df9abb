package claim_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestInspectQueues fills several queues of one database (one with four
// parts, settings, tenants, tenant limits, claimed, delayed and dead
// items; one without a stored row; one paused; one with dead items only;
// one never used) and checks every figure Inspect reports for each, and
// that Queues lists the queues that have a row or items, no other.
func TestInspectQueues(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	started := time.Now()

	// "parts": 4 parts, 14 items: tenants t1 (6), t2 (4) and none (4);
	// items 0, 5 and 9 delayed by an hour.
	parts := newQueue(t, pool, claim.Options{Queue: "parts"})
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "parts", 4); err != nil {
		t.Fatal(err)
	}
	settings := claim.Policy{MaxInFlight: 7, Rate: 2.5, TenantMaxInFlight: 2, DedupWindow: time.Hour}
	if err := parts.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &settings}); err != nil {
		t.Fatal(err)
	}
	if err := parts.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"t1": &claim.Limit{MaxInFlight: 1, Rate: 0.5}}}); err != nil {
		t.Fatal(err)
	}
	var items []claim.NewItem
	tenantOf := map[uuid.UUID]string{}
	delayed := map[uuid.UUID]bool{}
	for i := range 14 {
		it := claim.NewItem{ID: uuid.New(), Key: fmt.Sprint("k", i), Payload: []byte{byte(i)}}
		switch {
		case i < 6:
			it.Tenant = "t1"
		case i < 10:
			it.Tenant = "t2"
		}
		if i == 0 || i == 5 || i == 9 {
			it.Delay = time.Hour
			delayed[it.ID] = true
		}
		tenantOf[it.ID] = it.Tenant
		items = append(items, it)
	}
	if _, err := parts.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// Claim 5 due items: 2 stay claimed by s, 1 by s2, 2 die (one
	// permanent failure each).
	claimed, err := parts.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 4})
	if err != nil || len(claimed) != 4 {
		t.Fatalf("Claim = %d items, %v; want 4", len(claimed), err)
	}
	s2 := startSession(t, ctx, pool)
	other, err := parts.Claimer(s2.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(other) != 1 {
		t.Fatalf("Claim by s2 = %d items, %v; want 1", len(other), err)
	}
	for _, it := range claimed[2:] {
		if o, err := parts.Nack(ctx, it, claim.Permanent(errors.New("boom"))); err != nil || o != claim.Dead {
			t.Fatalf("Nack = %v, %v; want Dead", o, err)
		}
	}
	state := map[uuid.UUID]string{}
	for _, it := range append(claimed[:2:2], other...) {
		state[it.ID] = "claimed"
	}
	for _, it := range claimed[2:] {
		state[it.ID] = "dead"
	}
	// The expected figures, from each item's part.
	want := claim.QueueInfo{Name: "parts", Stored: true, NumParts: 4, Dead: 2, Settings: claim.Settings{Policy: settings}, Holders: map[uuid.UUID]int64{s.ID(): 2, s2.ID(): 1},
		TenantLimits: map[string]claim.Limit{"t1": {MaxInFlight: 1, Rate: 0.5}}}
	byPart := map[int]*claim.PartInfo{}
	for p := range 4 {
		byPart[p] = &claim.PartInfo{Part: p}
	}
	byTenant := map[string]*claim.TenantInfo{}
	for _, it := range items {
		pi := byPart[partOf(t, pool, it.ID)]
		switch state[it.ID] {
		case "dead":
			continue
		case "claimed":
			pi.Claimed++
			want.Claimed++
			continue
		}
		pi.Unclaimed++
		want.Unclaimed++
		if it.Tenant != "" && byTenant[it.Tenant] == nil {
			byTenant[it.Tenant] = &claim.TenantInfo{Tenant: it.Tenant}
		}
		if it.Tenant != "" {
			byTenant[it.Tenant].Unclaimed++
		}
		if !delayed[it.ID] {
			pi.Due++
			want.Due++
			if it.Tenant != "" {
				byTenant[it.Tenant].Due++
			}
		}
	}
	for p := range 4 {
		want.Parts = append(want.Parts, *byPart[p])
	}
	for _, ti := range byTenant {
		want.Tenants = append(want.Tenants, *ti)
	}
	sort.Slice(want.Tenants, func(i, j int) bool {
		a, b := want.Tenants[i], want.Tenants[j]
		return a.Unclaimed > b.Unclaimed || a.Unclaimed == b.Unclaimed && a.Tenant < b.Tenant
	})

	// "plain": no stored row, 3 items, one delayed.
	plain := newQueue(t, pool, claim.Options{Queue: "plain"})
	if _, err := plain.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")},
		claim.NewItem{Payload: []byte("c"), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// "paused": a stored row (one part), paused, one item.
	paused := newQueue(t, pool, claim.Options{Queue: "paused"})
	if _, err := paused.Enqueue(ctx, claim.NewItem{Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	if err := paused.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.On}); err != nil {
		t.Fatal(err)
	}
	// "deadonly": its one item died.
	deadOnly := newQueue(t, pool, claim.Options{Queue: "deadonly"})
	if _, err := deadOnly.Enqueue(ctx, claim.NewItem{Payload: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	its, err := deadOnly.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(its) != 1 {
		t.Fatalf("Claim = %d, %v", len(its), err)
	}
	if o, err := deadOnly.Nack(ctx, its[0], claim.Permanent(errors.New("boom"))); err != nil || o != claim.Dead {
		t.Fatalf("Nack = %v, %v; want Dead", o, err)
	}
	elapsed := time.Since(started) + time.Minute // the database clock may differ a little

	check := func(q *claim.Queue, want claim.QueueInfo, due bool) {
		t.Helper()
		got, err := q.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if due != (got.OldestDue > 0) || got.OldestDue > elapsed {
			t.Errorf("%s: OldestDue = %v, want %s and below %v", want.Name, got.OldestDue, map[bool]string{true: "> 0", false: "0"}[due], elapsed)
		}
		got.OldestDue = 0
		// Settings holds all of the queue's settings: the ones QueueInfo
		// also shows on their own agree with them.
		want.Settings.Paused, want.Settings.Retention, want.Settings.TenantLimits = want.Paused, want.Retention, want.TenantLimits
		want.Settings.Parts = want.NumParts
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Inspect =\n%+v\nwant\n%+v", want.Name, got, want)
		}
	}
	// Every queue here keeps the default retention of dead items.
	def := claim.Retention{DeadMaxAge: claim.DefaultDeadMaxAge, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}
	want.Retention = def
	check(parts, want, true)
	check(plain, claim.QueueInfo{Name: "plain", NumParts: 1, Parts: []claim.PartInfo{{Part: 0, Unclaimed: 3, Due: 2}},
		Unclaimed: 3, Due: 2, Holders: map[uuid.UUID]int64{}, TenantLimits: map[string]claim.Limit{}, Retention: def}, true)
	check(paused, claim.QueueInfo{Name: "paused", Stored: true, NumParts: 1, Paused: true, Parts: []claim.PartInfo{{Part: 0, Unclaimed: 1, Due: 1}},
		Unclaimed: 1, Due: 1, Holders: map[uuid.UUID]int64{}, Settings: claim.Settings{Policy: claim.Policy{DedupWindow: claim.DefaultDedupWindow}}, TenantLimits: map[string]claim.Limit{}, Retention: def}, true)
	check(deadOnly, claim.QueueInfo{Name: "deadonly", NumParts: 1, Dead: 1, Parts: []claim.PartInfo{}, Holders: map[uuid.UUID]int64{}, TenantLimits: map[string]claim.Limit{}, Retention: def}, false)
	check(newQueue(t, pool, claim.Options{Queue: "unused"}), claim.QueueInfo{Name: "unused", NumParts: 1, Parts: []claim.PartInfo{},
		Holders: map[uuid.UUID]int64{}, TenantLimits: map[string]claim.Limit{}, Retention: def}, false)

	names, err := claim.Queues(ctx, pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if w := []string{"deadonly", "parts", "paused", "plain"}; !reflect.DeepEqual(names, w) {
		t.Fatalf("Queues = %q, want %q", names, w)
	}
}

// partOf returns the part of item id (read here, not through Inspect).
func partOf(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) int {
	t.Helper()
	var p int
	if err := pool.QueryRow(context.Background(), `SELECT part FROM crdbwork_items WHERE id = $1
		UNION ALL SELECT part FROM crdbwork_dead_items WHERE id = $1 LIMIT 1`, id).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}
