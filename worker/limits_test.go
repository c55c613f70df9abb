package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// meter records the handlers running at once and when each started.
type meter struct {
	mu          sync.Mutex
	cur, max    int
	busy        time.Duration // the handlers' summed run time
	first, last time.Time
	starts      []time.Time
	done        atomic.Int64
}

// handler returns a handler that runs for a random time in [lo, hi).
func (m *meter) handler(lo, hi time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		start := time.Now()
		m.mu.Lock()
		m.cur++
		m.max = max(m.max, m.cur)
		if m.first.IsZero() {
			m.first = start
		}
		m.starts = append(m.starts, start)
		m.mu.Unlock()
		d := lo + rand.N(hi-lo)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		end := time.Now()
		m.mu.Lock()
		m.cur--
		m.busy += end.Sub(start)
		m.last = end
		m.mu.Unlock()
		m.done.Add(1)
		return nil, ctx.Err()
	}
}

// figures returns the most handlers that ran at once, the mean number
// running, and the most that started within any window of w.
func (m *meter) figures(w time.Duration) (most int, mean float64, burst int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if span := m.last.Sub(m.first); span > 0 {
		mean = float64(m.busy) / float64(span)
	}
	s := slices.Clone(m.starts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	j := 0
	for i := range s {
		for s[i].Sub(s[j]) >= w {
			j++
		}
		burst = max(burst, i-j+1)
	}
	return m.max, mean, burst
}

// limitOpts are worker options with fast limits, sessions and rebalances.
func limitOpts(parts int) worker.Options {
	return worker.Options{
		Parts: parts, Concurrency: 8,
		Limits:    worker.LimitOptions{Refresh: 100 * time.Millisecond, Grace: 400 * time.Millisecond, Rotate: 500 * time.Millisecond},
		Partition: partition.Options{Poll: 100 * time.Millisecond, DrainTimeout: 2 * time.Second},
	}
}

// fleet runs in-process workers that all read limits from one place.
type fleet struct {
	t      *testing.T
	pool   *pgxpool.Pool
	opts   worker.Options
	h      worker.Handler
	limits atomic.Pointer[worker.Limits]
	live   []*running
	joins  int
	leaves int
}

func (f *fleet) set(l worker.Limits) { f.limits.Store(&l) }

func (f *fleet) start() {
	r := start(f.t, f.pool, f.h, f.opts)
	worker.SetLimitSource(r.w, func() worker.Limits { return *f.limits.Load() })
	f.live = append(f.live, r)
	f.joins++
}

// churn stops a random worker or starts one, keeping between 1 and 4.
func (f *fleet) churn() {
	if len(f.live) > 1 && (len(f.live) >= 4 || rand.IntN(2) == 0) {
		i := rand.IntN(len(f.live))
		f.live[i].Stop(f.t)
		f.live = append(f.live[:i], f.live[i+1:]...)
		f.leaves++
		return
	}
	f.start()
}

// TestLimitHoldsUnderChurn runs workers that join and leave every few dozen
// items while a handler counts the items running at once: never more than
// the queue's limit, and every item ends.
func TestLimitHoldsUnderChurn(t *testing.T) {
	for _, parts := range []int{16, 0} {
		t.Run(fmt.Sprintf("parts=%d", parts), func(t *testing.T) {
			const n, limit = 600, 6
			pool := setup(t)
			if parts > 0 {
				if err := partition.SetParts(context.Background(), pool, crsql.Tables{}, "default", parts); err != nil {
					t.Fatal(err)
				}
			}
			enqueue(t, pool, "default", n, false)
			m := &meter{}
			f := &fleet{t: t, pool: pool, opts: limitOpts(parts), h: m.handler(10*time.Millisecond, 40*time.Millisecond)}
			f.set(worker.Limits{Queue: claim.Limit{MaxInFlight: limit}})
			f.start()
			f.start()
			for next := int64(40); next < n; next += 40 {
				waitFor(t, fmt.Sprintf("%d items done", next), time.Minute, func() bool { return m.done.Load() >= next })
				f.churn()
			}
			waitFor(t, "every item done", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
			most, mean, _ := m.figures(time.Second)
			t.Logf("limit %d: at most %d at once, mean %.2f (%.0f%% of the limit); %d joins, %d leaves", limit, most, mean, 100*mean/limit, f.joins, f.leaves)
			if most > limit {
				t.Errorf("%d items ran at once; the limit is %d", most, limit)
			}
			if f.joins+f.leaves < 8 {
				t.Errorf("only %d membership changes: the test did not churn", f.joins+f.leaves)
			}
		})
	}
}
