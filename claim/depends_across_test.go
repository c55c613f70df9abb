package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// A dependent in queue B waits for items of queue A (AfterIn) and of its
// own (After): no claim of B sees it until every one is acked; the ack of
// the last one in A releases it at once, without a reap; Dependencies
// shows the prerequisites with their queues from B and the dependent from
// A; its row in crdbwork_waits_across and its hint are gone after.
func TestDependsAcrossQueuesReleasedByTheAck(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "xa"})
	qb := newQueue(t, pool, claim.Options{Queue: "xb"})
	s := startSession(t, ctx, pool)
	a1, a2, b1, dep := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: a1, Payload: []byte("a1")}, claim.NewItem{ID: a2, Payload: []byte("a2")}); err != nil {
		t.Fatal(err)
	}
	res, err := qb.Enqueue(ctx, claim.NewItem{ID: b1, Payload: []byte("b1")},
		claim.NewItem{ID: dep, Payload: []byte("join"), After: []uuid.UUID{b1},
			AfterIn: []claim.Prereq{{Queue: "xa", ID: a1}, {Queue: "xa", ID: a2}}})
	if err != nil || !res.Waiting[1] {
		t.Fatalf("Enqueue: %+v, %v; want the join waiting", res, err)
	}
	if n := countRows(t, pool, `SELECT remaining FROM crdbwork_waiting WHERE id = $1`, dep); n != 3 {
		t.Fatalf("the join waits for %d, want 3", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_across WHERE prereq_queue = 'xa' AND dependent_queue = 'xb' AND dependent = $1`, dep); n != 2 {
		t.Fatalf("%d cross-queue edges, want 2", n)
	}
	d, err := qb.Dependencies(ctx, dep, 10)
	if err != nil || !d.Waiting || len(d.Prereqs) != 3 {
		t.Fatalf("Dependencies of the join: %+v, %v", d, err)
	}
	queues := map[uuid.UUID]string{}
	for _, p := range d.Prereqs {
		queues[p.ID] = p.Queue + ":" + p.State
	}
	if queues[a1] != "xa:queued" || queues[a2] != "xa:queued" || queues[b1] != ":queued" {
		t.Fatalf("the join's prerequisites: %v", queues)
	}
	da, err := qa.Dependencies(ctx, a1, 10)
	if err != nil || len(da.DependentsIn) != 1 || da.DependentsIn[0] != (claim.Prereq{Queue: "xb", ID: dep}) || len(da.Dependents) != 0 {
		t.Fatalf("Dependencies of a1 in A: %+v, %v; want the join of xb in DependentsIn alone", da, err)
	}
	ackAll(t, qb, claimEvery(t, qb, s.ID())) // b1
	inA := claimEvery(t, qa, s.ID())
	if len(inA) != 2 {
		t.Fatalf("A claimed %d items, want 2", len(inA))
	}
	ackAll(t, qa, inA[:1])
	if got := claimEvery(t, qb, s.ID()); len(got) != 0 {
		t.Fatalf("B claimed %d items with one prerequisite in A left", len(got))
	}
	ackAll(t, qa, inA[1:])
	// Released by the ack in A: claimable in B at once, no reap.
	got := claimEvery(t, qb, s.ID())
	if len(got) != 1 || got[0].ID != dep {
		t.Fatalf("B claimed %d items after A's acks, want the join", len(got))
	}
	ackAll(t, qb, got)
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_across`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`); n != 0 {
		t.Fatalf("%d edges, hints or waiting rows left", n)
	}
}

// Bad cross-queue prerequisites fail the call, and nothing of it is
// enqueued; one acked already is satisfied.
func TestDependsAcrossQueuesEnqueueErrors(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "ea"})
	qb := newQueue(t, pool, claim.Options{Queue: "eb"})
	qc := newQueue(t, pool, claim.Options{Queue: "ec"})
	s := startSession(t, ctx, pool)
	a, c, acked := uuid.New(), uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}, claim.NewItem{ID: acked, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	for _, it := range claimEvery(t, qa, s.ID()) {
		if it.ID == acked {
			ackAll(t, qa, []claim.Item{it})
		}
	}
	if _, err := qc.Enqueue(ctx, claim.NewItem{ID: c, Payload: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	if err := qc.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   []claim.Prereq
		want error
	}{
		{"unknown", []claim.Prereq{{Queue: "ea", ID: uuid.New()}}, claim.ErrPrerequisiteUnknown},
		{"wrong queue", []claim.Prereq{{Queue: "ea", ID: c}}, claim.ErrPrerequisiteOtherQueue},
		{"no dedup window", []claim.Prereq{{Queue: "ec", ID: c}}, claim.ErrNoDedupWindow},
		{"own queue", []claim.Prereq{{Queue: "eb", ID: a}}, nil},
		{"no queue", []claim.Prereq{{ID: a}}, nil},
		{"twice", []claim.Prereq{{Queue: "ea", ID: a}, {Queue: "ea", ID: a}}, nil},
	} {
		_, err := qb.Enqueue(ctx, claim.NewItem{Payload: []byte("p")}, claim.NewItem{Payload: []byte("d"), AfterIn: tc.in})
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'eb'`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`); n != 0 {
		t.Fatalf("%d rows written by refused calls", n)
	}
	res, err := qb.Enqueue(ctx, claim.NewItem{Payload: []byte("d"), AfterIn: []claim.Prereq{{Queue: "ea", ID: acked}}})
	if err != nil || res.Waiting[0] {
		t.Fatalf("after an acked prerequisite of A: %+v, %v; want claimable at once", res, err)
	}
}

// A prerequisite in A that dies or is cancelled: the sweep of B's reaper
// ends the dependents (dead, "dependency died: <id>") and releases those
// whose RunAfter has that end; the ends of A's items are found in A's
// ended ids.
func TestDependsAcrossQueuesDeathAndCancel(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"dead", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			qa := newQueue(t, pool, claim.Options{Queue: "da"})
			qb := newQueue(t, pool, claim.Options{Queue: "db"})
			s := startSession(t, ctx, pool)
			end := claim.PrereqDied
			if how == "cancelled" {
				end = claim.PrereqCancelled
			}
			p, anyway, plain, next := uuid.New(), uuid.New(), uuid.New(), uuid.New()
			if _, err := qa.Enqueue(ctx, claim.NewItem{ID: p, Payload: []byte("p")}); err != nil {
				t.Fatal(err)
			}
			in := []claim.Prereq{{Queue: "da", ID: p}}
			if _, err := qb.Enqueue(ctx, claim.NewItem{ID: anyway, Payload: []byte("a"), AfterIn: in, RunAfter: end},
				claim.NewItem{ID: plain, Payload: []byte("n"), AfterIn: in},
				claim.NewItem{ID: next, Payload: []byte("x"), After: []uuid.UUID{plain}}); err != nil {
				t.Fatal(err)
			}
			if how == "dead" {
				killOne(t, qa, s.ID(), p)
			} else if ok, err := cancelFound(qa.CancelItem(ctx, p, claim.CancelOptions{})); err != nil || !ok {
				t.Fatalf("CancelItem: %v, %v", ok, err)
			}
			st, err := queuemaint.For(qb).Reap(ctx)
			if err != nil || st.DependencyDead != 2 || st.Unblocked != 1 {
				t.Fatalf("B's reap: %+v, %v; want 2 dependency deaths (plain, next) and 1 released", st, err)
			}
			if got := claimEvery(t, qb, s.ID()); len(got) != 1 || got[0].ID != anyway {
				t.Fatalf("B claimed %d items, want the RunAfter one", len(got))
			}
			for _, id := range []uuid.UUID{plain, next} {
				if o := endedOutcome(t, pool, "db", id); o != "dead" {
					t.Fatalf("%s ended %q, want dead", id, o)
				}
			}
			dead, err := deadList(qb.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
			if err != nil {
				t.Fatal(err)
			}
			for _, di := range dead {
				if di.ID == plain && di.Reason != claim.ReasonDependencyDied+p.String() {
					t.Fatalf("the dependent died with reason %q", di.Reason)
				}
			}
			if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_across`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`) +
				countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting`); n != 0 {
				t.Fatalf("%d edges, hints or waiting rows left", n)
			}
		})
	}
}

// A dependent that ends because a prerequisite of its own queue died takes
// its edges from other queues with it (and their hints): none is left
// behind for the other queue's prerequisite, still queued, to find.
func TestDependsAcrossQueuesEdgesGoWithTheDependent(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "ga"})
	qb := newQueue(t, pool, claim.Options{Queue: "gb"})
	s := startSession(t, ctx, pool)
	a, b, dep := uuid.New(), uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Enqueue(ctx, claim.NewItem{ID: b, Payload: []byte("b")},
		claim.NewItem{ID: dep, Payload: []byte("d"), After: []uuid.UUID{b}, AfterIn: []claim.Prereq{{Queue: "ga", ID: a}}}); err != nil {
		t.Fatal(err)
	}
	killOne(t, qb, s.ID(), b)
	if st, err := queuemaint.For(qb).Reap(ctx); err != nil || st.DependencyDead != 1 {
		t.Fatalf("B's reap: %+v, %v; want the dependent dead", st, err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_across`) + countRows(t, pool, `SELECT count(*) FROM crdbwork_waits_for`); n != 0 {
		t.Fatalf("%d cross-queue edges or hints left after the dependent died", n)
	}
}
