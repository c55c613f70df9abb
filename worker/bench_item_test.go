package worker_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// BenchmarkWorkerItem measures what one item costs the client on the whole
// path, claim → handler → ack with a result row written in the ack's
// transaction: one op is one item, so -benchmem's allocs/op and B/op are
// per item (the worker's start and stop, amortized over b.N items,
// included; the enqueue, untimed, not). Run it as
//
//	go test ./worker/ -run '^$' -bench WorkerItem -benchmem -benchtime 20000x -count 3
//
// and compare allocations, which do not depend on the machine's load;
// ns/op does, and cpu-ns/op (this process's CPU time per item: the
// client's, not the database server's) does less. Handlers come with and without an Observer (which wraps the
// handler to time it), acked with no record or with a record per item;
// "kinds+observer" runs items of a kind with a Kinds' handler and a
// KindObserver (told each run's kind).
func BenchmarkWorkerItem(b *testing.B) {
	for _, v := range []struct {
		name                    string
		record, observed, kinds bool
	}{{"ack", false, false, false}, {"ack+observer", false, true, false}, {"kinds+observer", false, true, true}, {"record", true, false, false}} {
		b.Run(v.name, func(b *testing.B) {
			pool := setup(b)
			ctx := context.Background()
			q := newQueue(b, pool, claim.Options{})
			items := make([]claim.NewItem, b.N)
			for i := range items {
				items[i].Payload = []byte("x")
				if v.kinds {
					items[i].Kind = "k"
				}
			}
			for len(items) > 0 {
				n := min(len(items), 10000)
				if _, err := q.Enqueue(ctx, items[:n]...); err != nil {
					b.Fatal(err)
				}
				items = items[n:]
			}
			opts := worker.Options{Concurrency: 128}
			if v.observed {
				opts.Observer = nopObserver{}
			}
			h := ackHandler
			if v.kinds {
				opts.Observer = nopKindObserver{}
				kinds := worker.NewKinds()
				kinds.Handle("k", ackHandler)
				h = kinds.Handler()
			}
			if v.record {
				h = recordHandler(0)
			}
			opts.Session.Heartbeat, opts.Session.Expiry = time.Second, 5*time.Second
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.ResetTimer()
			r := startOn(b, q, h, opts)
			waitFor(b, "every item acked", 5*time.Minute, func() bool { return r.w.Stats().Acked >= int64(b.N) })
			r.Stop(b)
			b.StopTimer()
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
			if n := count(b, pool, `SELECT count(*) FROM results`); v.record && n != b.N {
				b.Fatalf("%d result rows for %d items", n, b.N)
			}
			if n := count(b, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
				b.Fatalf("%d items left", n)
			}
		})
	}
}

// processCPU returns the CPU time this process has used (user and
// system), in nanoseconds: the client's cost, whatever the load of the
// machine does to the wall-clock time (the database server is another
// process).
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// ackHandler does nothing: its item is acked without a record.
func ackHandler(context.Context, claim.Item) (worker.Record, error) { return nil, nil }

// nopObserver observes nothing.
type nopObserver struct{}

func (nopObserver) HandlerDone(string, time.Duration, claim.Outcome) {}
func (nopObserver) AckBatch(string, int)                             {}

// nopKindObserver observes nothing, told the kinds.
type nopKindObserver struct{ nopObserver }

func (nopKindObserver) KindHandlerDone(worker.HandlerRun) {}
