package claim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// Fair queues (Settings.Fair) order claims by turns that enqueue stamps, in
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
// (FairTurns returns no rows otherwise). It runs once per call, before the
// enqueue's first attempt, so that retries write the same turns.
func (q *Queue) stamp(ctx context.Context, db crsql.DB, b *batch) error {
	type tp struct {
		tenant   string
		priority int64
	}
	var tenants []string
	var priorities []int64
	seen := map[tp]bool{}
	for i := range b.items {
		it := &b.items[i]
		if it.Tenant == "" {
			continue
		}
		k := tp{it.Tenant, int64(it.Priority)}
		if !seen[k] {
			seen[k] = true
			tenants, priorities = append(tenants, k.tenant), append(priorities, k.priority)
		}
	}
	if len(tenants) == 0 {
		return nil
	}
	rows, err := db.Query(ctx, q.st.FairTurns, q.opts.Queue, tenants, priorities)
	if err != nil {
		return err
	}
	next := map[tp]time.Time{}
	var t string
	var p int64
	var now time.Time
	var head, last *time.Time
	_, err = pgx.ForEachRow(rows, []any{&t, &p, &now, &head, &last}, func() error {
		turn := now
		if head != nil && head.Before(now) {
			turn = *head
		}
		if last != nil && !last.Before(turn) {
			turn = last.Add(time.Microsecond)
		}
		next[tp{t, p}] = turn
		return nil
	})
	if err != nil || len(next) == 0 {
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
	}
	return nil
}
