package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// endedRow reads an item's row in crdbwork_ended.
func endedRow(t *testing.T, ctx context.Context, q *claim.Queue, id uuid.UUID) (outcome, by, reason string, running bool) {
	t.Helper()
	var b, r *string
	var w *bool
	err := q.DB().QueryRow(ctx, `SELECT outcome, cancel_by, cancel_reason, was_running FROM crdbwork_ended WHERE queue = $1 AND id = $2`,
		q.Name(), id).Scan(&outcome, &b, &r, &w)
	if err != nil {
		t.Fatalf("ended row of %s: %v", id, err)
	}
	if b != nil {
		by = *b
	}
	if r != nil {
		reason = *r
	}
	return outcome, by, reason, w != nil && *w
}

// A running item's cancel is a request: its ack (any version's: the
// statement is the same) commits nothing, claims skip it, its holder finds
// the request and ends it as cancelled, with who and why recorded, and
// its id stays a duplicate for the dedup window.
func TestCancelRunningItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids, err := q.Enqueue(ctx, payloads(2)...)
	if err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	it, other := got[0], got[1]
	if reqs, err := c.CancelRequests(ctx); err != nil || len(reqs) != 0 {
		t.Fatalf("cancel requests before any cancel: %v %v", reqs, err)
	}
	res, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "ops@host", Reason: "wrong input"})
	if err != nil || res != (claim.CancelResult{Found: true, Running: true}) {
		t.Fatalf("cancel of a running item: %+v %v", res, err)
	}
	again, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "someone else"})
	if err != nil || !again.AlreadyRequested || !again.Running {
		t.Fatalf("second cancel: %+v %v", again, err)
	}
	reqs, err := c.CancelRequests(ctx)
	if err != nil || len(reqs) != 1 || reqs[0].ID != it.ID || reqs[0].Token != it.Token ||
		reqs[0].Cause.By != "ops@host" || reqs[0].Cause.Reason != "wrong input" || !errors.Is(reqs[0].Cause, claim.ErrCancelled) {
		t.Fatalf("cancel requests: %+v %v", reqs, err)
	}
	// The running attempt's ack commits nothing, nor do its nack, snooze
	// or extension.
	if err := q.Ack(ctx, it, record(it)); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("ack of a cancelled item: %v, want ErrClaimLost", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Fatalf("%d results written by the ack of a cancelled item", n)
	}
	if _, err := q.Nack(ctx, it, errors.New("boom")); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("nack of a cancelled item: %v", err)
	}
	if _, err := q.Nack(ctx, it, claim.Snooze(0)); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("snooze of a cancelled item: %v", err)
	}
	if kept, err := c.Extend(ctx, []claim.Item{it}, time.Minute); err != nil || len(kept) != 0 {
		t.Fatalf("extension of a cancelled item: %v %v", kept, err)
	}
	// Released (its holder's session gone, say), no claim takes it.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET claim = NULL WHERE id = $1`, it.ID); err != nil {
		t.Fatal(err)
	}
	s2 := startSession(t, ctx, pool)
	if more, err := q.Claimer(s2.ID()).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(more) != 0 {
		t.Fatalf("a claim took %d items after the cancel request: %v", len(more), err)
	}
	// Put back as the holder's, it ends through its holder.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET claim = $2 WHERE id = $1`, it.ID, s.ID()); err != nil {
		t.Fatal(err)
	}
	if err := q.EndCancelled(ctx, other); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("EndCancelled of an item not cancelled: %v", err)
	}
	if err := q.EndCancelled(ctx, it); err != nil {
		t.Fatalf("EndCancelled: %v", err)
	}
	if err := q.EndCancelled(ctx, it); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("second EndCancelled: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it.ID); n != 0 {
		t.Fatal("the cancelled item is still in the items table")
	}
	if o, by, why, running := endedRow(t, ctx, q, it.ID); o != "cancelled" || by != "ops@host" || why != "wrong input" || !running {
		t.Fatalf("ended row: %q %q %q %v", o, by, why, running)
	}
	page, err := q.CancelledItems(ctx, claim.CancelledQuery{Limit: 10})
	list := page.Items
	if err != nil || page.Next != "" || len(list) != 1 || list[0].ID != it.ID || list[0].By != "ops@host" || !list[0].WasRunning || list[0].RequestedAt.IsZero() {
		t.Fatalf("Cancelled: %+v %v", list, err)
	}
	if o, err := q.WaitEnded(ctx, it.ID, 0); err != nil || o != "cancelled" {
		t.Fatalf("WaitEnded: %q %v", o, err)
	}
	// The other item is untouched and acks.
	if err := q.Ack(ctx, other, record(other)); err != nil {
		t.Fatal(err)
	}
	// Dedup keeps working: the cancelled id is a duplicate.
	dup, err := q.Enqueue(ctx, claim.NewItem{ID: ids.IDs[0], Payload: []byte("again")})
	if err != nil || dup.New[0] || !dup.Done[0] {
		t.Fatalf("enqueue of the cancelled id: %+v %v", dup, err)
	}
	if st := q.Stats(); st.Cancelled != 1 || st.CancelledRunning != 1 {
		t.Fatalf("stats: cancelled %d, running %d; want 1, 1", st.Cancelled, st.CancelledRunning)
	}
}

// An unclaimed item's cancel ends it at once, with who and why.
func TestCancelUnclaimedItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids, err := q.Enqueue(ctx, payloads(1)...)
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.CancelItem(ctx, ids.IDs[0], claim.CancelOptions{By: "me", Reason: "duplicate"})
	if err != nil || res != (claim.CancelResult{Found: true}) {
		t.Fatalf("cancel: %+v %v", res, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	if o, by, why, running := endedRow(t, ctx, q, ids.IDs[0]); o != "cancelled" || by != "me" || why != "duplicate" || running {
		t.Fatalf("ended row: %q %q %q %v", o, by, why, running)
	}
	if res, err := q.CancelItem(ctx, ids.IDs[0], claim.CancelOptions{}); err != nil || res.Found {
		t.Fatalf("cancel of a gone item: %+v %v", res, err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, uuid.New(), claim.CancelOptions{})); err != nil || ok {
		t.Fatalf("Cancel of an unknown id: %v %v", ok, err)
	}
}

// A cancel-requested item whose holder died (its session deleted, which
// releases the claim) or whose lease ran out ends as cancelled by Reap,
// never run again.
func TestReapEndsCancelledItemsOfDeadHolders(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// The hung holder's lease outlasts the first reap (an hour); the test
	// ends it afterwards, as its running out would.
	q := newQueue(t, pool, claim.Options{Lease: time.Hour})
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	dead, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	hung := startSession(t, ctx, pool)
	a, err := q.Claimer(dead).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(a) != 1 {
		t.Fatalf("claim: %v %v", a, err)
	}
	b, err := q.Claimer(hung.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(b) != 1 {
		t.Fatalf("claim: %v %v", b, err)
	}
	for _, it := range []claim.Item{a[0], b[0]} {
		if res, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "ops"}); err != nil || !res.Running {
			t.Fatalf("cancel: %+v %v", res, err)
		}
	}
	// The first holder dies: its session row goes, and its claim with it.
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.Cancelled != 1 || st.Released != 0 {
		t.Fatalf("first reap: %+v %v; want 1 cancelled, none released", st, err)
	}
	// The second holder hangs: its lease runs out, and the reaper ends it
	// rather than releasing it.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET lease_until = now() - INTERVAL '1 second' WHERE id = $1`, b[0].ID); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the reaper to end the hung holder's cancelled item once its lease ran out", func() (bool, string) {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n == 0 {
			return true, ""
		}
		st, err := queuemaint.For(q).Reap(ctx)
		if err != nil || st.Released != 0 {
			t.Fatalf("reap: %+v %v", st, err)
		}
		return false, fmt.Sprintf("still queued; the last reap: %+v", st)
	})
	for _, it := range []claim.Item{a[0], b[0]} {
		if o, by, _, running := endedRow(t, ctx, q, it.ID); o != "cancelled" || by != "ops" || !running {
			t.Fatalf("ended row of %s: %q %q %v", it.ID, o, by, running)
		}
	}
	if err := q.Ack(ctx, b[0], record(b[0])); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("late ack of the hung holder: %v", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Fatalf("%d results written", n)
	}
}

// A cancel racing the ack of the same item: exactly one wins, and the
// rows agree with it — acked with one result row, or cancelled (once
// ended) with none.
func TestCancelRacesAck(t *testing.T) {
	t.Parallel()
	const n = 60
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, payloads(n)...); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
	if err != nil || len(got) != n {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	acked := make([]bool, n)
	cancelled := make([]claim.CancelResult, n)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i, it := range got {
		wg.Add(2)
		go func() {
			defer wg.Done()
			err := q.Ack(ctx, it, record(it))
			switch {
			case err == nil:
				acked[i] = true
			case !errors.Is(err, claim.ErrClaimLost):
				errs <- err
			}
		}()
		go func() {
			defer wg.Done()
			res, err := q.CancelItem(ctx, it.ID, claim.CancelOptions{By: "racer"})
			if err != nil {
				errs <- err
			}
			cancelled[i] = res
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	wins := 0
	for i, it := range got {
		results := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, it.ID)
		switch {
		case acked[i] && cancelled[i].Found:
			t.Fatalf("item %d: acked and its cancel found it running", i)
		case acked[i]:
			if o, _, _, _ := endedRow(t, ctx, q, it.ID); o != "acked" || results != 1 {
				t.Fatalf("acked item %d: outcome %q, %d results", i, o, results)
			}
		case cancelled[i].Running:
			wins++
			if results != 0 {
				t.Fatalf("cancelled item %d has %d results", i, results)
			}
			if err := q.EndCancelled(ctx, it); err != nil {
				t.Fatalf("ending cancelled item %d: %v", i, err)
			}
			if o, by, _, _ := endedRow(t, ctx, q, it.ID); o != "cancelled" || by != "racer" {
				t.Fatalf("cancelled item %d: outcome %q by %q", i, o, by)
			}
		default:
			t.Fatalf("item %d: neither acked nor cancelled: %+v", i, cancelled[i])
		}
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 {
		t.Fatalf("%d items left", left)
	}
	t.Logf("%d of %d items cancelled, %d acked", wins, n, n-wins)
}

// A snooze hands the item back without spending an attempt, delays it,
// counts it, and the snooze past MaxSnoozes kills the item.
func TestSnooze(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{MaxSnoozes: 2})
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := ids.IDs[0]
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	claimOne := func() claim.Item {
		t.Helper()
		got, err := c.Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %v %v", got, err)
		}
		return got[0]
	}
	it := claimOne()
	// On its last attempt (MaxAttempts 1), a snooze does not kill it.
	if out, err := q.Nack(ctx, it, claim.Snooze(time.Hour)); err != nil || out != claim.Snoozed {
		t.Fatalf("snooze: %v %v", out, err)
	}
	var attempts, snoozes int
	var delayed bool
	if err := pool.QueryRow(ctx, `SELECT attempts, snoozes, vesting_at > now() + INTERVAL '50 minutes' FROM crdbwork_items WHERE id = $1`, id).
		Scan(&attempts, &snoozes, &delayed); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 || snoozes != 1 || !delayed {
		t.Fatalf("after a snooze: attempts %d, snoozes %d, delayed %v; want 0, 1, true", attempts, snoozes, delayed)
	}
	if got, err := c.Claim(ctx, claim.ClaimRequest{Max: 1}); err != nil || len(got) != 0 {
		t.Fatalf("a snoozed item was claimed before its delay: %v %v", got, err)
	}
	if info, err := q.Inspect(ctx); err != nil || info.Snoozed != 1 {
		t.Fatalf("counts: %+v %v", info, err)
	}
	// Due again at once, snoozed once more through Queue.Snooze.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET vesting_at = now(), turn_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	it = claimOne()
	if it.Attempt != 1 {
		t.Fatalf("attempt after a snooze: %d, want 1", it.Attempt)
	}
	if out, err := q.Snooze(ctx, it, 0); err != nil || out != claim.Snoozed {
		t.Fatalf("second snooze: %v %v", out, err)
	}
	if out, err := q.Snooze(ctx, it, 0); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("snooze of a released claim: %v %v", out, err)
	}
	// The third snooze is one too many.
	it = claimOne()
	if out, err := q.Nack(ctx, it, errors.Join(errors.New("not ready"), claim.Snooze(time.Second))); err != nil || out != claim.Dead {
		t.Fatalf("snooze past the bound: %v %v", out, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != id || dead[0].Reason != claim.ReasonSnoozedTooOften {
		t.Fatalf("dead items: %+v %v", dead, err)
	}
	if st := q.Stats(); st.Snoozed != 2 || st.Dead != 1 || st.Nacked != 0 {
		t.Fatalf("stats: %+v", st)
	}
	if _, err := claim.New(pool, claim.Options{MaxSnoozes: -2}); err == nil {
		t.Fatal("a negative MaxSnoozes was accepted")
	}
}

// Unlimited snoozes: a queue with MaxSnoozes UnlimitedSnoozes snoozes an
// item past DefaultMaxSnoozes and never kills it; on a bounded queue, a
// SnoozeUnlimited snooze is not counted against the bound (the item stays),
// while a bounded snooze after it still is.
func TestSnoozeUnlimited(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	snoozeN := func(q *claim.Queue, id uuid.UUID, n int, cause func() error) {
		t.Helper()
		c := q.Claimer(s.ID())
		for i := 0; i < n; i++ {
			got, err := c.Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil || len(got) != 1 || got[0].ID != id {
				t.Fatalf("claim %d: %v %v", i, got, err)
			}
			if out, err := q.Nack(ctx, got[0], cause()); err != nil || out != claim.Snoozed {
				t.Fatalf("snooze %d of %d: %v %v", i+1, n, out, err)
			}
		}
		var snoozes int
		if err := pool.QueryRow(ctx, `SELECT snoozes FROM crdbwork_items WHERE id = $1`, id).Scan(&snoozes); err != nil {
			t.Fatalf("the item after %d snoozes: %v", n, err)
		}
		if snoozes < n {
			t.Fatalf("snoozes %d, want at least %d", snoozes, n)
		}
	}
	// A queue without a bound.
	q := newQueue(t, pool, claim.Options{Queue: "unbounded", MaxSnoozes: claim.UnlimitedSnoozes})
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	snoozeN(q, enq.IDs[0], claim.DefaultMaxSnoozes+1, func() error { return claim.Snooze(0) })

	// A bounded queue, snoozes unlimited one by one.
	b := newQueue(t, pool, claim.Options{Queue: "bounded", MaxSnoozes: 2})
	enq, err = b.Enqueue(ctx, claim.NewItem{Payload: []byte("y"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := enq.IDs[0]
	snoozeN(b, id, 5, func() error { return fmt.Errorf("waiting for the export: %w", claim.SnoozeUnlimited(0)) })
	it, err := b.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(it) != 1 {
		t.Fatalf("claim: %v %v", it, err)
	}
	if out, err := b.Nack(ctx, it[0], claim.SnoozeUnlimited(0)); err != nil || out != claim.Snoozed {
		t.Fatalf("Nack with SnoozeUnlimited: %v %v", out, err)
	}
	it, err = b.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(it) != 1 {
		t.Fatalf("claim: %v %v", it, err)
	}
	if out, err := b.Snooze(ctx, it[0], 0); err != nil || out != claim.Dead {
		t.Fatalf("a bounded snooze after 6 unlimited ones on a queue of MaxSnoozes 2: %v %v, want dead", out, err)
	}
	dead, err := deadList(b.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != id || dead[0].Reason != claim.ReasonSnoozedTooOften {
		t.Fatalf("dead items: %+v %v", dead, err)
	}
	if dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})); err != nil || len(dead) != 0 {
		t.Fatalf("dead items of the unbounded queue: %+v %v", dead, err)
	}
}
