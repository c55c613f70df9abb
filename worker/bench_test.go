package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/worker"
)

// BenchmarkWorkerSettle drains a backlog of no-op items (each recording a
// result row) with one worker, for the settle goroutines (Ackers) and the
// backlog gathering wait (GatherWait) that pick the defaults. It reports
// items/s. Run it as
//
//	go test ./worker/ -run '^$' -bench WorkerSettle -benchtime 1x -count 5
func BenchmarkWorkerSettle(b *testing.B) {
	const items = 4000
	for _, ackers := range benchAckers {
		for _, gather := range benchGather {
			name := fmt.Sprintf("ackers=%d/gather=%v", ackers, max(gather, 0))
			b.Run(name, func(b *testing.B) {
				pool := setup(b)
				var took time.Duration
				for range b.N {
					b.StopTimer()
					enqueue(b, pool, "default", items, false)
					b.StartTimer()
					start := time.Now()
					r := startBench(b, pool, worker.Options{Concurrency: 128, Ackers: ackers, GatherWait: gather})
					waitFor(b, "the queue to drain", 5*time.Minute, func() bool {
						return count(b, pool, `SELECT count(*) FROM crdbwork_items`) == 0
					})
					took += time.Since(start)
					b.StopTimer()
					r.Stop(b)
					if _, err := pool.Exec(context.Background(), `TRUNCATE results`); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(items*b.N)/took.Seconds(), "items/s")
			})
		}
	}
}

// startBench starts a worker with the default session (a benchmark's
// sessions need no fast expiry).
func startBench(b *testing.B, pool *pgxpool.Pool, opts worker.Options) *running {
	b.Helper()
	opts.Session.Heartbeat, opts.Session.Expiry = time.Second, 5*time.Second
	return start(b, pool, recordHandler(0), opts)
}

// The variants of BenchmarkWorkerSettle, in the order they run. The
// machine's load moves more than they do: compare runs of the whole set
// repeated (-count 1, several times, in alternation), not one run.
var (
	benchAckers = []int{1, 2, 4}
	benchGather = []time.Duration{-1, 5 * time.Millisecond, 20 * time.Millisecond}
)
