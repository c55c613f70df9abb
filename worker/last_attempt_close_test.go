package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/worker"
)

// An item at its last attempt whose handler still runs when its worker's
// graceful stop closes the session is released with its attempts used up:
// no claim takes it again, and the queue's other worker moves it to the
// dead items (reason "crash loop") within the bound docs/guarantees.md
// gives ("Bounds"): a minute (the queue's prune turn) and 8.5 heartbeats.
func TestItemReleasedAtItsLastAttemptByACloseEndsDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	started, hold := make(chan uuid.UUID, 1), make(chan struct{})
	t.Cleanup(func() { close(hold) })
	// The queue's prune turns, A's and B's (once a minute for the fleet;
	// no other step has work in this test): the first tests whether the
	// prunes have work (AfterPrunesDue), and reaps only if they have. A
	// stops after it, so that the item waits for the next prune turn, the
	// longest wait.
	reaps := await.NewRounds("the queue's prune turns")
	hooks := worker.TestingOptions{
		AfterQueueReap: func(claim.ReapStats, error) { reaps.Tick() },
		AfterPrunesDue: func(bool, error) { reaps.Tick() },
	}
	// A's handler ignores its context: the stop's waits run out and the
	// session is closed under it.
	a := start(t, pool, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started <- it.ID
		<-hold
		return nil, nil
	}, worker.Options{ShutdownTimeout: 100 * time.Millisecond, MaxAbandoned: 1, Testing: hooks})
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("once"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	if got := await.Recv(t, "A's handler to start", started); got != id {
		t.Fatalf("A's handler started %s, want %s", got, id)
	}
	// B works the queue (its own session, which nothing stops).
	session := longSession()
	hb := session.Heartbeat
	start(t, pool, recordHandler(0), worker.Options{Session: session, Testing: hooks})
	reaps.Wait(t, 1)
	a.Stop(t)
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL AND attempts >= max_attempts`, id); n != 1 {
		t.Fatalf("after A's stop, the item is not unclaimed with its attempts used up (%d rows)", n)
	}
	closed := time.Now()
	await.Until(t, "the item released at its last attempt to end dead", func() (bool, string) {
		var state string
		err := pool.QueryRow(ctx, `SELECT COALESCE((SELECT 'dead: ' || reason FROM crdbwork_dead_items WHERE id = $1),
			(SELECT 'item: attempts ' || attempts || ' of ' || max_attempts || ', claimed ' || (claim IS NOT NULL)::TEXT FROM crdbwork_items WHERE id = $1), 'gone')`, id).Scan(&state)
		if err != nil {
			return false, err.Error()
		}
		return state == "dead: "+claim.ReasonCrashLoop, state
	}, await.Within(time.Minute+9*hb))
	t.Logf("dead %v after the close (the bound: a minute and 8.5 heartbeats of %v)", time.Since(closed).Round(time.Millisecond), hb)
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, id); n != 0 {
		t.Errorf("the item used up at its last attempt was run again (%d results)", n)
	}
}
