package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// keyed returns n items of key, with payloads "key/0".."key/n-1".
func keyed(key string, n int) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Key: key, Payload: []byte(fmt.Sprintf("%s/%d", key, i))}
	}
	return items
}

// sequencedQueue returns queue q, sequenced.
func sequencedQueue(t *testing.T, pool *pgxpool.Pool, opts claim.Options) *claim.Queue {
	t.Helper()
	q := newQueue(t, pool, opts)
	if err := q.UpdateSettings(context.Background(), claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	return q
}

// payloadsOf returns the items' payloads as strings.
func payloadsOf(items []claim.Item) map[string]bool {
	out := map[string]bool{}
	for _, it := range items {
		out[string(it.Payload)] = true
	}
	return out
}

// In a sequenced queue a claim hands out the head of each key only (and
// every item without a key); the key's next item comes once the head is
// acked, in enqueue order, whether the items came in one call, in several
// calls, by INSERT or by COPY.
func TestSequencedKeysRunOneAtATimeInOrder(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	// Key a: 4 items in one call. Key b: 3 calls of one item. Key c: 70
	// items with generated ids (COPY). Two items without a key.
	if _, err := q.Enqueue(ctx, keyed("a", 4)...); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := q.Enqueue(ctx, claim.NewItem{Key: "b", Payload: []byte(fmt.Sprint("b/", i))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Enqueue(ctx, keyed("c", 70)...); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("free-1")}, claim.NewItem{Payload: []byte("free-2")}); err != nil {
		t.Fatal(err)
	}
	var unstamped int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE (seq_order IS NULL) <> (item_key IS NULL)`).Scan(&unstamped); err != nil || unstamped != 0 {
		t.Fatalf("%d items with a key without a sequence order, or without a key with one (%v)", unstamped, err)
	}
	c := q.Claimer(s.ID())
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"a/0": true, "b/0": true, "c/0": true, "free-1": true, "free-2": true}
	if p := payloadsOf(got); len(got) != len(want) || !mapsEqual(p, want) {
		t.Fatalf("first claim handed out %v, want the heads of a, b, c and the items without a key %v", p, want)
	}
	next := map[string]int{"a": 1, "b": 1, "c": 1}
	total := map[string]int{"a": 4, "b": 3, "c": 70}
	held := got
	for len(held) > 0 {
		// Nothing of a held key while its head is claimed.
		if more, err := c.Claim(ctx, claim.ClaimRequest{Max: 100}); err != nil || len(more) != 0 {
			t.Fatalf("a claim while every key's head is held handed out %v (%v)", payloadsOf(more), err)
		}
		for _, it := range held {
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
		held, err = c.Claim(ctx, claim.ClaimRequest{Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range held {
			if want := fmt.Sprintf("%s/%d", it.Key, next[it.Key]); string(it.Payload) != want {
				t.Fatalf("key %s handed out %s, want %s (enqueue order)", it.Key, it.Payload, want)
			}
			next[it.Key]++
		}
		if len(held) > 3 {
			t.Fatalf("one claim handed out %d items of 3 keys", len(held))
		}
	}
	if !mapsEqual(next, total) {
		t.Fatalf("keys ran %v items, want %v", next, total)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A nacked head keeps its key blocked while it waits for its retry (the
// other keys go on); it is claimed again, attempt 2, then the key goes on
// once it is acked. A head moved to the dead items unblocks its key.
func TestSequencedNackedHeadBlocksItsKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	// a/0's backoff outlasts the claims that follow its nack (an hour);
	// the test ends it by hand once they have run.
	q := sequencedQueue(t, pool, claim.Options{BackoffBase: time.Hour, BackoffMax: time.Hour})
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	if _, err := q.Enqueue(ctx, append(keyed("a", 3), keyed("b", 2)...)...); err != nil {
		t.Fatal(err)
	}
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || !mapsEqual(payloadsOf(got), map[string]bool{"a/0": true, "b/0": true}) {
		t.Fatalf("claimed %v (%v), want a/0 and b/0", payloadsOf(got), err)
	}
	for _, it := range got {
		if it.Key == "a" {
			if _, err := q.Nack(ctx, it, errors.New("boom")); err != nil {
				t.Fatal(err)
			}
		} else if err := q.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Until a/0 vests again, only b/1 may be claimed.
	got, err = c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || !mapsEqual(payloadsOf(got), map[string]bool{"b/1": true}) {
		t.Fatalf("claimed %v (%v) while a/0 waits for its retry, want b/1 only", payloadsOf(got), err)
	}
	// Claims one after another: none may take anything but a/0, neither
	// while a/0 waits for its retry nor while it is claimed again, until it
	// ends.
	loop := startClaimLoop(t, c, 10)
	others := func() (bool, string) {
		var other []string
		for _, it := range loop.claimed(t) {
			if string(it.Payload) != "a/0" {
				other = append(other, string(it.Payload))
			}
		}
		return len(other) > 0, fmt.Sprintf("claimed %v", other)
	}
	await.Never(t, "an item but a/0 is claimed while a/0 waits for its retry", loop.rounds, 3, others)
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET vesting_at = now() WHERE queue = $1 AND payload = 'a/0'`, q.Name()); err != nil {
		t.Fatal(err)
	}
	var again claim.Item
	await.Until(t, "a/0 to be claimed again after its backoff", func() (bool, string) {
		if happened, what := others(); happened {
			t.Fatalf("%s before the nacked head a/0 ended", what)
		}
		for _, it := range loop.claimed(t) {
			again = it
		}
		return again.ID != uuid.Nil, "not yet"
	})
	await.Never(t, "an item but a/0 is claimed while a/0 is held again", loop.rounds, 3, others)
	loop.stop()
	if happened, what := others(); happened {
		t.Fatalf("%s before the nacked head a/0 ended", what)
	}
	if again.Attempt != 2 {
		t.Fatalf("a/0 came back with attempt %d, want 2", again.Attempt)
	}
	// Dead: its key goes on.
	if out, err := q.Nack(ctx, again, claim.Permanent(errors.New("give up"))); err != nil || out != claim.Dead {
		t.Fatalf("nack: %v, %v", out, err)
	}
	got, err = c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || !mapsEqual(payloadsOf(got), map[string]bool{"a/1": true}) {
		t.Fatalf("claimed %v (%v) after a/0 died, want a/1", payloadsOf(got), err)
	}
}

// An item of a key that arrives late with an earlier enqueue time (its
// transaction began before another item of its key was enqueued, claimed
// and is still held) is its key's head, yet it is not claimed while the
// later item is held: the sequenced claim skips keys with a claimed item.
// A plain claim, as a version-4 worker runs, would take it: the database
// refuses that second claim of the key (the unique index), and nothing
// changes.
func TestSequencedLateItemWaitsForTheClaimedOne(t *testing.T) {
	t.Parallel()
	for _, tables := range []crsql.Tables{{}, {Schema: "work", Prefix: "jobs_"}} {
		t.Run(fmt.Sprintf("%+v", tables), func(t *testing.T) {
			t.Parallel()
			lateItem(t, tables)
		})
	}
}

func lateItem(t *testing.T, tables crsql.Tables) {
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	q := sequencedQueue(t, pool, claim.Options{Tables: tables})
	hb := await.Stretch(500 * time.Millisecond) // nobody is meant to leave (startSession)
	s, err := session.Start(ctx, pool, session.Options{Tables: tables, Tuning: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	c := q.Claimer(s.ID())
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Key: "k", Payload: []byte("early")}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Key: "k", Payload: []byte("late")}); err != nil {
		t.Fatal(err)
	}
	held, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(held) != 1 || string(held[0].Payload) != "late" {
		t.Fatalf("claimed %v (%v), want the only visible item", payloadsOf(held), err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 0 {
		t.Fatalf("claimed %v (%v) while an item of the key is held", payloadsOf(got), err)
	}
	stmts := store.New(tables)
	d, err := store.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	_, err = stmts.ItemsClaimAny(ctx, pool, d, store.ClaimArgs{Session: s.ID(), Queue: claim.DefaultQueue, Limit: 10, Lease: time.Minute})
	if !stmts.ItemsIsSequenceConflict(err) {
		t.Fatalf("a plain claim of the early item while the late one is held: %v, want a unique violation on the sequence index", err)
	}
	var claimed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tables.Table("items")+` WHERE claim IS NOT NULL`).Scan(&claimed); err != nil || claimed != 1 {
		t.Fatalf("%d items claimed (%v), want 1", claimed, err)
	}
	if err := q.Ack(ctx, held[0], nil); err != nil {
		t.Fatal(err)
	}
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(got) != 1 || string(got[0].Payload) != "early" {
		t.Fatalf("claimed %v (%v) after the late item's ack, want the early one", payloadsOf(got), err)
	}
}

// Turning sequencing off stops stamping new items; the items already
// sequenced keep their order until they end, so claims stay sequenced
// while any is left. A queue never sequenced hands out a key's items
// together, as before.
func TestSequencingOffKeepsSequencedItems(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	plain := newQueue(t, pool, claim.Options{Queue: "plain"})
	s := startSession(t, ctx, pool)
	if _, err := plain.Enqueue(ctx, keyed("a", 3)...); err != nil {
		t.Fatal(err)
	}
	if got, err := plain.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 3 {
		t.Fatalf("a plain queue handed out %d of a key's 3 items (%v), want all", len(got), err)
	}

	q := sequencedQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, keyed("a", 2)...); err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.Off}); err != nil {
		t.Fatal(err)
	}
	info, err := readSequencing(q.Settings(ctx))
	if err != nil || info.On || !info.Items {
		t.Fatalf("Sequencing = %+v, %v; want off, with sequenced items", info, err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Key: "a", Payload: []byte("a/plain")}); err != nil {
		t.Fatal(err)
	}
	c := q.Claimer(s.ID())
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || !mapsEqual(payloadsOf(got), map[string]bool{"a/0": true, "a/plain": true}) {
		t.Fatalf("claimed %v (%v), want a/0 (sequenced head) and a/plain (not sequenced)", payloadsOf(got), err)
	}
	for _, it := range got {
		if err := q.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err = c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || !mapsEqual(payloadsOf(got), map[string]bool{"a/1": true}) {
		t.Fatalf("claimed %v (%v), want a/1", payloadsOf(got), err)
	}
}

// Concurrent sessions, each claiming in its own goroutine, never hold two
// items of one key at once, and run each key's items in enqueue order,
// with parts (each session owns some) and without; every item is acked
// once.
func TestSequencedConcurrentSessionsNeverShareAKey(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{0, 4} {
		t.Run(fmt.Sprint(parts, " parts"), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			const sessions, keys, perKey = 6, 12, 15
			if parts > 0 {
				if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ($1, $2)`, claim.DefaultQueue, parts); err != nil {
					t.Fatal(err)
				}
			}
			q := sequencedQueue(t, pool, claim.Options{})
			var items []claim.NewItem
			for i := range perKey {
				for k := range keys {
					items = append(items, claim.NewItem{Key: fmt.Sprint("k", k), Payload: []byte(fmt.Sprint(i))})
				}
			}
			if _, err := q.Enqueue(ctx, items...); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			holder := map[string]int{} // key → session index holding one of its items
			next := map[string]int{}
			var acked int
			errs := make(chan error, sessions)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range sessions {
				s := startSession(t, ctx, pool)
				var owned []int
				if parts > 0 {
					// Sessions 0..parts-1 own one part each; the others
					// claim in no part and find nothing.
					if w < parts {
						if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, s.ID(), claim.DefaultQueue, w); err != nil {
							t.Fatal(err)
						}
						owned = []int{w}
					} else {
						owned = []int{}
					}
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := q.Claimer(s.ID())
					for {
						mu.Lock()
						done := acked == keys*perKey
						mu.Unlock()
						if done {
							errs <- nil
							return
						}
						select {
						case <-stop:
							errs <- errors.New("stopped before every item was acked")
							return
						default:
						}
						got, err := c.Claim(ctx, claim.ClaimRequest{Max: 3, Parts: owned})
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						for _, it := range got {
							if h, ok := holder[it.Key]; ok {
								mu.Unlock()
								errs <- fmt.Errorf("session %d claimed an item of %s while session %d holds one", w, it.Key, h)
								return
							}
							if want := fmt.Sprint(next[it.Key]); string(it.Payload) != want {
								mu.Unlock()
								errs <- fmt.Errorf("key %s handed out item %s, want %s", it.Key, it.Payload, want)
								return
							}
							holder[it.Key] = w
						}
						mu.Unlock()
						for _, it := range got {
							// Released in the map before the ack commits: a
							// claim of the key seen before the commit would
							// be a double claim.
							mu.Lock()
							delete(holder, it.Key)
							next[it.Key]++
							mu.Unlock()
							if err := q.Ack(ctx, it, nil); err != nil {
								errs <- err
								return
							}
							mu.Lock()
							acked++
							mu.Unlock()
						}
						if len(got) == 0 {
							time.Sleep(5 * time.Millisecond) // an idle claimer's pause, not a wait
						}
					}
				}()
			}
			stopped := false
			stopAll := func() {
				if !stopped {
					stopped = true
					close(stop)
					wg.Wait()
				}
			}
			t.Cleanup(stopAll) // a failed wait leaves them running
			await.Until(t, "every item acked, or a session failed", func() (bool, string) {
				mu.Lock()
				defer mu.Unlock()
				return acked == keys*perKey || len(errs) > 0, fmt.Sprintf("%d of %d acked", acked, keys*perKey)
			}, await.Within(time.Minute))
			stopAll()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			var left int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items`).Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d items left (%v)", left, err)
			}
		})
	}
}

// A session owning more parts than one per-part claim statement reads
// (several statements), and the urgent lane, hand out heads only, in a
// sequenced queue: each key's first item, then its next once it is acked.
func TestSequencedManyPartsAndUrgentLaneTakeHeadsOnly(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const parts = store.MaxPartBranches + 5
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ($1, $2)`, claim.DefaultQueue, parts); err != nil {
		t.Fatal(err)
	}
	q := sequencedQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	owned := make([]int, parts)
	for p := range parts {
		owned[p] = p
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`, s.ID(), claim.DefaultQueue, p); err != nil {
			t.Fatal(err)
		}
	}
	const keys, perKey = 30, 3
	var items []claim.NewItem
	for n := range perKey {
		for k := range keys {
			items = append(items, claim.NewItem{Key: fmt.Sprint("k", k), Payload: []byte(fmt.Sprint(n))})
		}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	c := q.Claimer(s.ID())
	for n := range perKey {
		// Half of each round by the urgent lane (every item is urgent:
		// priority 0), the rest by the part claims.
		urgent, err := c.ClaimUrgent(ctx, claim.UrgentRequest{Max: keys / 2, MaxPriority: 0, OwnedParts: owned})
		if err != nil {
			t.Fatal(err)
		}
		rest, err := c.Claim(ctx, claim.ClaimRequest{Max: 100, Parts: owned})
		if err != nil {
			t.Fatal(err)
		}
		got := append(urgent, rest...)
		seen := map[string]bool{}
		for _, it := range got {
			if string(it.Payload) != fmt.Sprint(n) || seen[it.Key] {
				t.Fatalf("round %d: key %s handed out item %s (twice: %v), want item %d once", n, it.Key, it.Payload, seen[it.Key], n)
			}
			seen[it.Key] = true
		}
		if len(urgent) != keys/2 || len(got) != keys {
			t.Fatalf("round %d: %d urgent and %d in all, want %d and %d (each key's head)", n, len(urgent), len(got), keys/2, keys)
		}
		for _, it := range got {
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}
