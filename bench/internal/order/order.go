// Package order measures how far a queue's claims stray from its strict
// global order: for each claimed item, its popped element index (PEI), the
// measure of "A Scalable Relaxed Distributed Priority Queue" (seed 004).
//
// The strict order is the claim order of the whole queue: priority (lower
// first), then turn (claim.Item.TurnAt: the vesting time, or in a fair queue
// the turn enqueue stamped). An item's PEI is the number of claimable items
// (unclaimed, vested, unexpired, attempts left, same queue) that come
// strictly before it in that order when it is claimed: 0 means a strict
// priority queue would have handed out this very item. Tenant limits are
// not part of the order: an item of a tenant at its limit still counts.
// Items that tie with it (same priority and turn) do not count, since the claim statements order them
// arbitrarily too. Items taken by the same claim do not count either: a
// batch of n items behaves as n pops in a row, each of which finds the
// batch's earlier items already gone, so a strict claim of the n first
// items has PEI 0 for every one of them.
//
// # What the count sees
//
// Meter.Observe counts right after the claim, in one statement with its
// own snapshot (store.Store.ItemsOrderCountsBefore; the claim has committed by
// then). The count is exact when
// nothing else changes the queue between the claim and the count. Under
// concurrency it errs both ways:
//
//   - It over-counts items that became claimable after the claim (enqueued,
//     vested, nacked or released in the gap) and, on PostgreSQL, items that
//     other sessions are claiming at that instant but have not committed
//     (they still read as unclaimed; CockroachDB's reader waits for such
//     writes instead, so there they do not count).
//   - It under-counts items that were claimable at the claim and that other
//     sessions claimed in the gap.
//
// Both errors are bounded by what other sessions do during one statement's
// round trip; a single claimer whose queue is otherwise idle is measured
// exactly. The tests and the benchmark of this package also run the
// sessions' claims one at a time ("serial"), where every count is exact.
package order

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Sample is the PEI of one claimed item.
type Sample struct {
	// Priority is the item's priority.
	Priority int
	// PEI is the number of claimable items strictly before the item in the
	// queue's order, right after its claim.
	PEI int64
}

// Meter counts the PEI of claimed items and keeps every sample. It is safe
// for concurrent use.
type Meter struct {
	db    crsql.DB
	queue string
	store *store.Store

	mu      sync.Mutex
	samples []Sample
	errs    int
}

// NewMeter returns a Meter for the items of queue in the tables t on db.
func NewMeter(db crsql.DB, t crsql.Tables, queue string) (*Meter, error) {
	if db == nil {
		return nil, errors.New("order: nil database")
	}
	if queue == "" {
		queue = claim.DefaultQueue
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("order: %w", err)
	}
	return &Meter{db: db, queue: queue, store: store.New(t)}, nil
}

// Observe counts the PEI of items, which one claim has just returned, in
// one statement, records them and returns them in the order of items. Call
// it at once after the claim, before the items are acked or nacked: see the
// package documentation for what the count sees. On error nothing is
// recorded (Errors counts it).
func (m *Meter) Observe(ctx context.Context, items []claim.Item) ([]int64, error) {
	if len(items) == 0 {
		return nil, nil
	}
	pos := make([]store.OrderPosition, len(items))
	for i, it := range items {
		pos[i] = store.OrderPosition{Priority: it.Priority, TurnAt: it.TurnAt}
	}
	peis, err := m.store.ItemsOrderCountsBefore(ctx, m.db, m.queue, pos)
	if err != nil {
		m.failed()
		return nil, fmt.Errorf("order: counting the items before %d claimed items of %q: %w", len(items), m.queue, err)
	}
	m.mu.Lock()
	for i, it := range items {
		m.samples = append(m.samples, Sample{Priority: it.Priority, PEI: peis[i]})
	}
	m.mu.Unlock()
	return peis, nil
}

func (m *Meter) failed() {
	m.mu.Lock()
	m.errs++
	m.mu.Unlock()
}

// Errors returns the number of Observe calls that failed (their items have
// no sample).
func (m *Meter) Errors() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.errs
}

// Samples returns a copy of every sample, in the order they were recorded.
func (m *Meter) Samples() []Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Sample(nil), m.samples...)
}

// Summary summarizes every sample.
func (m *Meter) Summary() Summary { return m.SummaryWhere(nil) }

// SummaryWhere summarizes the samples whose priority keep accepts (all of
// them if keep is nil): SummaryWhere(func(p int) bool { return p <= 10 })
// gives the PEI of urgent items.
func (m *Meter) SummaryWhere(keep func(priority int) bool) Summary {
	m.mu.Lock()
	peis := make([]int64, 0, len(m.samples))
	for _, s := range m.samples {
		if keep == nil || keep(s.Priority) {
			peis = append(peis, s.PEI)
		}
	}
	m.mu.Unlock()
	return Summarize(peis)
}

// Summary is the distribution of PEIs.
type Summary struct {
	// Count is the number of samples; the other fields are 0 without any.
	Count int
	// Median, P90 and P99 are percentiles by the nearest-rank method: the
	// smallest sample at or above that share of the samples.
	Median, P90, P99 int64
	// Mean is the average PEI.
	Mean float64
	// Max is the largest PEI.
	Max int64
	// Zero is the share of samples with PEI 0 (the strict order's own pick).
	Zero float64
}

// Summarize returns the distribution of peis (which it does not modify).
func Summarize(peis []int64) Summary {
	if len(peis) == 0 {
		return Summary{}
	}
	s := append([]int64(nil), peis...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum float64
	zeros := 0
	for _, v := range s {
		sum += float64(v)
		if v == 0 {
			zeros++
		}
	}
	rank := func(p float64) int64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Summary{
		Count: len(s), Median: rank(0.5), P90: rank(0.9), P99: rank(0.99),
		Mean: sum / float64(len(s)), Max: s[len(s)-1], Zero: float64(zeros) / float64(len(s)),
	}
}

// String formats the summary as one line.
func (s Summary) String() string {
	return fmt.Sprintf("%d claims: median %d, mean %.1f, p90 %d, p99 %d, max %d (%.0f%% at 0)",
		s.Count, s.Median, s.Mean, s.P90, s.P99, s.Max, 100*s.Zero)
}
