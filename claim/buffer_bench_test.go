package claim_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
)

// BenchmarkEnqueueConcurrent measures single-item enqueues from 64
// goroutines at once (RunParallel with 64 goroutines in all), each call
// one small item with a generated id: straight Queue.Enqueue calls (one
// statement each; the pool has 32 connections), and Buffer.Enqueue calls
// with 1 and 4 flushers (shared statements). It reports items/s and, for
// the buffer, the mean items per flush.
func BenchmarkEnqueueConcurrent(b *testing.B) {
	for _, mode := range []struct {
		name     string
		flushers int // 0: no buffer
	}{{"direct", 0}, {"buffered", 1}, {"buffered-4", 4}} {
		b.Run(mode.name, func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("warm-up")}); err != nil {
				b.Fatal(err)
			}
			var buf *claim.Buffer
			if mode.flushers > 0 {
				buf = newBuffer(b, q, claim.BufferOptions{Flushers: mode.flushers})
			}
			b.SetParallelism((64 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					it := claim.NewItem{Payload: []byte("0123456789abcdef")}
					var err error
					if buf != nil {
						_, err = buf.Enqueue(ctx, it)
					} else {
						_, err = q.Enqueue(ctx, it)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			if buf != nil {
				st := buf.Stats()
				b.ReportMetric(float64(st.Items)/float64(max(st.Flushes, 1)), "items/flush")
			}
		})
	}
}
