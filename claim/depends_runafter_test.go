package claim_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// A dependent with RunAfter whose one prerequisite had died before the
// enqueue (satisfied, not counted) and whose other is still queued waits
// for the queued one: the dead one gets no edge. (Before, it got an edge
// that its remaining count did not hold, and the reaper's release of that
// edge, for the dead prerequisite, moved the dependent into the items
// table while the other prerequisite was still queued.)
func TestDependsRunAfterEndedAtEnqueueWritesNoEdge(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "ra-enq"})
	s := startSession(t, ctx, pool)
	queued, dead, dep := uuid.New(), uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: dead, Payload: []byte("dead")}); err != nil {
		t.Fatal(err)
	}
	killOne(t, q, s.ID(), dead)
	res, err := q.Enqueue(ctx, claim.NewItem{ID: queued, Payload: []byte("q")},
		claim.NewItem{ID: dep, After: []uuid.UUID{queued, dead}, RunAfter: claim.PrereqDied, Payload: []byte("d")})
	if err != nil || !res.Waiting[1] {
		t.Fatalf("Enqueue: %+v, %v; want the dependent waiting", res, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for WHERE dependent = $1`, dep); n != 1 {
		t.Fatalf("%d edges to the dependent, want 1 (the queued prerequisite's)", n)
	}
	if _, err := queuemaint.For(q).Reap(ctx); err != nil {
		t.Fatal(err)
	}
	items := claimEvery(t, q, s.ID())
	if got := idSet(items); len(got) != 1 || !got[queued] {
		t.Fatalf("claimable after the reap: %v; want the queued prerequisite alone", got)
	}
	ackAll(t, q, items)
	if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != dep {
		t.Fatalf("after the prerequisite's ack claimed %d items, want the dependent", len(got))
	}
}
