package claim_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
)

// benchTenants is the number of tenants of the fairness benchmarks.
const benchTenants = 1000

// tenantItems returns n items of random tenants among benchTenants.
func tenantItems(rng *rand.Rand, n int) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte("0123456789abcdef"), Tenant: fmt.Sprint("tenant-", rng.IntN(benchTenants))}
	}
	return items
}

// BenchmarkEnqueueFair measures what fairness costs enqueue: a fair queue
// reads every (tenant, priority) pair's turns before it writes (store.Store.ItemsFairLasts and FairHead,
// two index seeks per pair), a plain one does not. Calls of `size` items of
// random tenants among 1,000 go into a queue that already holds a backlog of
// 10,000 such items (untimed). It reports items/s.
func BenchmarkEnqueueFair(b *testing.B) {
	for _, size := range []int{1, 100} {
		for _, fair := range []bool{false, true} {
			b.Run(fmt.Sprintf("size=%d/fair=%v", size, fair), func(b *testing.B) {
				pool := setup(b)
				ctx := context.Background()
				q := newQueue(b, pool, claim.Options{})
				if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: fair}}); err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(1, 2))
				for range 10 {
					if _, err := q.Enqueue(ctx, tenantItems(rng, 1000)...); err != nil {
						b.Fatal(err)
					}
				}
				if err := store.RefreshStats(ctx, pool, "crdbwork_items"); err != nil {
					b.Fatal(err)
				}
				calls := make([][]claim.NewItem, b.N)
				for i := range calls {
					calls[i] = tenantItems(rng, size)
				}
				b.ResetTimer()
				start := time.Now()
				for _, items := range calls {
					if _, err := q.Enqueue(ctx, items...); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/time.Since(start).Seconds(), "items/s")
			})
		}
	}
}

// BenchmarkClaimTenants measures claims of batches of 64 from a backlog of
// b.N items of 1,000 tenants, in a fair queue (claim order: the stamped
// turns) and a plain one (enqueue order): the claim statement is the same.
// It reports items/s.
func BenchmarkClaimTenants(b *testing.B) {
	for _, fair := range []bool{false, true} {
		b.Run(fmt.Sprintf("fair=%v", fair), func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: fair}}); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for left := b.N; left > 0; left -= 1000 {
				if _, err := q.Enqueue(ctx, tenantItems(rng, min(left, 1000))...); err != nil {
					b.Fatal(err)
				}
			}
			if err := store.RefreshStats(ctx, pool, "crdbwork_items"); err != nil {
				b.Fatal(err)
			}
			s := startSession(b, ctx, pool)
			b.ResetTimer()
			start := time.Now()
			claimed := 0
			for claimed < b.N {
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 64})
				if err != nil {
					b.Fatal(err)
				}
				if len(got) == 0 {
					b.Fatalf("claimed %d of %d items, then nothing", claimed, b.N)
				}
				claimed += len(got)
			}
			b.ReportMetric(float64(claimed)/time.Since(start).Seconds(), "items/s")
		})
	}
}
