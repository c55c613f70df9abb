package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// TestDrainsInALivedDatabase drains one queue per feature — plain, fair,
// sequenced, dependencies (a fan-out/fan-in and chains), the urgent lane, a
// fleet-wide limit — in a database that has lived (internal/lived: other
// queues with 120k items analyzed before this queue existed, dead tuples,
// ended ids, dead and waiting items): a burst on a quiet queue, whose rows
// the statistics estimate at about one. Every item must end, acked exactly
// once, and nothing may be left in the queue's tables. Liveness only: how
// fast is the benchmarks' (go -C bench run . lived); the deadline is a
// bound for a stall, not a measure.
func TestDrainsInALivedDatabase(t *testing.T) {
	t.Parallel()
	for _, feature := range []string{"plain", "fair", "sequenced", "fan", "chains", "urgent", "limits"} {
		t.Run(feature, func(t *testing.T) {
			t.Parallel()
			pool := testdb.NewLived(t, func(ctx context.Context, pool *pgxpool.Pool) error {
				return testschema.Apply(ctx, pool)
			}, lived.Options{})
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `CREATE TABLE results (
				row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
				item_id UUID NOT NULL, session_id UUID NOT NULL, part BIGINT NOT NULL, owned BOOL NOT NULL,
				tx_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
				t.Fatal(err)
			}
			const queue = "burst"
			if err := partition.SetParts(ctx, pool, crsql.Tables{}, queue, 16); err != nil {
				t.Fatal(err)
			}
			q := newQueue(t, pool, claim.Options{Queue: queue})
			opts := worker.Options{Concurrency: 16, Parts: 16, Poll: 20 * time.Millisecond}
			items := livedItems(feature, 400)
			var err error
			switch feature {
			case "fair":
				err = q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}})
			case "limits":
				err = q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{MaxInFlight: 4}})
			case "sequenced":
				err = q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On})
			case "urgent":
				opts.UrgentLane, opts.UrgentPriority = true, 1
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), recordHandler(0), opts)
			}
			waitFor(t, fmt.Sprintf("every %s item to end in a lived database", feature), 5*time.Minute, func() bool {
				return count(t, pool, `SELECT count(*) FROM results`) >= len(items)
			})
			waitFor(t, "the queue's tables to empty", time.Minute, func() bool {
				return count(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1) + (SELECT count(*) FROM crdbwork_waiting WHERE queue = $1)`, queue) == 0
			})
			if n := count(t, pool, `SELECT count(*) FROM results`); n != len(items) {
				t.Errorf("%d results for %d items", n, len(items))
			}
			if d := count(t, pool, `SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id HAVING count(*) > 1) AS d`); d != 0 {
				t.Errorf("%d items acked more than once", d)
			}
			if dead := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`, queue); dead != 0 {
				t.Errorf("%d items died", dead)
			}
			if other := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue LIKE 'lived-%'`); other < 70_000 {
				t.Errorf("the other queues' items: %d, want them untouched (at least 70k)", other)
			}
		})
	}
}

// livedItems returns about n items of a feature's drain.
func livedItems(feature string, n int) []claim.NewItem {
	var items []claim.NewItem
	switch feature {
	case "fan": // a root, n children after it, a join after every child
		root := uuid.New()
		items = append(items, claim.NewItem{ID: root, Payload: []byte("root")})
		var kids []uuid.UUID
		for i := range n {
			kid := uuid.New()
			kids = append(kids, kid)
			items = append(items, claim.NewItem{ID: kid, Payload: []byte(fmt.Sprint(i)), After: []uuid.UUID{root}})
		}
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte("join"), After: kids})
	case "chains": // n/50 chains of 50 items, each after the one before
		for c := range max(n/50, 1) {
			var prev uuid.UUID
			for d := range 50 {
				it := claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprintf("%d.%d", c, d))}
				if d > 0 {
					it.After = []uuid.UUID{prev}
				}
				prev = it.ID
				items = append(items, it)
			}
		}
	default:
		for i := range n {
			it := claim.NewItem{Payload: []byte(fmt.Sprint(i))}
			switch feature {
			case "fair":
				it.Tenant = fmt.Sprint("tenant-", i%20)
			case "sequenced":
				it.Key = fmt.Sprint("key-", i%20)
			case "urgent":
				it.Priority = 10
				if i%10 == 0 {
					it.Priority = 1
				}
			}
			items = append(items, it)
		}
	}
	return items
}
