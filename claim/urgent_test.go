package claim_test

import (
	"context"
	"fmt"
	"log"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestClaimUrgentTakesOnlyUrgentItemsFromAnyPart: a session that owns no part
// claims through the lane the urgent items (priority <= 1) of every part,
// most urgent first, leaving out skipped tenants; the claims name no part,
// and the owner's part claim then finds only the non-urgent items.
func TestClaimUrgentTakesOnlyUrgentItemsFromAnyPart(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "lane"})
	owner, other := startSession(t, ctx, pool), startSession(t, ctx, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ('lane', 4)`); err != nil {
		t.Fatal(err)
	}
	for p := range 4 {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'lane', $2)`, owner.ID(), p); err != nil {
			t.Fatal(err)
		}
	}
	var items []claim.NewItem
	for i := range 40 {
		it := claim.NewItem{Payload: []byte{byte(i)}, Priority: i % 4} // 20 urgent (0, 1), 20 not
		if i == 0 {
			it.Tenant = "skipped"
		}
		items = append(items, it)
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(other.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: 100, MaxPriority: 1, SkipTenants: []string{"skipped"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 19 {
		t.Fatalf("the lane claimed %d items; want the 19 urgent ones not of the skipped tenant", len(got))
	}
	parts := map[int]bool{}
	for i, it := range got {
		if it.Priority > 1 || it.InPart || it.Session != other.ID() || it.Tenant == "skipped" {
			t.Errorf("lane claimed %+v", it)
		}
		if i > 0 && it.Priority < got[i-1].Priority {
			t.Errorf("lane items out of order: %d after %d", it.Priority, got[i-1].Priority)
		}
		parts[it.Part] = true
	}
	if len(parts) < 2 {
		t.Errorf("lane items came from parts %v only; want several", parts)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim = $1 AND claim_part IS NULL`, other.ID()); n != 19 {
		t.Errorf("%d items claimed by the lane without a part; want 19", n)
	}
	rest, err := q.Claimer(owner.ID()).Claim(ctx, claim.ClaimRequest{Max: 100, Parts: []int{0, 1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != 21 {
		t.Errorf("the owner claimed %d items; want the 20 non-urgent and the skipped tenant's one", len(rest))
	}
	if st := q.Stats(); st.Claimed != 40 {
		t.Errorf("Stats.Claimed %d; want 40", st.Claimed)
	}
}

// Claim urgent items through the lane: a session that owns no part takes
// the items with priority <= 1 from every part, most urgent first; the
// others stay for their parts' owners.
func ExampleClaimer_ClaimUrgent() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "alerts", 8); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "alerts"})
	if err != nil {
		log.Fatal(err)
	}
	for i, prio := range []int{5, 1, 7, 0, 3, 1} {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(fmt.Sprint("alert-", i)), Key: fmt.Sprint("host-", i), Priority: prio}); err != nil {
			log.Fatal(err)
		}
	}
	s, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	items, err := q.Claimer(s.ID()).ClaimUrgent(ctx, claim.UrgentRequest{Max: 10, MaxPriority: 1})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range items {
		fmt.Println(string(it.Payload), it.Priority)
	}
	// Output:
	// alert-3 0
	// alert-1 1
	// alert-5 1
}
