package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// claimAndAck claims every vested item of q (at most n) for a new session and
// acks them all, failing the test unless exactly n were acked.
func claimAndAck(t *testing.T, pool *pgxpool.Pool, q *claim.Queue, n int) {
	t.Helper()
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	acked := 0
	for acked < n {
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 0 {
			t.Fatalf("acked %d items, want %d: nothing left to claim", acked, n)
		}
		done, err := q.AckBatch(ctx, items, nil)
		if err != nil || len(done) != len(items) {
			t.Fatalf("AckBatch: %d of %d, %v", len(done), len(items), err)
		}
		acked += len(done)
	}
	if acked != n {
		t.Fatalf("acked %d items, want %d", acked, n)
	}
}

// An enqueue whose answer is lost (the COMMIT's or the statement's), then
// every item it committed is claimed and acked, then the documented retry
// (the same items with the returned ids): it adds nothing and reports every
// item done, by each enqueue path — one caller-given id, many (a
// transaction of INSERTs), and many generated ids (COPY) retried by id.
func TestRetryAfterUnknownOutcomeAndAckAddsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		match func(string) bool
		items int
		given bool
	}{
		{"one-given-id", faultproxy.IsCommit, 1, true},
		{"given-ids", faultproxy.IsCommit, 3, true},
		{"copy", faultproxy.IsCommit, 500, false},
		{"statement", faultproxy.Contains("INSERT INTO"), 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			direct, pool, proxy := proxied(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{})
			items := itemsWith(tc.items, func(int) uuid.UUID { return uuid.UUID{} })
			if tc.given {
				items = itemsWith(tc.items, func(int) uuid.UUID { return uuid.New() })
			}
			if _, err := q.Settings(ctx); err != nil {
				t.Fatal(err) // the schema check runs before the fault
			}
			proxy.Arm(faultproxy.Rule{Match: tc.match, Action: faultproxy.DropAnswer})
			res, err := q.Enqueue(ctx, items...)
			if proxy.Fired() != 1 {
				t.Fatalf("the fault fired %d times, want 1 (err %v)", proxy.Fired(), err)
			}
			if !errors.Is(err, claim.ErrOutcomeUnknown) || len(res.IDs) != tc.items {
				t.Fatalf("enqueue with its answer lost: %d ids, %v; want every id and ErrOutcomeUnknown", len(res.IDs), err)
			}
			claimAndAck(t, direct, newQueue(t, direct, claim.Options{}), tc.items)
			for i := range items {
				items[i].ID = res.IDs[i]
			}
			res, err = q.Enqueue(ctx, items...)
			if err != nil {
				t.Fatal(err)
			}
			if res.Added() != 0 {
				t.Fatalf("the retry added %d items, want 0: their first copies were acked", res.Added())
			}
			for i := range items {
				if !res.Done[i] {
					t.Fatalf("item %d: Done is false; its first copy was acked", i)
				}
			}
			if n := count(t, direct, `SELECT count(*) FROM crdbwork_items`); n != 0 {
				t.Fatalf("%d items in the table after the retry, want 0", n)
			}
		})
	}
}

// Every way an item ends records its id, and an enqueue of the id within
// the window adds nothing and reports it done: ack, at-most-once take,
// Nack to the dead items (permanent), Cancel. An id still queued is
// reported neither new nor done. Requeue of a dead item makes it live again
// (its id is no longer done).
func TestEndedIDsAreNotEnqueuedAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "ends"})
	s := startSession(t, ctx, pool)
	ids := []uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	items := []claim.NewItem{
		{ID: ids[0], Payload: []byte("acked")},
		{ID: ids[1], Payload: []byte("taken"), AtMostOnce: true},
		{ID: ids[2], Payload: []byte("dead")},
		{ID: ids[3], Payload: []byte("cancelled"), Delay: time.Hour},
		{ID: ids[4], Payload: []byte("queued"), Delay: time.Hour},
	}
	res, err := q.Enqueue(ctx, items...)
	if err != nil || res.Added() != len(items) {
		t.Fatalf("first enqueue: added %d, %v", res.Added(), err)
	}
	claimed, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claimed %d, %v; want 3", len(claimed), err)
	}
	for _, it := range claimed {
		switch it.ID {
		case ids[0]:
			err = q.Ack(ctx, it, nil)
		case ids[2]:
			_, err = q.Nack(ctx, it, claim.Permanent(errors.New("bad")))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := cancelFound(q.CancelItem(ctx, ids[3], claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("Cancel: %v, %v", ok, err)
	}
	outcomes := map[uuid.UUID]string{}
	rows, err := pool.Query(ctx, `SELECT id, outcome FROM crdbwork_ended WHERE queue = 'ends'`)
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	var outcome string
	if _, err := pgx.ForEachRow(rows, []any{&id, &outcome}, func() error { outcomes[id] = outcome; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]string{ids[0]: "acked", ids[1]: "taken", ids[2]: "dead", ids[3]: "cancelled"}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("ended rows %v, want %v", outcomes, want)
	}
	res, err = q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	for i := range items {
		wantDone := i < 4
		if res.New[i] || res.Done[i] != wantDone {
			t.Errorf("re-enqueue of %s: new %v, done %v; want done %v", items[i].Payload, res.New[i], res.Done[i], wantDone)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 1 {
		t.Fatalf("%d items, want the one still queued", n)
	}
	// One item at a time, through the single-statement path too.
	for i := range 4 {
		got, isNew, err := enqueueOne(ctx, q, items[i])
		if err != nil || isNew || !got.Done[0] {
			t.Fatalf("single re-enqueue of %s: new %v, %+v, %v", items[i].Payload, isNew, got, err)
		}
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: ids[2]})); err != nil || !ok {
		t.Fatalf("Requeue: %v, %v", ok, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1`, ids[2]); n != 0 {
		t.Fatalf("the requeued item is still recorded as ended")
	}
	res, err = q.Enqueue(ctx, items[2])
	if err != nil || res.New[0] || res.Done[0] {
		t.Fatalf("enqueue of a requeued item: %+v, %v; want queued (neither new nor done)", res, err)
	}
}

func enqueueOne(ctx context.Context, q *claim.Queue, it claim.NewItem) (claim.Enqueued, bool, error) {
	res, err := q.Enqueue(ctx, it)
	if err != nil {
		return res, false, err
	}
	return res, res.New[0], nil
}

// A queue's dedup window is a setting: 0 is the default (a day), DedupOff
// records nothing (an acked id is enqueued again), negative windows are
// refused; a short window passes and the id is new again; EnqueueTx in the
// caller's transaction sees the ended ids too.
func TestDedupWindowSetting(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transactions are committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "window"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupWindow: -time.Second}}); err == nil {
		t.Fatal("a negative dedup window was accepted")
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupWindow: time.Second, DedupOff: true}}); err == nil {
		t.Fatal("DedupOff with a window was accepted")
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Settings(ctx); err != nil || st.DedupWindow != claim.DefaultDedupWindow || st.DedupOff {
		t.Fatalf("settings after Configure without a window: %+v, %v; want the default window", st, err)
	}

	// Off: nothing recorded, an acked id is new again.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	if st, err := q.Settings(ctx); err != nil || !st.DedupOff || st.DedupWindow != 0 {
		t.Fatalf("settings: %+v, %v; want DedupOff", st, err)
	}
	it := claim.NewItem{ID: uuid.New(), Payload: []byte("x")}
	if _, err := q.Enqueue(ctx, it); err != nil {
		t.Fatal(err)
	}
	claimAndAck(t, pool, q, 1)
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_ended`); n != 0 {
		t.Fatalf("%d ended rows with the window off", n)
	}
	if res, err := q.Enqueue(ctx, it); err != nil || !res.New[0] {
		t.Fatalf("with the window off, an acked id: %+v, %v; want new", res, err)
	}
	claimAndAck(t, pool, q, 1)

	// A short window: done within it, new once it passed.
	const window = 500 * time.Millisecond
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupWindow: window}}); err != nil {
		t.Fatal(err)
	}
	it.ID = uuid.New()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.EnqueueTx(ctx, tx, it); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	claimAndAck(t, pool, q, 1)
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.EnqueueTx(ctx, tx, it)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res.New[0] || !res.Done[0] {
		t.Fatalf("EnqueueTx within the window: %+v; want done", res)
	}
	await.Until(t, "the dedup window to pass by the database's clock", func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE id = $1 AND ended_at + INTERVAL '500 milliseconds' < now()`, it.ID) == 1
	})
	if res, err := q.Enqueue(ctx, it); err != nil || !res.New[0] {
		t.Fatalf("after the window: %+v, %v; want new", res, err)
	}
	// Ended again: the old row is refreshed, and the id is done again.
	claimAndAck(t, pool, q, 1)
	if res, err := q.Enqueue(ctx, it); err != nil || res.New[0] || !res.Done[0] {
		t.Fatalf("after its second ack: %+v, %v; want done", res, err)
	}
}

// PruneEnded deletes only the rows older than the queue's window, of that
// queue, at most 8,000 per call, 1,000 per statement; Reap calls it.
func TestPruneEndedIsBounded(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "prune"})
	// (No history window: the ended records are kept for the dedup window.)
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupWindow: time.Hour}, Retention: &claim.Retention{NoHistory: true}}); err != nil {
		t.Fatal(err)
	}
	// 9,500 rows past the window (dated from seeded, the database's time
	// then), 300 within it, 2,000 of another queue past any window.
	var seeded time.Time
	if err := pool.QueryRow(ctx, `WITH rows AS (INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT 'prune', gen_random_uuid(), now() - INTERVAL '2 hours' - g * INTERVAL '1 second', 'acked' FROM generate_series(1, 9500) AS g
		 RETURNING 1)
		SELECT now() FROM rows LIMIT 1`).Scan(&seeded); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT 'prune', gen_random_uuid(), now() - INTERVAL '30 minutes', 'acked' FROM generate_series(1, 300) AS g`,
		`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome)
		 SELECT 'other', gen_random_uuid(), now() - INTERVAL '30 days', 'acked' FROM generate_series(1, 2000) AS g`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	n, err := queuemaint.For(q).PruneEnded(ctx)
	if err != nil || n != 8000 {
		t.Fatalf("first PruneEnded: %d, %v; want 8000 (its bound)", n, err)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'prune' AND ended_at < now() - INTERVAL '90 minutes'`); c != 1500 {
		t.Fatalf("%d old rows left, want 1500", c)
	}
	// The oldest go first. (Dated from the seed's time, not the check's:
	// the test may take more than a second to get here.)
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'prune' AND ended_at < $1::TIMESTAMPTZ - INTERVAL '2 hours' - INTERVAL '1500.5 seconds'`, seeded); c != 0 {
		t.Fatalf("%d of the oldest rows left; pruning goes oldest first", c)
	}
	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.Pruned != 1500 {
		t.Fatalf("Reap: pruned %d, %v; want the 1500 left", st.Pruned, err)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'prune'`); c != 300 {
		t.Fatalf("%d rows left, want the 300 within the window", c)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = 'other'`); c != 2000 {
		t.Fatalf("%d rows of another queue left, want 2000 (untouched)", c)
	}
}

// Unique keys: the same key in the same period gets the same id and adds
// one item (while it is queued, and after it was acked: done); the next
// period adds a new one; a key without a period is unique for ever (within
// the window); an ID with a unique key, or the same key twice in one call,
// is refused.
func TestUniqueKeys(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "unique"})
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	if claim.UniqueID("unique", "k", time.Hour, at) != claim.UniqueID("unique", "k", time.Hour, at.Add(59*time.Minute)) {
		t.Fatal("UniqueID differs within one period")
	}
	if claim.UniqueID("unique", "k", time.Hour, at) == claim.UniqueID("unique", "k", time.Hour, at.Add(time.Hour)) ||
		claim.UniqueID("unique", "k", time.Hour, at) == claim.UniqueID("other", "k", time.Hour, at) ||
		claim.UniqueID("unique", "k", time.Hour, at) == claim.UniqueID("unique", "k2", time.Hour, at) {
		t.Fatal("UniqueID is the same for another period, queue or key")
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: uuid.New(), UniqueKey: "k", Payload: []byte("x")}); err == nil {
		t.Fatal("an ID with a UniqueKey was accepted")
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{UniqueKey: "k", Payload: []byte("x")}, claim.NewItem{UniqueKey: "k", Payload: []byte("y")}); err == nil {
		t.Fatal("one unique key twice in one call was accepted")
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{UniquePeriod: time.Hour, Payload: []byte("x")}); err == nil {
		t.Fatal("a UniquePeriod without a key was accepted")
	}

	// Without a period.
	forever := claim.NewItem{UniqueKey: "report:42", Payload: []byte("x")}
	first, err := q.Enqueue(ctx, forever)
	if err != nil || !first.New[0] || first.IDs[0] != claim.UniqueID("unique", "report:42", 0, time.Time{}) {
		t.Fatalf("first unique enqueue: %+v, %v", first, err)
	}
	again, err := q.Enqueue(ctx, forever)
	if err != nil || again.New[0] || again.Done[0] || again.IDs[0] != first.IDs[0] {
		t.Fatalf("second enqueue while queued: %+v, %v; want the same id, queued", again, err)
	}
	claimAndAck(t, pool, q, 1)
	again, err = q.Enqueue(ctx, forever)
	if err != nil || again.New[0] || !again.Done[0] {
		t.Fatalf("enqueue after the ack: %+v, %v; want done", again, err)
	}

	// With a short period (stretched with the machine's load, so that two
	// enqueues mostly fit in one): the next period adds a new item.
	period := await.Stretch(200 * time.Millisecond)
	keyed := claim.NewItem{UniqueKey: "digest", UniquePeriod: period, Payload: []byte("x")}
	var firstID uuid.UUID
	// Enqueue twice within one period (retrying if a boundary falls
	// between the two, and if the first falls in the period of an earlier
	// try's second: that one made its item).
	tried := map[uuid.UUID]bool{}
	for {
		a, err := q.Enqueue(ctx, keyed)
		if err != nil {
			t.Fatal(err)
		}
		b, err := q.Enqueue(ctx, keyed)
		if err != nil {
			t.Fatal(err)
		}
		if tried[a.IDs[0]] {
			tried[b.IDs[0]] = true
			continue
		}
		tried[a.IDs[0]], tried[b.IDs[0]] = true, true
		if a.IDs[0] == b.IDs[0] {
			if !a.New[0] || b.New[0] {
				t.Fatalf("two enqueues in one period: new %v then %v; want true then false", a.New[0], b.New[0])
			}
			firstID = a.IDs[0]
			break
		}
	}
	await.Until(t, "the next period", func() bool { return claim.UniqueID("unique", "digest", period, time.Now()) != firstID })
	next, err := q.Enqueue(ctx, keyed)
	if err != nil || next.IDs[0] == firstID || !next.New[0] {
		t.Fatalf("enqueue in the next period: %+v, %v; want a new item", next, err)
	}
}

// A fair queue's enqueue whose turns read loses its answer wrote nothing:
// it fails plainly (no ErrOutcomeUnknown, no ids), and the same enqueue
// then succeeds.
func TestFairEnqueueLostTurnsReadIsAPlainFailure(t *testing.T) {
	t.Parallel()
	url := setupURL(t)
	direct, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx := context.Background()
	proxy, purl, err := faultproxy.ForURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	pool, err := pgxpool.New(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := newQueue(t, pool, claim.Options{Queue: "fair"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	proxy.Arm(faultproxy.Rule{Match: faultproxy.Contains("ORDER BY turn_at DESC LIMIT 1"), Action: faultproxy.DropAnswer})
	items := []claim.NewItem{{Payload: []byte("a"), Tenant: "t1"}, {Payload: []byte("b"), Tenant: "t2"}}
	ids, err := q.Enqueue(ctx, items...)
	if proxy.Fired() != 1 {
		t.Fatalf("the fault fired %d times, want 1 (err %v)", proxy.Fired(), err)
	}
	if err == nil || errors.Is(err, claim.ErrOutcomeUnknown) || ids.IDs != nil {
		t.Fatalf("enqueue whose turns read was lost: ids %v, %v; want a plain error and no ids", ids.IDs, err)
	}
	if n := count(t, direct, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items after a failed turns read", n)
	}
	if ids, err := q.Enqueue(ctx, items...); err != nil || len(ids.IDs) != 2 {
		t.Fatalf("enqueue after the fault: %v, %v", ids, err)
	}
}
