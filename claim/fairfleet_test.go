package claim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// A fair queue is fair across sessions that claim in parts, not only
// within each: with 16 parts owned by 4 sessions in runs of 4 (as
// partition.Sticky divides them) and half of the tenants in the first
// session's parts by their hash, sessions that each claim the same number
// of items serve every backlogged tenant the same share. (When a tenant's
// items all sat in the tenant's part, the first session's 12 tenants got a
// twelfth of its claims each and the others' 4 tenants a quarter each.)
func TestFairQueueServesTenantsEvenlyAcrossSessions(t *testing.T) {
	t.Parallel()
	const parts, sessions, perSession, rounds = 16, 4, 6, 16
	pool, q := fairQueueWithParts(t, parts)
	ctx := context.Background()
	// 24 tenants: 12 whose part is in the first session's run (0-3), 4 in
	// each of the others', with backlogs of 20 to 43 items, each
	// enqueued in two calls.
	var tenants []string
	for s := range sessions {
		want := len(tenants) + 4
		if s == 0 {
			want = 12
		}
		for i := 0; len(tenants) < want; i++ {
			name := fmt.Sprintf("tenant-s%d-%d", s, i)
			if claim.PartOf("", name, parts)/4 == s {
				tenants = append(tenants, name)
			}
		}
	}
	for i, tn := range tenants {
		items := make([]claim.NewItem, 20+i)
		for j := range items {
			items[j] = claim.NewItem{Payload: []byte("x"), Tenant: tn}
		}
		for _, call := range [][]claim.NewItem{items[:len(items)/2], items[len(items)/2:]} {
			if _, err := q.Enqueue(ctx, call...); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := make([]uuid.UUID, sessions)
	owned := make([][]int, sessions)
	for s := range sessions {
		ids[s] = startSession(t, ctx, pool).ID()
		for p := 4 * s; p < 4*s+4; p++ {
			owned[s] = append(owned[s], p)
			if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, ids[s], q.Name(), p); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each round, every session claims perSession items of its parts (a
	// round of the 24 tenants across the fleet) and acks them; every
	// tenant stays backlogged throughout (20 items or more, 16 rounds).
	got := map[string]int{}
	for r := range rounds {
		for s := range sessions {
			items, err := q.Claimer(ids[s]).Claim(ctx, claim.ClaimRequest{Max: perSession, Parts: owned[s]})
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != perSession {
				t.Fatalf("round %d: session %d claimed %d items, want %d", r, s, len(items), perSession)
			}
			for _, it := range items {
				if !slices.Contains(owned[s], it.Part) {
					t.Fatalf("session %d claimed an item of part %d, not its own", s, it.Part)
				}
				got[it.Tenant]++
				if err := q.Ack(ctx, it, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// Each tenant's fair share is rounds items; allow one round either
	// way (a session's parts hold a tenant's items at 4 of every 16
	// turns, not at one of every 4).
	lo, hi := rounds, rounds
	for _, tn := range tenants {
		lo, hi = min(lo, got[tn]), max(hi, got[tn])
	}
	if lo < rounds-2 || hi > rounds+2 {
		t.Errorf("claims per tenant from %d to %d, want %d±2 each: %v", lo, hi, rounds, got)
	}
	var sum, sq float64
	for _, tn := range tenants {
		x := float64(got[tn])
		sum, sq = sum+x, sq+x*x
	}
	if jain := sum * sum / (float64(len(tenants)) * sq); jain < 0.98 {
		t.Errorf("Jain's index of the tenants' claims %.3f, want at least 0.98: %v", jain, got)
	}
}
