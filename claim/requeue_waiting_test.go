package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// A dead id that is enqueued again with prerequisites (a waiting item) is
// live: every requeue path — Requeue, RequeueDeath, RequeueWhere (what the
// CLI's and the dashboard's requeues call) — refuses it with ErrItemLive,
// saying it is a waiting item and of which queue, and keeps the dead copy;
// the waiting item stays intact, and runs once its prerequisite is acked.
// Three queues share the database: the id's second life waits in its own
// queue ("jobs") in one case and in another queue ("other") in the second,
// and a queue of bystanders holds items and dead items of its own that
// RequeueWhere of "jobs" never touches.
//
// Before the fix, the requeue looked only at the items table: it moved the
// dead copy into the queue, where it ran before its prerequisite, and the
// waiting item was lost at its release (its id was taken).
func TestRequeueRefusesAnIDThatIsWaiting(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	jobs := newQueue(t, pool, claim.Options{Queue: "jobs"})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	by := newQueue(t, pool, claim.Options{Queue: "bystander"})
	byDead := uuid.New()
	dieOnce(t, by, s.ID(), byDead)
	if _, err := by.Enqueue(ctx, payloads(20)...); err != nil {
		t.Fatal(err)
	}

	// Ids die in "jobs" while its dedup window is off (so that they can
	// be enqueued again as new items), then the window is turned back on,
	// which dependencies need.
	if err := jobs.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	same, elsewhere, plain := uuid.New(), uuid.New(), uuid.New()
	for _, id := range []uuid.UUID{same, elsewhere, plain} {
		dieOnce(t, jobs, s.ID(), id)
	}
	if err := jobs.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{}}); err != nil {
		t.Fatal(err)
	}

	// same: enqueued again in "jobs", waiting for p; elsewhere: enqueued
	// in "other", waiting for po.
	p, po := uuid.New(), uuid.New()
	res, err := jobs.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")},
		claim.NewItem{ID: same, Payload: []byte("second life"), After: []uuid.UUID{p}})
	if err != nil || !res.New[1] || !res.Waiting[1] {
		t.Fatalf("enqueue of the dead id with After: %+v, %v; want it new and waiting", res, err)
	}
	res, err = other.Enqueue(ctx, claim.NewItem{ID: po, Payload: []byte("po")},
		claim.NewItem{ID: elsewhere, Payload: []byte("life elsewhere"), After: []uuid.UUID{po}})
	if err != nil || !res.New[1] || !res.Waiting[1] {
		t.Fatalf("enqueue of the dead id in another queue with After: %+v, %v; want it new and waiting", res, err)
	}

	refused := func(what string, ok bool, err error, queue string) {
		t.Helper()
		if ok || !errors.Is(err, claim.ErrItemLive) || !strings.Contains(err.Error(), "waiting item of queue \""+queue+"\"") {
			t.Fatalf("%s = %v, %v; want a refusal wrapping ErrItemLive that names the waiting item of %q", what, ok, err, queue)
		}
	}
	ok, err := requeuedOne(jobs.Requeue(ctx, claim.RequeueOptions{ID: same}))
	refused("Requeue of an id waiting in its queue", ok, err, "jobs")
	ok, err = requeuedOne(jobs.Requeue(ctx, claim.RequeueOptions{ID: elsewhere}))
	refused("Requeue of an id waiting in another queue", ok, err, "other")
	var death uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT death FROM crdbwork_dead_items WHERE id = $1`, same).Scan(&death); err != nil {
		t.Fatal(err)
	}
	ok, err = requeuedOne(jobs.Requeue(ctx, claim.RequeueOptions{ID: same, Death: death}))
	refused("RequeueDeath of an id waiting in its queue", ok, err, "jobs")

	// The bulk requeue skips both, counts them live, and requeues the
	// plain dead id.
	rr, err := jobs.Requeue(ctx, claim.RequeueOptions{All: true})
	if err != nil || rr.Requeued != 1 || rr.Live != 2 || rr.Gone != 0 {
		t.Fatalf("RequeueWhere = %+v, %v; want 1 requeued and 2 live", rr, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = ANY($1) AND queue = 'jobs'`, []uuid.UUID{same, elsewhere}); n != 2 {
		t.Fatalf("%d dead copies of the waiting ids left, want both", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND queue = 'bystander'`, byDead); n != 1 {
		t.Fatal("RequeueWhere of one queue touched another queue's dead item")
	}
	// Both waiting items are intact, not claimable yet.
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = ANY($1)`, []uuid.UUID{same, elsewhere}); n != 2 {
		t.Fatalf("%d of the 2 waiting items left", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = ANY($1)`, []uuid.UUID{same, elsewhere}); n != 0 {
		t.Fatalf("%d of the waiting ids are in the items table", n)
	}

	// Their prerequisites run first; then the second lives, as enqueued.
	for _, c := range []struct {
		q         *claim.Queue
		prereq    uuid.UUID
		dependent uuid.UUID
		payload   string
	}{{jobs, p, same, "second life"}, {other, po, elsewhere, "life elsewhere"}} {
		got := claimEvery(t, c.q, s.ID())
		var prereq *claim.Item
		for i := range got {
			switch got[i].ID {
			case c.prereq:
				prereq = &got[i]
			case c.dependent:
				t.Fatalf("queue %s: the waiting id ran before its prerequisite", c.q.Name())
			}
		}
		if prereq == nil {
			t.Fatalf("queue %s: the prerequisite was not claimable", c.q.Name())
		}
		for _, it := range got {
			if err := c.q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
		got = claimEvery(t, c.q, s.ID())
		if len(got) != 1 || got[0].ID != c.dependent || string(got[0].Payload) != c.payload {
			t.Fatalf("queue %s: after the prerequisite's ack claimed %d items, want the waiting item's second life", c.q.Name(), len(got))
		}
		ackAll(t, c.q, got)
	}
	// The dead copies are history now, and can be requeued once the id is
	// no longer live.
	if ok, err := requeuedOne(jobs.Requeue(ctx, claim.RequeueOptions{ID: same})); err != nil || !ok {
		t.Fatalf("Requeue once the second life ended = %v, %v", ok, err)
	}
}

// A requeue and an enqueue with prerequisites of the same dead id, at the
// same moment, in two queues' worth of traffic: exactly one of them takes
// the id (the other is refused, or finds the id present), never both —
// the id is never both an item and a waiting item — whatever order their
// transactions commit in (each SERIALIZABLE: a conflict is retried).
func TestRequeueRacesAnEnqueueOfTheID(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "race"})
	producer := newQueue(t, pool, claim.Options{Queue: "race"})
	noise := newQueue(t, pool, claim.Options{Queue: "noise"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	const rounds = 20
	ids := make([]uuid.UUID, rounds)
	for i := range ids {
		ids[i] = uuid.New()
		dieOnce(t, q, s.ID(), ids[i])
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{}}); err != nil {
		t.Fatal(err)
	}
	p := uuid.New()
	if _, err := producer.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	requeued, waiting := 0, 0
	for _, id := range ids {
		start := make(chan struct{})
		var moved bool
		var rqErr, enqErr error
		var res claim.Enqueued
		done := make(chan struct{}, 3)
		go func() {
			<-start
			moved, rqErr = requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id}))
			done <- struct{}{}
		}()
		go func() {
			<-start
			res, enqErr = producer.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("again"), After: []uuid.UUID{p}})
			done <- struct{}{}
		}()
		go func() {
			<-start
			_, _ = noise.Enqueue(ctx, payloads(10)...)
			done <- struct{}{}
		}()
		close(start)
		for range 3 {
			<-done
		}
		if enqErr != nil || (rqErr != nil && !errors.Is(rqErr, claim.ErrItemLive)) {
			t.Fatalf("id %s: requeue %v, %v; enqueue %v", id, moved, rqErr, enqErr)
		}
		added := res.New[0] && res.Waiting[0]
		if moved == added {
			t.Fatalf("id %s: requeued %v and added as a waiting item %v: want exactly one", id, moved, added)
		}
		inItems := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id)
		inWaiting := countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1`, id)
		if inItems+inWaiting != 1 || moved != (inItems == 1) {
			t.Fatalf("id %s: %d items and %d waiting items (requeued %v)", id, inItems, inWaiting, moved)
		}
		if moved {
			requeued++
		} else {
			waiting++
		}
	}
	t.Logf("%d requeues won, %d enqueues won", requeued, waiting)
}
