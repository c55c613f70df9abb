package order_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/bench/internal/order"
	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestStrictClaimsHavePEIZero: one session claiming without parts takes the
// best claimable items every time, so every PEI is 0: one item per claim,
// then batches of 7 (each item of a batch has only the batch's own items
// before it).
func TestStrictClaimsHavePEIZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	for _, batch := range []int{1, 7} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			res := load{sessions: 1, backlog: 300, claims: 60, batch: batch, serial: true}.run(t, ctx, pool, fmt.Sprint("strict-", batch), 1)
			if res.claimed != int64(60*batch) || res.all.Count != 60*batch {
				t.Fatalf("claimed %d items, %d samples; want %d", res.claimed, res.all.Count, 60*batch)
			}
			if res.all.Max != 0 {
				t.Errorf("a lone any-part session strayed from the strict order: %v", res.all)
			}
			t.Logf("%v", res.all)
		})
	}
}

// partOf is the part claim.Enqueue gives key among n parts: FNV-1a of the
// key, non-negative, modulo n. The test checks it against the database.
func partOf(key string, n int) int {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int((h.Sum64() & math.MaxInt64) % uint64(n))
}

// TestPartsPEIAsConstructed: 16 parts, 16 sessions owning one part each, one
// item per part with distinct priorities; the sessions claim their one item
// in a random order. Each item's PEI must be exactly the number of items
// still unclaimed with a lower priority.
func TestPartsPEIAsConstructed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	const parts, queue = 16, "constructed"
	ss, owned := startSessions(t, ctx, pool, queue, parts, parts)
	rng := rand.New(rand.NewPCG(7, 7))
	prio := rng.Perm(parts) // prio[p]: the priority of part p's item
	items := make([]claim.NewItem, parts)
	keys := make([]string, parts)
	for p := range parts {
		for i := 0; keys[p] == ""; i++ {
			if k := fmt.Sprintf("key-%d", i); partOf(k, parts) == p {
				keys[p] = k
			}
		}
		items[p] = claim.NewItem{Payload: []byte{1}, Key: keys[p], Priority: 10 * prio[p]}
	}
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	for p, id := range ids.IDs {
		var got int
		if err := pool.QueryRow(ctx, `SELECT part FROM crdbwork_items WHERE id = $1`, id).Scan(&got); err != nil || got != p {
			t.Fatalf("item of key %q is in part %d (%v); the test expects part %d", keys[p], got, err, p)
		}
	}
	meter, err := order.NewMeter(pool, crsql.Tables{}, queue)
	if err != nil {
		t.Fatal(err)
	}
	unclaimed := map[int]bool{}
	for p := range parts {
		unclaimed[p] = true
	}
	nonzero := 0
	for _, i := range rng.Perm(parts) {
		s := ss[i]
		own := owned[s.ID()]
		if len(own) != 1 {
			t.Fatalf("session %d owns parts %v; want one", i, own)
		}
		p := own[0]
		got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1, Parts: own})
		if err != nil || len(got) != 1 || got[0].ID != ids.IDs[p] {
			t.Fatalf("session owning part %d claimed %v, %v; want its item %s", p, got, err, ids.IDs[p])
		}
		want := int64(0)
		for o := range unclaimed {
			if o != p && prio[o] < prio[p] {
				want++
			}
		}
		peis, err := meter.Observe(ctx, got)
		if err != nil {
			t.Fatal(err)
		}
		if peis[0] != want {
			t.Errorf("part %d's item (priority %d): PEI %d; want %d", p, 10*prio[p], peis[0], want)
		}
		if want > 0 {
			nonzero++
		}
		delete(unclaimed, p)
	}
	if nonzero == 0 {
		t.Fatal("the claim order put every item first: the test measured nothing")
	}
	if s := meter.Summary(); s.Count != parts {
		t.Errorf("summary of %d samples; want %d", s.Count, parts)
	}
}

// TestMeterCountsOnlyClaimableItems: items that are claimed, not yet vested,
// out of attempts or in another queue do not count.
func TestMeterCountsOnlyClaimableItems(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	const queue = "claimable"
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	other, err := claim.New(pool, claim.Options{Queue: "other"})
	if err != nil {
		t.Fatal(err)
	}
	ss, _ := startSessions(t, ctx, pool, queue, 1, 0)
	// Priorities 1..5 are claimable; 0 is claimed below; -1 vests later;
	// -2 is out of attempts; -3 is in another queue; -4 has expired. The
	// item of priority 9 is the one measured: 5 claimable items come
	// before it.
	var news []claim.NewItem
	for p := 0; p <= 5; p++ {
		news = append(news, claim.NewItem{Payload: []byte{1}, Priority: p})
	}
	news = append(news, claim.NewItem{Payload: []byte{1}, Priority: -1, Delay: 1 << 40},
		claim.NewItem{Payload: []byte{1}, Priority: -2}, claim.NewItem{Payload: []byte{1}, Priority: 9},
		claim.NewItem{Payload: []byte{1}, Priority: -4, TTL: time.Millisecond})
	ids, err := q.Enqueue(ctx, news...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Enqueue(ctx, claim.NewItem{Payload: []byte{1}, Priority: -3}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET attempts = max_attempts WHERE id = $1`, ids.IDs[7]); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the item with a 1 ms TTL to expire", func() bool {
		var expired bool
		if err := pool.QueryRow(ctx, `SELECT expires_at < now() FROM crdbwork_items WHERE id = $1`, ids.IDs[9]).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		return expired
	})
	got, err := q.Claimer(ss[0].ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 || got[0].Priority != 0 {
		t.Fatalf("claimed %v, %v; want the priority 0 item", got, err)
	}
	var target claim.Item
	if err := pool.QueryRow(ctx, `SELECT priority, turn_at FROM crdbwork_items WHERE id = $1`, ids.IDs[8]).Scan(&target.Priority, &target.TurnAt); err != nil {
		t.Fatal(err)
	}
	target.ID = ids.IDs[8]
	meter, err := order.NewMeter(pool, crsql.Tables{}, queue)
	if err != nil {
		t.Fatal(err)
	}
	peis, err := meter.Observe(ctx, []claim.Item{target, got[0]})
	if err != nil {
		t.Fatal(err)
	}
	if peis[0] != 5 || peis[1] != 0 {
		t.Errorf("PEIs %v; want [5 0] (priorities 1..5 before 9; nothing claimable before 0)", peis)
	}
}

// TestSummarize checks the percentiles (nearest rank), mean and zero share.
func TestSummarize(t *testing.T) {
	t.Parallel()
	var peis []int64
	for i := range 100 {
		peis = append(peis, int64(99-i)) // 99..0
	}
	s := order.Summarize(peis)
	if s.Count != 100 || s.Median != 49 || s.P90 != 89 || s.P99 != 98 || s.Max != 99 || s.Mean != 49.5 || s.Zero != 0.01 {
		t.Errorf("Summarize(0..99) = %+v", s)
	}
	if peis[0] != 99 {
		t.Error("Summarize sorted its argument")
	}
	if s := order.Summarize(nil); s != (order.Summary{}) {
		t.Errorf("Summarize(nil) = %+v", s)
	}
	if s := order.Summarize([]int64{3}); s.Median != 3 || s.P99 != 3 || s.Mean != 3 {
		t.Errorf("Summarize([3]) = %+v", s)
	}
}
