package main

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestRollingCrossQueueDependenciesUnderPreviousReleaseWorkers: the
// previous release's workers (schema version 5, which know same-queue
// dependencies but not crdbwork_waits_across) work the queue of the
// prerequisites of an item of another queue (NewItem.AfterIn). Their acks
// delete the hints this code writes beside each cross-queue edge and lower
// no count, so they lose nothing: the dependent still waits, its edges
// intact, and the reap of its queue by this code (the sweep of the edges
// into it) releases it once every prerequisite is acked. Same-queue
// dependencies of the old workers' queue keep working beside them.
func TestRollingCrossQueueDependenciesUnderPreviousReleaseWorkers(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	url := testschema.NewURL(t)
	f := newFleet(t, url)
	f.demoTables()
	ctx := context.Background()
	qa, err := claim.New(f.pool, claim.Options{Queue: upgradeQueue})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := claim.New(f.pool, claim.Options{Queue: "dependents"})
	if err != nil {
		t.Fatal(err)
	}
	// Enqueued before the old workers start, so that every prerequisite is
	// queued when the dependent is enqueued.
	const prereqs = 10
	var ids []uuid.UUID
	var in []claim.Prereq
	items := []claim.NewItem{}
	for i := range prereqs {
		id := uuid.New()
		ids = append(ids, id)
		in = append(in, claim.Prereq{Queue: upgradeQueue, ID: id})
		items = append(items, claim.NewItem{ID: id, Payload: []byte{byte('0' + i%9)}})
	}
	local := uuid.New() // a same-queue dependent of the old workers' queue
	items = append(items, claim.NewItem{ID: local, Payload: []byte("9"), After: ids[:2]})
	if _, err := qa.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	join := uuid.New()
	res, err := qb.Enqueue(ctx, claim.NewItem{ID: join, Payload: []byte("join"), AfterIn: in})
	if err != nil || !res.Waiting[0] {
		t.Fatalf("Enqueue of the dependent: %+v, %v; want it waiting", res, err)
	}
	f.start(old, "old-1")
	f.start(old, "old-2")
	results := func(ids []uuid.UUID) int {
		return f.count(`SELECT count(*) FROM demo_results WHERE item_id = ANY($1)`, ids)
	}
	f.waitFor("every prerequisite and the same-queue dependent to be run by the old workers", func() bool {
		return results(append([]uuid.UUID{local}, ids...)) == prereqs+1
	})
	f.waitFor("the old workers' acks of the prerequisites to commit", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND outcome = 'acked' AND id = ANY($2)`, upgradeQueue, ids) == prereqs
	})
	// Nothing lost: the dependent waits for all of them still, its edges
	// intact (the old acks deleted hints only).
	if n := f.count(`SELECT remaining FROM crdbwork_waiting WHERE id = $1 AND queue = 'dependents'`, join); n != prereqs {
		t.Fatalf("the dependent's remaining count is %d after the old acks, want %d (uncounted)", n, prereqs)
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_waits_across WHERE dependent = $1`, join); n != prereqs {
		t.Fatalf("%d cross-queue edges left after the old acks, want %d", n, prereqs)
	}
	t.Logf("hints left after the old workers' acks: %d of %d", f.count(`SELECT count(*) FROM crdbwork_waits_for WHERE dependent = $1`, join), prereqs)
	// This code's reap of the dependent's queue settles them.
	st, err := queuemaint.For(qb).Reap(ctx)
	if err != nil || st.Unblocked != 1 {
		t.Fatalf("the dependents' queue's reap: %+v, %v; want the dependent released", st, err)
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_items WHERE id = $1 AND queue = 'dependents'`, join); n != 1 {
		t.Fatalf("the dependent is in its queue's items %d times after the reap, want 1", n)
	}
	f.checkAlive()
	if n := f.count(`SELECT count(*) FROM crdbwork_waits_across`) + f.count(`SELECT count(*) FROM crdbwork_waits_for`) +
		f.count(`SELECT count(*) FROM crdbwork_waiting`); n != 0 {
		t.Fatalf("%d edges, hints or waiting rows left", n)
	}
	if n := f.count(`SELECT count(*) FROM demo_results WHERE item_id = ANY($1)`, ids); n != prereqs {
		t.Fatalf("%d results of %d prerequisites", n, prereqs)
	}
}
