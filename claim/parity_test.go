package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// endedOutcome returns the outcome recorded for id in q's ended ids ("" if
// none).
func endedOutcome(t *testing.T, pool *pgxpool.Pool, queue string, id uuid.UUID) string {
	t.Helper()
	var out string
	err := pool.QueryRow(context.Background(),
		`SELECT COALESCE((SELECT outcome FROM crdbwork_ended WHERE queue = $1 AND id = $2), '')`, queue, id).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// killOne claims every claimable item of q and nacks the one with id
// permanently (it dies), acking the others; it fails unless id was among
// them.
func killOne(t *testing.T, q *claim.Queue, session uuid.UUID, id uuid.UUID) {
	t.Helper()
	found := false
	for _, it := range claimEvery(t, q, session) {
		if it.ID != id {
			ackAll(t, q, []claim.Item{it})
			continue
		}
		found = true
		if _, err := q.Nack(context.Background(), it, claim.Permanent(errors.New("boom"))); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("item %s was not claimable", id)
	}
}

// Unique states: the set chooses which ends of an earlier item of the key
// keep a new one out; live items always do; the default is every state.
// Each end (acked, dead, cancelled) is tried against a set that blocks it
// and one that does not.
func TestUniqueStates(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "unique-states"
	q := newQueue(t, pool, claim.Options{Queue: queue})
	s := startSession(t, ctx, pool)

	// Refusals, before anything is written.
	for _, bad := range []claim.NewItem{
		{UniqueStates: claim.UniqueLive, Payload: []byte("x")},                        // no key
		{UniqueKey: "k", UniqueStates: claim.UniqueAcked, Payload: []byte("x")},       // live left out
		{UniqueKey: "k", UniqueStates: claim.UniqueAll << 1, Payload: []byte("x")},    // unknown states
		{UniqueKey: "k", UniqueStates: claim.UniqueLive | 0x80, Payload: []byte("x")}, // unknown states
	} {
		if _, err := q.Enqueue(ctx, bad); err == nil {
			t.Fatalf("UniqueStates %v (key %q) was accepted", bad.UniqueStates, bad.UniqueKey)
		}
	}

	ends := []struct {
		name  string
		state claim.UniqueStates
		end   func(id uuid.UUID)
	}{
		{"acked", claim.UniqueAcked, func(id uuid.UUID) { ackAll(t, q, claimEvery(t, q, s.ID())) }},
		{"dead", claim.UniqueDead, func(id uuid.UUID) { killOne(t, q, s.ID(), id) }},
		{"cancelled", claim.UniqueCancelled, func(id uuid.UUID) {
			if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{By: "test"})); err != nil || !ok {
				t.Fatalf("CancelItem: %v, %v", ok, err)
			}
		}},
	}
	for _, e := range ends {
		for _, set := range []claim.UniqueStates{0, claim.UniqueAll, claim.UniqueLive, claim.UniqueAll &^ e.state, claim.UniqueLive | e.state} {
			blocks := set == 0 || set&e.state != 0
			item := claim.NewItem{UniqueKey: fmt.Sprintf("%s/%d", e.name, set), UniqueStates: set, Payload: []byte("x")}
			first, err := q.Enqueue(ctx, item)
			if err != nil || !first.New[0] {
				t.Fatalf("%s, %v: first enqueue: %+v, %v", e.name, set, first, err)
			}
			id := first.IDs[0]
			// Live: always a duplicate.
			if again, err := q.Enqueue(ctx, item); err != nil || again.New[0] || again.Done[0] {
				t.Fatalf("%s, %v: enqueue while queued: %+v, %v; want a live duplicate", e.name, set, again, err)
			}
			e.end(id)
			if got := endedOutcome(t, pool, queue, id); got != e.name {
				t.Fatalf("%s, %v: the ended record says %q", e.name, set, got)
			}
			again, err := q.Enqueue(ctx, item)
			switch {
			case err != nil:
				t.Fatal(err)
			case again.IDs[0] != id:
				t.Fatalf("%s, %v: the id changed", e.name, set)
			case blocks && (again.New[0] || !again.Done[0]):
				t.Fatalf("%s, %v: enqueue after the end: %+v; want done, not added", e.name, set, again)
			case !blocks && (!again.New[0] || again.Done[0]):
				t.Fatalf("%s, %v: enqueue after the end: %+v; want added again", e.name, set, again)
			}
			if blocks {
				continue
			}
			// Added again: live once more, its ended record gone, so that
			// its next end is recorded afresh (and a requeue of a
			// cancelled record cannot bring back a second copy).
			if got := endedOutcome(t, pool, queue, id); got != "" {
				t.Fatalf("%s, %v: added again, the ended record %q is still there", e.name, set, got)
			}
			if info, err := q.Item(ctx, id); err != nil || info.Claimed || info.State != claim.StateQueued {
				t.Fatalf("%s, %v: the item added again: %+v, %v; want queued", e.name, set, info, err)
			}
			ackAll(t, q, claimEvery(t, q, s.ID()))
			if got := endedOutcome(t, pool, queue, id); got != "acked" {
				t.Fatalf("%s, %v: after the second run's ack the ended record says %q", e.name, set, got)
			}
		}
	}
}

// A waiting item (NewItem.After) with a unique key: while it waits a new
// one is a duplicate; once it ran, UniqueLive alone adds it again (as a
// waiting item if its prerequisite is live, claimable at once if it was
// acked), where the default reports it done.
func TestUniqueStatesWaiting(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "unique-waiting"})
	s := startSession(t, ctx, pool)
	prereq := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: prereq, Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	again := claim.NewItem{UniqueKey: "again", UniqueStates: claim.UniqueLive, After: []uuid.UUID{prereq}, Payload: []byte("d")}
	once := claim.NewItem{UniqueKey: "once", After: []uuid.UUID{prereq}, Payload: []byte("d")}
	res, err := q.Enqueue(ctx, again, once)
	if err != nil || !res.New[0] || !res.New[1] || !res.Waiting[0] || !res.Waiting[1] {
		t.Fatalf("enqueue: %+v, %v; want two waiting items", res, err)
	}
	if dup, err := q.Enqueue(ctx, again, once); err != nil || dup.New[0] || dup.New[1] || dup.Done[0] || dup.Done[1] {
		t.Fatalf("enqueue while waiting: %+v, %v; want live duplicates", dup, err)
	}
	ackAll(t, q, claimEvery(t, q, s.ID())) // the prerequisite
	var ran []claim.Item
	await.Until(t, "both dependents released and acked", func() (bool, string) {
		got := claimEvery(t, q, s.ID())
		ackAll(t, q, got)
		ran = append(ran, got...)
		return len(ran) == 2, fmt.Sprintf("%d of 2", len(ran))
	})
	res, err = q.Enqueue(ctx, again, once)
	switch {
	case err != nil:
		t.Fatal(err)
	case !res.New[0] || res.Done[0] || res.Waiting[0]:
		t.Fatalf("UniqueLive after its run: %+v; want added, claimable (its prerequisite was acked)", res)
	case res.New[1] || !res.Done[1]:
		t.Fatalf("the default after its run: %+v; want done", res)
	}
	if got := claimEvery(t, q, s.ID()); len(got) != 1 || got[0].ID != res.IDs[0] {
		t.Fatalf("claimed %d items; want the one added again", len(got))
	}
}

// Concurrent producers of one key with UniqueLive, each with its own pool
// (as separate processes would be), while a consumer acks: at no time are
// two items of the key live (one id), every enqueue that said New ran
// exactly once, and the key ran more than once (after each end it can run
// again) — with the default states it would run once.
func TestUniqueLiveConcurrentProducers(t *testing.T) {
	t.Parallel()
	url := setupURL(t)
	ctx := context.Background()
	const queue, producers, rounds = "unique-race", 6, 40
	open := func() *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	main := open()
	q := newQueue(t, main, claim.Options{Queue: queue})
	s := startSession(t, ctx, main)

	var wg sync.WaitGroup
	added := make([]int, producers)
	errs := make(chan error, producers)
	stop := make(chan struct{})
	for p := 0; p < producers; p++ {
		pq := newQueue(t, open(), claim.Options{Queue: queue})
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				res, err := pq.Enqueue(ctx, claim.NewItem{UniqueKey: "sync", UniqueStates: claim.UniqueLive, Payload: []byte(fmt.Sprint(p))})
				if err != nil {
					errs <- err
					return
				}
				if res.New[0] {
					added[p]++
				}
			}
		}(p)
	}
	consumed := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) > 1 {
			t.Fatalf("one claim handed out %d items of one unique key", len(items))
		}
		ackAll(t, q, items)
		consumed += len(items)
	}
	close(stop)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// What is left (at most one item).
	rest := claimEvery(t, q, s.ID())
	if len(rest) > 1 {
		t.Fatalf("%d items of one unique key left", len(rest))
	}
	ackAll(t, q, rest)
	consumed += len(rest)
	total := 0
	for _, n := range added {
		total += n
	}
	if total != consumed {
		t.Fatalf("producers were told %d items were added; %d ran", total, consumed)
	}
	if consumed < 2 {
		t.Fatalf("the key ran %d times; want it to run again after it was done", consumed)
	}
	t.Logf("%d enqueues by %d producers added %d runs", producers*rounds, producers, consumed)
}

// Dependency options: a dependent with RunAfter runs after a prerequisite
// that died or was cancelled, as if it had been acked; one without dies, as
// before; a prerequisite already dead at the enqueue satisfies a RunAfter
// item and refuses the others.
func TestDependsRunAfter(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"dead", "cancelled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{Queue: "run-after"})
			s := startSession(t, ctx, pool)
			end := claim.PrereqDied
			other := claim.PrereqCancelled
			if how == "cancelled" {
				end, other = other, end
			}
			if _, err := q.Enqueue(ctx, claim.NewItem{RunAfter: end, Payload: []byte("x")}); err == nil {
				t.Fatal("RunAfter without After was accepted")
			}
			p, healthy := uuid.New(), uuid.New()
			anyway, both, wrong, plain := uuid.New(), uuid.New(), uuid.New(), uuid.New()
			after := []uuid.UUID{p, healthy}
			if _, err := q.Enqueue(ctx,
				claim.NewItem{ID: p, Payload: []byte("p")},
				claim.NewItem{ID: healthy, Payload: []byte("h")},
				claim.NewItem{ID: anyway, After: after, RunAfter: end, Payload: []byte("a")},
				claim.NewItem{ID: both, After: after, RunAfter: claim.PrereqDied | claim.PrereqCancelled, Payload: []byte("b")},
				claim.NewItem{ID: wrong, After: after, RunAfter: other, Payload: []byte("w")},
				claim.NewItem{ID: plain, After: after, Payload: []byte("n")},
			); err != nil {
				t.Fatal(err)
			}
			if how == "dead" {
				killOne(t, q, s.ID(), p) // acks the healthy one
			} else {
				if ok, err := cancelFound(q.CancelItem(ctx, p, claim.CancelOptions{})); err != nil || !ok {
					t.Fatalf("CancelItem: %v, %v", ok, err)
				}
				ackAll(t, q, claimEvery(t, q, s.ID())) // the healthy one
			}
			st, err := queuemaint.For(q).Reap(ctx)
			if err != nil || st.DependencyDead != 2 || st.Unblocked != 2 {
				t.Fatalf("Reap: %+v, %v; want 2 dependency deaths (wrong, plain) and 2 released (anyway, both)", st, err)
			}
			got := map[uuid.UUID]bool{}
			for _, it := range claimEvery(t, q, s.ID()) {
				got[it.ID] = true
			}
			if len(got) != 2 || !got[anyway] || !got[both] {
				t.Fatalf("claimable after the reap: %v; want anyway %s and both %s", got, anyway, both)
			}
			for _, id := range []uuid.UUID{wrong, plain} {
				if o := endedOutcome(t, pool, "run-after", id); o != "dead" {
					t.Fatalf("dependent %s ended %q; want dead", id, o)
				}
			}

			// At the enqueue: the prerequisite has ended already.
			res, err := q.Enqueue(ctx, claim.NewItem{After: []uuid.UUID{p}, RunAfter: end, Payload: []byte("late")})
			if err != nil || !res.New[0] || res.Waiting[0] {
				t.Fatalf("RunAfter enqueue after the end: %+v, %v; want added, claimable", res, err)
			}
			if _, err := q.Enqueue(ctx, claim.NewItem{After: []uuid.UUID{p}, RunAfter: other, Payload: []byte("late")}); !errors.Is(err, claim.ErrPrerequisiteDied) {
				t.Fatalf("enqueue with the other RunAfter after the end: %v; want ErrPrerequisiteDied", err)
			}
		})
	}
}

// Cancelled items are kept for a requeue: an unclaimed one's cancel and a
// claimed one's (ended by its handler's EndCancelled) keep the item; a
// requeue by id moves it back whole (payload, key, tenant, priority,
// headers, metadata; fresh attempts, a claim token not below its last),
// deletes its ended record (an enqueue of the id is then a live duplicate,
// not done), and a second requeue finds nothing kept; All requeues every
// kept one. A cancelled id that ran again since (UniqueStates) is live,
// then not kept. The queue's dedup window bounds how long they are kept.
func TestRequeueCancelled(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "requeue-cancelled"
	q := newQueue(t, pool, claim.Options{Queue: queue})
	s := startSession(t, ctx, pool)
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	whole := claim.NewItem{ID: a, Payload: []byte("a"), Metadata: []byte("m"), Key: "k", Tenant: "t", Priority: 3,
		MaxAttempts: 7, Headers: map[string]string{"traceparent": "00-1-2-01"}}
	if _, err := q.Enqueue(ctx, whole, claim.NewItem{ID: b, Payload: []byte("b"), Priority: 1}, claim.NewItem{ID: c, Payload: []byte("c"), Priority: 2}); err != nil {
		t.Fatal(err)
	}
	// b is claimed (the first in priority order), then cancelled while it runs.
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 || got[0].ID != b {
		t.Fatalf("claim: %v, %v; want b", got, err)
	}
	if r, err := q.CancelItem(ctx, b, claim.CancelOptions{By: "ops"}); err != nil || !r.Running {
		t.Fatalf("cancel of the running item: %+v, %v", r, err)
	}
	if err := q.EndCancelled(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{a, c} {
		if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{By: "ops"})); err != nil || !ok {
			t.Fatalf("cancel: %v, %v", ok, err)
		}
	}
	var tokenBefore int64
	if err := pool.QueryRow(ctx, `SELECT claim_token FROM crdbwork_cancelled_items WHERE queue = $1 AND id = $2`, queue, b).Scan(&tokenBefore); err != nil || tokenBefore < 1 {
		t.Fatalf("b's kept claim token: %d, %v; want at least 1", tokenBefore, err)
	}

	// Refusals.
	for _, o := range []claim.RequeueOptions{{Cancelled: true}, {Cancelled: true, ID: a, All: true},
		{Cancelled: true, ID: a, Death: uuid.New()}, {Cancelled: true, Filter: claim.DeadFilter{Reason: "x"}}} {
		if _, err := q.Requeue(ctx, o); err == nil {
			t.Fatalf("Requeue %+v was accepted", o)
		}
	}

	if r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: a}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue of a: %+v, %v", r, err)
	}
	if o := endedOutcome(t, pool, queue, a); o != "" {
		t.Fatalf("a requeued: its ended record %q is still there", o)
	}
	if res, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("again")}); err != nil || res.New[0] || res.Done[0] {
		t.Fatalf("enqueue of a requeued id: %+v, %v; want a live duplicate", res, err)
	}
	if _, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: a}); !errors.Is(err, claim.ErrItemLive) {
		t.Fatalf("second requeue of a: %v; want ErrItemLive", err)
	}
	items := claimEvery(t, q, s.ID())
	if len(items) != 1 || items[0].ID != a {
		t.Fatalf("claimable: %v; want a", items)
	}
	it := items[0]
	if string(it.Payload) != "a" || string(it.Metadata) != "m" || it.Key != "k" || it.Tenant != "t" || it.Priority != 3 ||
		it.MaxAttempts != 7 || it.Attempt != 1 || it.Headers["traceparent"] != "00-1-2-01" {
		t.Fatalf("a requeued: %+v; want it whole, at its first attempt", it)
	}
	ackAll(t, q, items)
	if _, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: a}); !errors.Is(err, claim.ErrNotKept) {
		t.Fatalf("requeue of a after it ran: %v; want ErrNotKept", err)
	}

	// All: b and c.
	r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, All: true})
	if err != nil || r.Requeued != 2 {
		t.Fatalf("requeue of all: %+v, %v; want 2", r, err)
	}
	items = claimEvery(t, q, s.ID())
	if len(items) != 2 {
		t.Fatalf("claimable after requeue of all: %d; want 2", len(items))
	}
	for _, it := range items {
		if it.ID == b && it.Token <= tokenBefore {
			t.Fatalf("b's claim token %d after its requeue; want above %d", it.Token, tokenBefore)
		}
	}
	ackAll(t, q, items)

	// A unique item cancelled, then enqueued again (its states let it):
	// the kept copy is live, then, once the new one ran, not kept.
	u := claim.NewItem{UniqueKey: "u", UniqueStates: claim.UniqueLive, Payload: []byte("u")}
	res, err := q.Enqueue(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, res.IDs[0], claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	if res, err = q.Enqueue(ctx, u); err != nil || !res.New[0] {
		t.Fatalf("enqueue again: %+v, %v", res, err)
	}
	if _, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: res.IDs[0]}); !errors.Is(err, claim.ErrItemLive) {
		t.Fatalf("requeue of a cancelled id enqueued again: %v; want ErrItemLive", err)
	}
	ackAll(t, q, claimEvery(t, q, s.ID()))
	if r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, All: true}); err != nil || r.Requeued != 0 || r.Gone != 1 {
		t.Fatalf("requeue of all after the unique item ran: %+v, %v; want its stale copy gone", r, err)
	}

	// Kept for the dedup window: pruned with the ended ids.
	d := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: d, Payload: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, d, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupWindow: time.Microsecond}}); err != nil {
		t.Fatal(err)
	}
	if _, err := queuemaint.For(q).PruneEnded(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_cancelled_items WHERE queue = 'requeue-cancelled'`); n != 0 {
		t.Fatalf("%d cancelled items kept past the dedup window", n)
	}
}
