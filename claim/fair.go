package claim

import (
	"context"
	"sync"
	"time"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// Fair queues (Policy.Fair) order claims by turns that enqueue stamps, in
// the manner of start-time fair queuing: a tenant's new item takes the turn
// after the tenant's latest unclaimed item of the same priority, but never
// one before the queue's head (the earliest turn still unclaimed). A
// tenant with a million items backlogged thus holds turns head, head+1µs,
// …, head+1s, and a tenant with nothing queued enters at the head: claims,
// which take items in (priority, turn) order, serve the backlogged tenants
// one item each in turn (water filling: each visit gives a tenant one item,
// then moves on), and a newcomer waits for one round, not for the backlog.
//
// The stamps cost enqueue one read (two index seeks per tenant and priority
// of the call) and no write to any shared row: they are computed from the
// items themselves, outside the enqueue's transaction, so that producers of
// different tenants never conflict, on CockroachDB included. Two enqueues of
// the same tenant racing may stamp overlapping turns; that costs a little
// fairness, never an item. Claims are unchanged: the same statements, the
// same indexes, in (priority, turn_at) order.

// stamp computes b.turns for the items with a tenant, if the queue is fair
// (fairTurns returns no rows otherwise). It runs once per call, before the
// enqueue's first attempt, so that retries write the same turns.
func (q *Queue) stamp(ctx context.Context, db crsql.DB, b *batch) error {
	type tp struct {
		tenant   string
		priority int64
	}
	var tenants []string
	var priorities []int64
	var readHead []bool
	seen := map[tp]bool{}
	cached := map[int64]*time.Time{} // the priorities whose head is cached
	for i := range b.items {
		it := &b.items[i]
		if it.Tenant == "" {
			continue
		}
		k := tp{it.Tenant, int64(it.Priority)}
		if seen[k] {
			continue
		}
		seen[k] = true
		tenants, priorities = append(tenants, k.tenant), append(priorities, k.priority)
		_, known := cached[k.priority]
		if !known {
			if h, ok := q.heads.get(k.priority); ok {
				cached[k.priority], known = h, true
			}
		}
		// One read of each priority's head per call, and none while
		// the cached one is fresh.
		readHead = append(readHead, !known)
		if !known {
			cached[k.priority] = nil
		}
	}
	if len(tenants) == 0 || time.Now().UnixNano() < q.plainUntil.Load() {
		return nil
	}
	got, err := q.fairTurns(ctx, db, tenants, priorities, readHead)
	if err != nil {
		return err
	}
	heads := map[int64]*time.Time{}
	for i, p := range priorities {
		if !readHead[i] {
			heads[p] = cached[p]
		}
	}
	if len(got) == 0 {
		// Not a fair queue: enqueues of tenants' items skip the read for
		// a while (UpdateSettings making it fair applies within plainTTL).
		q.plainUntil.Store(time.Now().Add(plainTTL).UnixNano())
		return nil
	}
	reader := map[tp]bool{} // the pair that reads its priority's head
	for i := range tenants {
		if readHead[i] {
			reader[tp{tenants[i], priorities[i]}] = true
		}
	}
	read := map[int64]bool{}
	for _, g := range got {
		if reader[tp{g.t, g.p}] {
			heads[g.p], read[g.p] = g.head, true
		}
	}
	for p := range read {
		// An empty head is not kept: the items this call stamps may be
		// the new head, which the next call must see.
		if heads[p] != nil {
			q.heads.put(p, *heads[p])
		}
	}
	next := map[tp]time.Time{}
	for _, g := range got {
		turn, head, last := g.now, heads[g.p], g.last
		if head != nil && head.Before(turn) {
			turn = *head
		}
		if last != nil && !last.Before(turn) {
			turn = last.Add(time.Microsecond)
		}
		next[tp{g.t, g.p}] = turn
	}
	spread, limited, err := q.spreads(ctx, db)
	if err != nil {
		return err
	}
	b.turns = make([]*time.Time, len(b.items))
	for i := range b.items {
		it := &b.items[i]
		if it.Tenant == "" {
			continue
		}
		k := tp{it.Tenant, int64(it.Priority)}
		turn := next[k]
		b.turns[i] = &turn
		next[k] = turn.Add(time.Microsecond)
		if spread && it.Key == "" && !limited[it.Tenant] {
			b.hashes[i] = spreadHash(it.Tenant, turn) // see spreads
		}
	}
	return nil
}

// headTTL is how long a fair queue's head, once read, is used without
// reading it again. The head read may step over many index entries of
// items claimed moments ago while a backlog drains (4 ms was measured on
// PostgreSQL); a head this stale puts a newcomer's first item a little
// earlier than the current head, which is still the front of the queue.
const headTTL = 100 * time.Millisecond

// plainTTL is how long a queue found not fair is taken to stay so: its
// enqueues of tenants' items then cost no read at all.
const plainTTL = time.Second

// headCache holds the last head read per priority.
type headCache struct {
	mu sync.Mutex
	m  map[int64]cachedHead
}

type cachedHead struct {
	head time.Time
	read time.Time
}

func (c *headCache) get(priority int64) (*time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[priority]
	if !ok || time.Since(h.read) > headTTL {
		return nil, false
	}
	return &h.head, true
}

func (c *headCache) put(priority int64, head time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[int64]cachedHead{}
	}
	if len(c.m) > 1024 { // many priorities: start afresh rather than grow
		clear(c.m)
	}
	c.m[priority] = cachedHead{head: head, read: time.Now()}
}
