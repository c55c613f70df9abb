package claim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// BenchmarkEnqueue measures Enqueue of small items (a 16-byte payload, a
// key) on the test database, `size` items per call, with generated ids
// (COPY from 64 items up) and with caller-given ids (INSERT … ON CONFLICT
// DO NOTHING). It reports items/s.
func BenchmarkEnqueue(b *testing.B) {
	for _, ids := range []string{"generated", "given"} {
		for _, size := range []int{1, 100, 10000} {
			b.Run(fmt.Sprintf("ids=%s/size=%d", ids, size), func(b *testing.B) {
				pool := setup(b)
				ctx := context.Background()
				q := newQueue(b, pool, claim.Options{})
				items := make([]claim.NewItem, size)
				b.ResetTimer()
				for n := 0; n < b.N; n++ {
					for i := range items {
						items[i] = claim.NewItem{Payload: []byte("0123456789abcdef"), Key: fmt.Sprint("k", i%100)}
						if ids == "given" {
							items[i].ID = uuid.New()
						}
					}
					if _, err := q.Enqueue(ctx, items...); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "items/s")
			})
		}
	}
}
