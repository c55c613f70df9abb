package claim_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// claimThis claims the item id of q (the only one due) for session.
func claimThis(t *testing.T, q *claim.Queue, session, id uuid.UUID) claim.Item {
	t.Helper()
	var got claim.Item
	await.Until(t, "the item to be due and claimed", func() (bool, string) {
		items, err := q.Claimer(session).Claim(context.Background(), claim.ClaimRequest{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 0 {
			return false, "nothing claimed"
		}
		if items[0].ID != id {
			t.Fatalf("claimed %s, want %s", items[0].ID, id)
		}
		got = items[0]
		return true, ""
	})
	return got
}

// outcomes lists the outcomes of an item's history.
func outcomes(h []claim.Attempt) []claim.AttemptOutcome {
	out := make([]claim.AttemptOutcome, len(h))
	for i, a := range h {
		out[i] = a.Outcome
	}
	return out
}

func sameOutcomes(h []claim.Attempt, want ...claim.AttemptOutcome) bool {
	got := outcomes(h)
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// History survives the item's moves: a dead item keeps its failures, and
// requeued keeps them behind a requeue marker, its new attempts counted
// from one; a cancelled item keeps its failures, in its ended record and
// in the kept copy a requeue brings back; an ended record written by code
// older than schema version 6 reads as "no history recorded".
func TestItemHistoryThroughMoves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t)
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "moves", BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})

	// Dead, then requeued, then acked.
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("d"), MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	for i := 1; i <= 2; i++ {
		it := claimThis(t, q, s.ID(), id)
		if _, err := q.Nack(ctx, it, fmt.Errorf("failure %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	it, err := q.Item(ctx, id)
	if err != nil || it.State != claim.StateDead || !sameOutcomes(it.History, claim.AttemptFailed, claim.AttemptDead) ||
		it.History[0].Error != "failure 1" || it.History[1].Error != "failure 2" || it.History[1].Session != s.ID() {
		t.Fatalf("the dead item: %+v, %v", it, err)
	}
	if r, err := q.Requeue(ctx, claim.RequeueOptions{ID: id}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue: %+v, %v", r, err)
	}
	it, err = q.Item(ctx, id)
	if err != nil || it.State != claim.StateQueued || !sameOutcomes(it.History, claim.AttemptFailed, claim.AttemptDead, claim.AttemptRequeued) ||
		it.History[2].From != "dead" {
		t.Fatalf("the requeued item: %+v, %v", it, err)
	}
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), id)})
	it, err = q.Item(ctx, id)
	if err != nil || it.State != claim.StateAcked || it.Attempts != 1 ||
		!sameOutcomes(it.History, claim.AttemptFailed, claim.AttemptDead, claim.AttemptRequeued, claim.AttemptSucceeded) ||
		it.History[3].Number != 1 || it.History[3].Run != 1 || it.History[3].Session != s.ID() {
		t.Fatalf("the acked item: %+v, %v", it, err)
	}

	// Failed once, cancelled while it waits for its retry, requeued.
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	id = res.IDs[0]
	if _, err := q.Nack(ctx, claimThis(t, q, s.ID(), id), claim.RetryAfter(time.Hour, errors.New("upstream down"))); err != nil {
		t.Fatal(err)
	}
	if it, err := q.Item(ctx, id); err != nil || it.State != claim.StateDelayed || !sameOutcomes(it.History, claim.AttemptFailed) {
		t.Fatalf("the item nacked for an hour: %+v, %v", it, err)
	}
	if r, err := q.CancelItem(ctx, id, claim.CancelOptions{By: "ops", Reason: "stale"}); err != nil || !r.Found {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	it, err = q.Item(ctx, id)
	if err != nil || it.State != claim.StateCancelled || it.Reason != "stale" || !sameOutcomes(it.History, claim.AttemptFailed) ||
		it.History[0].Error != "upstream down" || it.LastError != "upstream down" {
		t.Fatalf("the cancelled item: %+v, %v", it, err)
	}
	if r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: id}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue of the cancelled item: %+v, %v", r, err)
	}
	it, err = q.Item(ctx, id)
	if err != nil || it.State != claim.StateQueued || !sameOutcomes(it.History, claim.AttemptFailed, claim.AttemptRequeued) || it.History[1].From != "cancelled" {
		t.Fatalf("the requeued cancelled item: %+v, %v", it, err)
	}
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), id)})

	// A cancel of a running item whose worker is gone: the reaper ends
	// it, its last attempt cancelled.
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("r")})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	running := claimThis(t, q, gone, res.IDs[0])
	if r, err := q.CancelItem(ctx, running.ID, claim.CancelOptions{By: "ops"}); err != nil || !r.Running {
		t.Fatalf("cancel of the running item: %+v, %v", r, err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := queuemaint.For(q).Reap(ctx); err != nil {
		t.Fatal(err)
	}
	it, err = q.Item(ctx, running.ID)
	if err != nil || it.State != claim.StateCancelled || !sameOutcomes(it.History, claim.AttemptCancelled) || it.History[0].StartedAt.IsZero() {
		t.Fatalf("the running item cancelled: %+v, %v", it, err)
	}

	// A dead item whose dead row was deleted (pruned, purged): its ended
	// record still says dead, with its history.
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("p"), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Nack(ctx, claimThis(t, q, s.ID(), res.IDs[0]), errors.New("once")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_dead_items WHERE id = $1`, res.IDs[0]); err != nil {
		t.Fatal(err)
	}
	it, err = q.Item(ctx, res.IDs[0])
	if err != nil || it.State != claim.StateDead || !sameOutcomes(it.History, claim.AttemptDead) || it.History[0].Error != "once" {
		t.Fatalf("a dead item without its dead row: %+v, %v", it, err)
	}

	// An old ended record: no history.
	old := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('moves', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	if it, err := q.Item(ctx, old); err != nil || it.State != claim.StateAcked || it.HistoryRecorded || len(it.History) != 0 {
		t.Fatalf("an ended record of older code: %+v, %v; want acked, no history recorded", it, err)
	}
	if _, err := q.Item(ctx, uuid.New()); !errors.Is(err, claim.ErrItemNotFound) {
		t.Fatalf("an unknown id: %v", err)
	}
}

// An item's errors are bounded: the last claim.HistoryMaxEntries attempts,
// each error cut to claim.HistoryMaxError characters with a marker.
func TestItemHistoryBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t)
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "bounds", BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), MaxAttempts: 100})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	long := make([]byte, 10_000)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	n := claim.HistoryMaxEntries + 5
	for i := 1; i <= n; i++ {
		msg := fmt.Sprintf("failure %d", i)
		if i == n {
			msg = string(long)
		}
		if _, err := q.Nack(ctx, claimThis(t, q, s.ID(), id), errors.New(msg)); err != nil {
			t.Fatal(err)
		}
	}
	it, err := q.Item(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	h := it.History
	if len(h) != claim.HistoryMaxEntries || !it.HistoryOmitted || h[0].Number != 6 || h[0].Error != "failure 6" || h[len(h)-1].Number != int64(n) {
		t.Fatalf("%d entries (omitted %v), first %+v", len(h), it.HistoryOmitted, h[0])
	}
	last := h[len(h)-1].Error
	// (Nack stores at most claim.MaxErrorText bytes of it: 8190 characters.)
	if want := string(long[:claim.HistoryMaxError]) + " …[cut: 8190 characters in all]"; last != want {
		t.Fatalf("the long error kept as %d characters ending %q", len(last), last[max(0, len(last)-60):])
	}
}

// Ended records stay for the longer of the dedup and history windows: a
// record older than the dedup window but within the history window stays
// (and the item reads as acked), one older than both leaves with the next
// reap.
func TestItemHistoryWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t)
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "window"})
	p, err := q.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Policy.DedupWindow = time.Hour
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &p.Policy, Retention: &claim.Retention{HistoryWindow: 3 * time.Hour}}); err != nil {
		t.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("w")})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), id)})
	age := func(d time.Duration) {
		if _, err := pool.Exec(ctx, `UPDATE crdbwork_ended SET ended_at = now() - $2::BIGINT * INTERVAL '1 second' WHERE id = $1`, id, int64(d.Seconds())); err != nil {
			t.Fatal(err)
		}
		if _, err := queuemaint.For(q).Reap(ctx); err != nil {
			t.Fatal(err)
		}
	}
	age(2 * time.Hour)
	if it, err := q.Item(ctx, id); err != nil || it.State != claim.StateAcked || !sameOutcomes(it.History, claim.AttemptSucceeded) {
		t.Fatalf("two hours after its ack (dedup window 1h, history 3h): %+v, %v; want acked", it, err)
	}
	// Its dedup window passed: the id may be enqueued again.
	if r, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("w")}); err != nil || !r.New[0] {
		t.Fatalf("an enqueue after the dedup window: %+v, %v; want new", r, err)
	}
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), id)})
	age(4 * time.Hour)
	if _, err := q.Item(ctx, id); !errors.Is(err, claim.ErrItemNotFound) {
		t.Fatalf("four hours after its ack: %v; want ErrItemNotFound", err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_ended`); n != 0 {
		t.Fatalf("%d ended records left", n)
	}
	// With the dedup window off, a queue keeps no ended records at all
	// (an id ended then is never taken for a duplicate later), whatever
	// its history window.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("off")})
	if err != nil {
		t.Fatal(err)
	}
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), res.IDs[0])})
	if _, err := q.Item(ctx, res.IDs[0]); !errors.Is(err, claim.ErrItemNotFound) {
		t.Fatalf("an item acked with the dedup window off: %v; want ErrItemNotFound", err)
	}
}

// List pages by keyset: while another goroutine enqueues, paging through
// the queued items from the first page to the last lists every item that
// was there before exactly once, and no item twice; the dead, acked and
// waiting lists page the same way; filters and bad queries.
func TestItemListPaging(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t)
	q := newQueue(t, pool, claim.Options{Queue: "list"})
	var before []claim.NewItem
	for i := range 300 {
		before = append(before, claim.NewItem{Payload: []byte{byte(i)}, Priority: i % 3, Key: fmt.Sprintf("k%d", i%4)})
	}
	res, err := q.Enqueue(ctx, before...)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	added := 0
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("new"), Priority: added % 3}, claim.NewItem{Payload: []byte("new"), Priority: 5}); err != nil {
				t.Error(err)
				return
			}
			added += 2
		}
	}()
	seen := map[uuid.UUID]int{}
	pages := 0
	var lq = claim.ItemQuery{State: claim.StateQueued, Limit: 7}
	for {
		page, err := q.Items(ctx, lq)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, it := range page.Items {
			seen[it.ID]++
			if it.State != claim.StateQueued {
				t.Fatalf("a queued item listed as %s", it.State)
			}
		}
		if page.Next == "" {
			break
		}
		lq.After = page.Next
	}
	close(stop)
	wg.Wait()
	for id, n := range seen {
		if n != 1 {
			t.Errorf("item %s listed %d times", id, n)
		}
	}
	for _, id := range res.IDs {
		if seen[id] != 1 {
			t.Errorf("item %s there throughout listed %d times", id, seen[id])
		}
	}
	t.Logf("%d pages, %d items listed, %d enqueued meanwhile", pages, len(seen), added)
	if added == 0 {
		t.Log("nothing was enqueued while the list paged (a quick machine)")
	}

	// A key filter; a kind filter.
	page, err := q.Items(ctx, claim.ItemQuery{State: claim.StateQueued, Key: "k1", Limit: 1000})
	if err != nil || len(page.Items) != 75 {
		t.Fatalf("key k1: %d items, %v; want 75", len(page.Items), err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Kind: "email", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	page, err = q.Items(ctx, claim.ItemQuery{State: claim.StateQueued, Kind: "email", Limit: 1000})
	if err != nil || len(page.Items) != 1 || page.Items[0].Kind != "email" {
		t.Fatalf("kind email: %+v, %v; want its one item", page.Items, err)
	}
	if it, err := q.Item(ctx, page.Items[0].ID); err != nil || it.Kind != "email" {
		t.Fatalf("Item of the email: %+v, %v", it, err)
	}
	// Bad queries.
	for name, bad := range map[string]claim.ItemQuery{
		"a key, no state":    {Key: "k1"},
		"state and claimed":  {State: claim.StateQueued, Claimed: true},
		"unknown state":      {State: "gone"},
		"delayed":            {State: claim.StateDelayed},
		"key of acked":       {State: claim.StateAcked, Key: "k1"},
		"negative limit":     {State: claim.StateQueued, Limit: -1},
		"a cursor of dead":   {State: claim.StateQueued, After: deadCursor()},
		"not a cursor":       {State: claim.StateQueued, After: "nope"},
		"tenant of canceled": {State: claim.StateCancelled, Tenant: "t"},
	} {
		if _, err := q.Items(ctx, bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// deadCursor is a cursor of the dead items' list (at its start).
func deadCursor() string {
	return base64.RawURLEncoding.EncodeToString([]byte("l3.0.0.0.0." + uuid.Nil.String() + "." + uuid.Nil.String()))
}
