package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// Every hook of Options.Testing is called, round after round, and says
// what it promises: AfterAck comes once the acked item's dependents were
// released; AfterIdleClaim rounds let a test show that an item that is not
// due is not claimed, without a sleep.
func TestTestingHooksCountRounds(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if err := partition.SetParts(ctx, pool, q.Options().Tables, q.Name(), 2); err != nil {
		t.Fatal(err)
	}
	rounds := map[string]*await.Rounds{}
	for _, name := range []string{"idle claims", "acks", "limit refreshes", "session reaps", "queue reaps", "reap turns", "heartbeats", "rebalances"} {
		rounds[name] = await.NewRounds(name)
	}
	prereq, dependent := uuid.New(), uuid.New()
	var mu sync.Mutex
	var problems []string
	released := false // the prerequisite's ack was reported after its dependent left the waiting table
	// ListenPoll -1: idle claims at Poll, whose rounds the test counts
	// (with the default, an idle worker claims every 10 s while it listens).
	opts := worker.Options{Parts: 2, Concurrency: 4, ListenPoll: -1,
		Limits: worker.LimitOptions{Refresh: 200 * time.Millisecond},
		Testing: worker.TestingOptions{
			AfterIdleClaim: func(err error) { rounds["idle claims"].Tick() },
			AfterAck: func(items []claim.Item, errs []error) {
				for i, it := range items {
					if it.ID != prereq || errs[i] != nil {
						continue
					}
					var waiting int
					err := pool.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_waiting WHERE id = $1`, dependent).Scan(&waiting)
					mu.Lock()
					switch {
					case err != nil:
						problems = append(problems, err.Error())
					case waiting != 0:
						problems = append(problems, "AfterAck of the prerequisite came while its dependent still waited")
					default:
						released = true
					}
					mu.Unlock()
				}
				rounds["acks"].Tick()
			},
			AfterLimitRefresh: rounds["limit refreshes"].Tick,
			AfterSessionReap:  func(int64, error) { rounds["session reaps"].Tick() },
			AfterQueueReap: func(st claim.ReapStats, err error) {
				if err != nil {
					mu.Lock()
					problems = append(problems, fmt.Sprint("queue reap: ", err))
					mu.Unlock()
				}
				rounds["queue reaps"].Tick()
			},
			AfterReapTurn: func(string, bool, error) { rounds["reap turns"].Tick() },
			Session:       session.TestingOptions{AfterHeartbeat: func(bool, error) { rounds["heartbeats"].Tick() }},
			Partition:     partition.TestingOptions{AfterRebalance: func([]int, error) { rounds["rebalances"].Tick() }},
		}}
	// A peer session, so that the worker is not alone in its database:
	// a session alone reaps no expired sessions (there can be none).
	peer, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: time.Minute, Expiry: time.Hour, ReapEvery: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(context.Background()) })
	start(t, pool, recordHandler(0), opts)
	for name, r := range rounds {
		// An idle queue is reaped when a reap would do something, and
		// every idleQueueReapEvery: the turns come every few heartbeats
		// (TestIdleFleetReapsOncePerInterval counts them).
		if name != "acks" && name != "queue reaps" {
			r.Wait(t, 2)
		}
	}

	// An item due in an hour is not claimed, round after idle round.
	later, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("later"), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	await.Never(t, "the item due in an hour is claimed", rounds["idle claims"], 3, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL`, later.IDs[0]) > 0
	})

	// A prerequisite and its dependent: the hook of the prerequisite's ack
	// sees the dependent released.
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: prereq, Payload: []byte("p")}, claim.NewItem{ID: dependent, Payload: []byte("d"), After: []uuid.UUID{prereq}}); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "both items acked", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, []uuid.UUID{prereq, dependent})
		return n == 2, fmt.Sprintf("%d of 2 acked", n)
	})
	// The prerequisite's hook runs after its release of the dependent, on
	// the goroutine of its ack: the dependent may be claimed, run and acked
	// before that goroutine calls it.
	await.Until(t, "the prerequisite's AfterAck", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return released || len(problems) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 || !released {
		t.Fatalf("problems %v, prerequisite's AfterAck after the release: %v", problems, released)
	}
}
