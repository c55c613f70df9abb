package claim_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Every dependent of an acked prerequisite ends without a reap: in a
// database that has lived (internal/lived), a queue the statistics never saw gets 20
// fan-ins (a root, 48 children after it, a join after the children) and
// 20 chains of 25, drained by three workers (a pool and a session each)
// that claim and ack batches, and no Reap runs at all, so that only the
// releases after the acks can move a dependent. The moment every ack has
// returned and no item is left to claim, no item may still wait: that
// would be a dependent whose prerequisites were all acked, left for a
// reap that never comes (the test fails there at once, naming how many).
// Every dependent is counted released by an ack's release, and no release
// failed.
func TestDependsReleasedWithoutReap(t *testing.T) {
	t.Parallel()
	pool := testdb.NewLived(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE results (item_id UUID NOT NULL, session_id UUID NOT NULL, row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY)`)
		return err
	}, lived.Options{})
	ctx := context.Background()
	const queue = "burst"
	var items []claim.NewItem
	dependents := 0
	for f := range 20 {
		root := uuid.New()
		items = append(items, claim.NewItem{ID: root, Payload: []byte(fmt.Sprint("root ", f))})
		kids := make([]uuid.UUID, 48)
		for i := range kids {
			kids[i] = uuid.New()
			items = append(items, claim.NewItem{ID: kids[i], Payload: []byte(fmt.Sprint(f, ".", i)), After: []uuid.UUID{root}})
		}
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprint("join ", f)), After: kids})
		dependents += len(kids) + 1
	}
	for c := range 20 {
		var prev uuid.UUID
		for i := range 25 {
			it := claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprint(c, "/", i))}
			if i > 0 {
				it.After = []uuid.UUID{prev}
				dependents++
			}
			prev = it.ID
			items = append(items, it)
		}
	}
	producer := newQueue(t, pool, claim.Options{Queue: queue})
	for start := 0; start < len(items); start += 500 {
		if _, err := producer.Enqueue(ctx, items[start:min(start+500, len(items))]...); err != nil {
			t.Fatal(err)
		}
	}

	var (
		inFlight, acks atomic.Int64
		wg             sync.WaitGroup
		done           = make(chan struct{})
		errMu          sync.Mutex
		errs           []error
	)
	var queues []*claim.Queue
	for range 3 {
		cfg := pool.Config().Copy()
		cfg.MaxConns = 8
		wpool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wpool.Close)
		q := newQueue(t, wpool, claim.Options{Queue: queue})
		queues = append(queues, q)
		s := startSession(t, ctx, wpool)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				inFlight.Add(1)
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 16})
				if err == nil && len(got) > 0 {
					reqs := make([]claim.AckRequest, len(got))
					for i, it := range got {
						reqs[i] = claim.AckRequest{Item: it, Record: record(it)}
					}
					for _, e := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
						if e != nil {
							err = e
						}
					}
				}
				acks.Add(1)
				inFlight.Add(-1)
				if err != nil {
					errMu.Lock()
					errs = append(errs, err)
					errMu.Unlock()
					return
				}
				if len(got) == 0 {
					select {
					case <-done:
						return
					case <-time.After(5 * time.Millisecond): // an idle worker's pause, not a wait
					}
				}
			}
		}()
	}
	defer func() {
		select {
		case <-done:
		default:
			close(done)
		}
		wg.Wait()
	}()
	// Every item acked; at each poll, a quiet moment (no claim or ack in
	// flight before and after the counts, and none that ended between)
	// with nothing to claim must have no waiting item.
	await.Until(t, "every item acked", func() (bool, string) {
		a1, f1 := acks.Load(), inFlight.Load()
		var queued, waiting, results int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1),
			(SELECT count(*) FROM crdbwork_waiting WHERE queue = $1), (SELECT count(*) FROM results)`, queue).Scan(&queued, &waiting, &results); err != nil {
			t.Fatal(err)
		}
		f2, a2 := inFlight.Load(), acks.Load()
		if results == len(items) {
			return true, ""
		}
		if f1 == 0 && f2 == 0 && a1 == a2 && queued == 0 && waiting > 0 {
			t.Fatalf("%d dependents still wait with every ack returned and nothing to claim (%d of %d items acked): left for a reap", waiting, results, len(items))
		}
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("a worker failed: %v", errs)
		}
		return false, fmt.Sprintf("%d of %d items acked, %d queued, %d waiting", results, len(items), queued, waiting)
	}, await.Every(10*time.Millisecond), await.Within(2*time.Minute))
	close(done)
	wg.Wait()
	var unblocked, failures int64
	for _, q := range queues {
		st := q.Stats()
		unblocked += st.Unblocked
		failures += st.ReleaseFailures
	}
	if unblocked != int64(dependents) || failures != 0 {
		t.Fatalf("the releases moved %d dependents of %d, %d releases failed", unblocked, dependents, failures)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id HAVING count(*) > 1) AS d`); n != 0 {
		t.Fatalf("%d items acked more than once", n)
	}
}
