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
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// seedLivedDeps brings the tables of a fresh schema to the state of a
// database that has lived (issue 29): 20 other queues hold 120,000 items,
// 45,000 waiting items with 4 edges each, 120,000 ended ids and 20,000
// dead items, analyzed; then a third of the items, waiting items and edges
// are deleted (dead tuples), and autovacuum is off for the tables. A queue
// the test fills afterwards is one the statistics know nothing of. (A
// stand-in for the shared lived-state harness; sql's tests have its twin.)
func seedLivedDeps(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	name := `'lived-' || (g % 20)::TEXT`
	var stmts []string
	if testdb.Kind(t) == "postgres" {
		for _, table := range []string{"crdbwork_items", "crdbwork_waiting", "crdbwork_waits_for", "crdbwork_ended", "crdbwork_dead_items"} {
			stmts = append(stmts, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
		}
	}
	stmts = append(stmts,
		`INSERT INTO crdbwork_items (id, queue, part, priority, payload) SELECT gen_random_uuid(), `+name+`, g % 16, g % 5, '\x00'::BYTEA FROM generate_series(1, 120000) AS g`,
		`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining) SELECT gen_random_uuid(), `+name+`, g, '\x00'::BYTEA, 4 FROM generate_series(1, 45000) AS g`,
		`INSERT INTO crdbwork_waits_for (queue, prereq, dependent) SELECT w.queue, gen_random_uuid(), w.id FROM crdbwork_waiting AS w, generate_series(1, 4)`,
		`INSERT INTO crdbwork_ended (queue, id, outcome) SELECT `+name+`, gen_random_uuid(), 'acked' FROM generate_series(1, 120000) AS g`,
		`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason)
		 SELECT gen_random_uuid(), `+name+`, 0, 0, 1, 1, '\x00'::BYTEA, now(), 'failed' FROM generate_series(1, 20000) AS g`,
		`ANALYZE crdbwork_items`, `ANALYZE crdbwork_waiting`, `ANALYZE crdbwork_waits_for`, `ANALYZE crdbwork_ended`, `ANALYZE crdbwork_dead_items`,
		`DELETE FROM crdbwork_items WHERE part % 3 = 0`,
		`DELETE FROM crdbwork_waits_for WHERE dependent IN (SELECT id FROM crdbwork_waiting WHERE hash % 3 = 0)`,
		`DELETE FROM crdbwork_waiting WHERE hash % 3 = 0`,
	)
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
}

// Every dependent of an acked prerequisite ends without a reap: in a
// database that has lived, a queue the statistics never saw gets 20
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
	pool := setup(t)
	ctx := context.Background()
	seedLivedDeps(t, pool)
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
					case <-time.After(5 * time.Millisecond):
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
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	for {
		// A quiet moment: no claim or ack in flight before and after the
		// counts, and none that ended between.
		a1, f1 := acks.Load(), inFlight.Load()
		var queued, waiting, results int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1),
			(SELECT count(*) FROM crdbwork_waiting WHERE queue = $1), (SELECT count(*) FROM results)`, queue).Scan(&queued, &waiting, &results); err != nil {
			t.Fatal(err)
		}
		f2, a2 := inFlight.Load(), acks.Load()
		if results == len(items) {
			break
		}
		if f1 == 0 && f2 == 0 && a1 == a2 && queued == 0 && waiting > 0 {
			t.Fatalf("%d dependents still wait with every ack returned and nothing to claim (%d of %d items acked): left for a reap", waiting, results, len(items))
		}
		errMu.Lock()
		if len(errs) > 0 {
			t.Fatalf("a worker failed: %v", errs)
		}
		errMu.Unlock()
		if time.Now().After(deadline.Add(-30 * time.Second)) {
			t.Fatalf("%d of %d items acked, %d queued, %d waiting when the test ran out of time", results, len(items), queued, waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
