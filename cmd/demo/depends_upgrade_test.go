package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testschema"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestRollingDependenciesUnderPreviousReleaseWorkers: the previous
// release's workers (schema version 4, which know nothing of dependencies)
// work a queue that has a fan-out / fan-in enqueued by this code. They
// never run a waiting item: the children run only after the root's ack and
// a reap by this code (the old acks release nothing), the join only after
// every child's ack; every item runs exactly once and nothing is left.
//
// It is about workers that predate dependencies: from schema version 6 on,
// the previous release (version 5) has them, and its acks release the
// dependents themselves, so the test has nothing left to show.
func TestRollingDependenciesUnderPreviousReleaseWorkers(t *testing.T) {
	t.Parallel()
	if crsql.Version-1 >= 5 {
		t.Skipf("the previous release (schema version %d) knows dependencies: its workers release dependents as this code's do", crsql.Version-1)
	}
	old := previousDemo(t)
	url := testschema.NewURL(t)
	f := newFleet(t, url)
	f.demoTables()
	ctx := context.Background()
	f.start(old, "old-1")
	f.start(old, "old-2")
	f.settled([]string{"old-1", "old-2"}, []string{"old-1", "old-2"}, nil)
	q, err := claim.New(f.pool, claim.Options{Queue: upgradeQueue})
	if err != nil {
		t.Fatal(err)
	}
	const children = 20
	root, join := uuid.New(), uuid.New()
	items := []claim.NewItem{{ID: root, Payload: []byte("0")}}
	var kids []uuid.UUID
	for i := range children {
		id := uuid.New()
		kids = append(kids, id)
		items = append(items, claim.NewItem{ID: id, Payload: []byte{byte('1' + i%9)}, After: []uuid.UUID{root}})
	}
	items = append(items, claim.NewItem{ID: join, Payload: []byte("9"), After: kids})
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	all := append([]uuid.UUID{root, join}, kids...)
	results := func(ids []uuid.UUID) int {
		return f.count(`SELECT count(*) FROM demo_results WHERE item_id = ANY($1)`, ids)
	}
	f.waitFor("the root to be acked by an old worker", func() bool { return results([]uuid.UUID{root}) == 1 })
	// Only the old workers run: nothing releases the children. Watch it
	// through 16 heartbeats of both old workers: each of them polls for
	// items several times a heartbeat and runs its queue's reaper every
	// 2.5 to 7.5 heartbeats, so each reaped at least twice meanwhile.
	await.Never(t, "a waiting item runs or leaves the waiting items under the old workers alone", f.heartbeats("old-1", "old-2"), 16,
		func() (bool, string) {
			ran, waiting := results(all), f.count(`SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`, upgradeQueue)
			return ran != 1 || waiting != children+1, fmt.Sprintf("%d items ran (want the root alone), %d waiting (want %d)", ran, waiting, children+1)
		})
	// This code's reaps (a version-5 session's) release what the old acks
	// satisfied: the children, then the join.
	f.waitFor("every item to run", func() bool {
		if _, err := queuemaint.For(q).Reap(ctx); err != nil {
			t.Fatal(err)
		}
		return results(all) == len(all)
	})
	f.checkAlive()
	if n := f.count(`SELECT count(DISTINCT item_id) FROM demo_results WHERE item_id = ANY($1)`, all); n != len(all) || results(all) != len(all) {
		t.Fatalf("%d distinct items of %d ran, %d result rows", n, len(all), results(all))
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_ended AS j, crdbwork_ended AS c
		WHERE j.queue = $1 AND j.id = $2 AND c.queue = $1 AND c.id = ANY($3) AND c.outcome = 'acked' AND j.ended_at > c.ended_at`,
		upgradeQueue, join, kids); n != children {
		t.Fatalf("the join was acked after %d of its %d prerequisites' acks", n, children)
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_ended AS r, crdbwork_ended AS c
		WHERE r.queue = $1 AND r.id = $2 AND c.queue = $1 AND c.id = ANY($3) AND c.ended_at > r.ended_at`,
		upgradeQueue, root, kids); n != children {
		t.Fatalf("%d of %d children were acked after the root", n, children)
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_waiting`) + f.count(`SELECT count(*) FROM crdbwork_waits_for`) +
		f.count(`SELECT count(*) FROM crdbwork_items`) + f.count(`SELECT count(*) FROM crdbwork_dead_items`); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}
