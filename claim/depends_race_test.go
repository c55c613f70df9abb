package claim_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// An enqueue of a dependent that races the ack of its prerequisite, in two
// processes (two Queues), never leaves the dependent waiting for a reap:
// the ack's statement reads the edges the enqueue writes, and the enqueue
// the item the ack deletes, both SERIALIZABLE, so either the enqueue
// commits first (the ack sees the edge and releases it), or the ack does
// (the enqueue finds the prerequisite acked and adds a plain item), or one
// of them fails and is retried. No Reap runs: once every enqueue and ack
// has returned, nothing may wait.
func TestAckRacingTheEnqueueOfADependent(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	producer := newQueue(t, pool, claim.Options{Queue: "race"})
	worker := newQueue(t, pool, claim.Options{Queue: "race"})
	const n = 60
	prereqs := make([]claim.NewItem, n)
	for i := range prereqs {
		prereqs[i] = claim.NewItem{ID: uuid.New(), Payload: []byte("prerequisite")}
	}
	if _, err := producer.Enqueue(ctx, prereqs...); err != nil {
		t.Fatal(err)
	}
	claimed, err := worker.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d of %d (%v)", len(claimed), n, err)
	}
	var wg sync.WaitGroup
	waiting := make([]bool, n)
	for i, it := range claimed {
		wg.Add(2)
		go func() {
			defer wg.Done()
			res, err := producer.Enqueue(ctx, claim.NewItem{Payload: []byte("dependent"), After: []uuid.UUID{it.ID}})
			if err != nil {
				t.Errorf("enqueue of a dependent of %s: %v", it.ID, err)
				return
			}
			waiting[i] = res.Waiting[0]
		}()
		go func() {
			defer wg.Done()
			if err := worker.Ack(ctx, it, nil); err != nil {
				t.Errorf("ack of %s: %v", it.ID, err)
			}
		}()
	}
	wg.Wait()
	added := 0
	for _, w := range waiting {
		if w {
			added++
		}
	}
	if left := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = 'race'`); left != 0 {
		t.Fatalf("%d dependents still wait with every prerequisite acked and no reap run", left)
	}
	if got := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'race'`); got != n {
		t.Fatalf("%d items claimable, want the %d dependents", got, n)
	}
	t.Logf("%d of %d dependents were enqueued waiting and released by the racing ack; ack retries %d, enqueue retries %d",
		added, n, worker.Stats().Retries["ack"], producer.Stats().Retries["enqueue"])
}
