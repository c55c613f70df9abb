package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// claimOnly claims up to 10 items through c and fails t unless their
// payloads are exactly want.
func claimOnly(t *testing.T, ctx context.Context, c claim.Claimer, what string, want ...string) []claim.Item {
	t.Helper()
	got, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	w := map[string]bool{}
	for _, p := range want {
		w[p] = true
	}
	if p := payloadsOf(got); len(got) != len(want) || !mapsEqual(p, w) {
		t.Fatalf("%s: claimed %v, want %v", what, p, w)
	}
	return got
}

// byPayload returns the item of items with payload p.
func byPayload(t *testing.T, items []claim.Item, p string) claim.Item {
	t.Helper()
	for _, it := range items {
		if string(it.Payload) == p {
			return it
		}
	}
	t.Fatalf("no item %s among %v", p, payloadsOf(items))
	return claim.Item{}
}

// killHead claims key a's head a/0 (with b/0) and moves it to the dead
// items with a Permanent error; it acks b/0.
func killHead(t *testing.T, ctx context.Context, q *claim.Queue, c claim.Claimer) claim.Item {
	t.Helper()
	got := claimOnly(t, ctx, c, "first claim", "a/0", "b/0")
	if out, err := q.Nack(ctx, byPayload(t, got, "a/0"), claim.Permanent(errors.New("poison"))); err != nil || out != claim.Dead {
		t.Fatalf("nack of a/0: %v, %v", out, err)
	}
	if err := q.Ack(ctx, byPayload(t, got, "b/0"), nil); err != nil {
		t.Fatal(err)
	}
	return byPayload(t, got, "a/0")
}

// In a queue that advances on a death (the default), a requeued dead head
// re-enters its key's sequence at its original place: while the key's next
// item is claimed it waits (never two of a key in flight), and it runs
// before the key's later items. (Version 5 requeued it unsequenced: it was
// claimed at once beside a/1, as river#971 was.)
func TestSequencedRequeueReentersAtItsPlace(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	if _, err := q.Enqueue(ctx, append(keyed("a", 3), keyed("b", 1)...)...); err != nil {
		t.Fatal(err)
	}
	dead := killHead(t, ctx, q, c)
	if info, err := readSequencing(q.Settings(ctx)); err != nil || info.Hold {
		t.Fatalf("Sequencing = %+v, %v; want advance on a death by default", info, err)
	}
	// Advance: a/1 runs.
	a1 := claimOnly(t, ctx, c, "after a/0 died", "a/1")[0]
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: dead.ID})); err != nil || !ok {
		t.Fatalf("requeue of a/0: %v, %v", ok, err)
	}
	var seq *int64
	if err := pool.QueryRow(ctx, `SELECT seq_order FROM crdbwork_items WHERE id = $1`, dead.ID).Scan(&seq); err != nil || seq == nil {
		t.Fatalf("the requeued a/0 has seq_order %v (%v), want its place in its key's sequence", seq, err)
	}
	claimOnly(t, ctx, c, "while a/1 is claimed, with a/0 requeued")
	if err := q.Ack(ctx, a1, nil); err != nil {
		t.Fatal(err)
	}
	again := claimOnly(t, ctx, c, "after a/1 was acked", "a/0")[0]
	if again.ID != dead.ID {
		t.Fatalf("claimed %s, want the requeued item %s", again.ID, dead.ID)
	}
	claimOnly(t, ctx, c, "while the requeued a/0 runs")
	if err := q.Ack(ctx, again, nil); err != nil {
		t.Fatal(err)
	}
	claimOnly(t, ctx, c, "after the requeued a/0", "a/2")
}

// In a queue that holds on a death, a dead head blocks its key (BlockedKeys
// lists it) until it is requeued, and the requeued head runs first; other
// keys go on. Each way of ending the hold is tried: requeue, deleting the
// dead item (as an operator or an older version would), retention,
// ReleaseSequenceKey, and turning hold off.
func TestSequencedHoldOnDeath(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"requeue", "delete", "retention", "release", "advance"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			q := sequencedQueue(t, pool, claim.Options{})
			if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
				t.Fatalf("UpdateSettings(SequenceHold: On) = %v", err)
			}
			if info, err := readSequencing(q.Settings(ctx)); err != nil || !info.Hold || !info.On {
				t.Fatalf("Sequencing = %+v, %v; want on, hold", info, err)
			}
			s := startSession(t, ctx, pool)
			c := q.Claimer(s.ID())
			if _, err := q.Enqueue(ctx, append(keyed("a", 3), keyed("b", 2)...)...); err != nil {
				t.Fatal(err)
			}
			dead := killHead(t, ctx, q, c)
			// a is held; b goes on.
			b1 := claimOnly(t, ctx, c, "with a/0 dead and holding a", "b/1")[0]
			if err := q.Ack(ctx, b1, nil); err != nil {
				t.Fatal(err)
			}
			claimOnly(t, ctx, c, "with a held")
			blocked, err := q.BlockedKeys(ctx, 10)
			if err != nil || len(blocked) != 1 || blocked[0].Key != "a" || blocked[0].ID != dead.ID ||
				blocked[0].Kind != claim.BlockedDead || blocked[0].Reason != claim.ReasonPermanent || !strings.Contains(blocked[0].LastError, "poison") {
				t.Fatalf("BlockedKeys = %+v, %v; want a held by %s (permanent: poison)", blocked, err, dead.ID)
			}
			switch how {
			case "requeue":
				if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: dead.ID})); err != nil || !ok {
					t.Fatalf("requeue: %v, %v", ok, err)
				}
				again := claimOnly(t, ctx, c, "after the requeue", "a/0")[0]
				claimOnly(t, ctx, c, "while the requeued head runs")
				if err := q.Ack(ctx, again, nil); err != nil {
					t.Fatal(err)
				}
			case "delete":
				if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_dead_items WHERE id = $1`, dead.ID); err != nil {
					t.Fatal(err)
				}
			case "retention":
				if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{DeadMaxAge: time.Second, NoDeadMaxCount: true}}); err != nil {
					t.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `UPDATE crdbwork_dead_items SET died_at = now() - INTERVAL '1 hour' WHERE id = $1`, dead.ID); err != nil {
					t.Fatal(err)
				}
				if n, err := queuemaint.For(q).PruneDead(ctx); err != nil || n != 1 {
					t.Fatalf("PruneDead = %d, %v; want the dead head pruned", n, err)
				}
			case "release":
				if ids, err := q.ReleaseSequenceKey(ctx, "a"); err != nil || len(ids) != 1 || ids[0] != dead.ID {
					t.Fatalf("ReleaseSequenceKey = %v, %v; want [%s]", ids, err, dead.ID)
				}
				if ids, err := q.ReleaseSequenceKey(ctx, "a"); err != nil || len(ids) != 0 {
					t.Fatalf("ReleaseSequenceKey again = %v, %v; want none", ids, err)
				}
				if d, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})); err != nil || len(d) != 1 || d[0].ID != dead.ID {
					t.Fatalf("the released dead item is gone: %+v, %v", d, err)
				}
			case "advance":
				if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.Off}); err != nil {
					t.Fatalf("UpdateSettings(SequenceHold: Off) = %v", err)
				}
			}
			if blocked, err := q.BlockedKeys(ctx, 10); err != nil || len(blocked) != 0 {
				t.Fatalf("BlockedKeys after %s = %+v, %v; want none", how, blocked, err)
			}
			a1 := claimOnly(t, ctx, c, "after "+how, "a/1")[0]
			if err := q.Ack(ctx, a1, nil); err != nil {
				t.Fatal(err)
			}
			claimOnly(t, ctx, c, "after a/1", "a/2")
		})
	}
}

// In a hold queue a cancelled sequenced item is kept among the dead items
// (reason cancelled) and holds its key's later items, not its earlier
// ones; requeued, it runs at its place. In an advance queue a cancel keeps
// nothing.
func TestSequencedHoldOnCancel(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	res, err := q.Enqueue(ctx, keyed("a", 3)...)
	if err != nil {
		t.Fatal(err)
	}
	// Cancel a/1 (not yet the head): a/0 still runs, a/2 waits.
	a1 := res.IDs[1]
	if ok, err := cancelFound(q.CancelItem(ctx, a1, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel of a/1: %v, %v", ok, err)
	}
	a0 := claimOnly(t, ctx, c, "after a/1 was cancelled", "a/0")[0]
	if err := q.Ack(ctx, a0, nil); err != nil {
		t.Fatal(err)
	}
	claimOnly(t, ctx, c, "with a/1 cancelled and holding a")
	blocked, err := q.BlockedKeys(ctx, 10)
	if err != nil || len(blocked) != 1 || blocked[0].ID != a1 || blocked[0].Reason != claim.ReasonCancelled {
		t.Fatalf("BlockedKeys = %+v, %v; want a held by the cancelled a/1", blocked, err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: a1})); err != nil || !ok {
		t.Fatalf("requeue of the cancelled a/1: %v, %v", ok, err)
	}
	again := claimOnly(t, ctx, c, "after the requeue", "a/1")[0]
	if err := q.Ack(ctx, again, nil); err != nil {
		t.Fatal(err)
	}
	claimOnly(t, ctx, c, "after a/1", "a/2")

	// Advance: a cancel keeps nothing among the dead items.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.Off}); err != nil {
		t.Fatal(err)
	}
	res, err = q.Enqueue(ctx, keyed("z", 2)...)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cancelFound(q.CancelItem(ctx, res.IDs[0], claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel of z/0: %v, %v", ok, err)
	}
	var dead int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, res.IDs[0]).Scan(&dead); err != nil || dead != 0 {
		t.Fatalf("a cancel in an advance queue left %d dead items (%v)", dead, err)
	}
}

// BlockedKeys lists a key whose head waits for its retry, and one whose
// head waits for its delay, with the head; a key whose head runs is not
// blocked.
func TestSequencedBlockedKeysWaitingHeads(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{BackoffBase: time.Hour, BackoffMax: time.Hour})
	s := startSession(t, ctx, pool)
	c := q.Claimer(s.ID())
	if _, err := q.Enqueue(ctx, append(keyed("a", 2), keyed("b", 2)...)...); err != nil {
		t.Fatal(err)
	}
	delayed, err := q.Enqueue(ctx, claim.NewItem{Key: "c", Payload: []byte("c/0"), Delay: time.Hour}, claim.NewItem{Key: "c", Payload: []byte("c/1")})
	if err != nil {
		t.Fatal(err)
	}
	got := claimOnly(t, ctx, c, "first claim", "a/0", "b/0")
	if _, err := q.Nack(ctx, byPayload(t, got, "a/0"), errors.New("try later")); err != nil {
		t.Fatal(err)
	}
	blocked, err := q.BlockedKeys(ctx, 10)
	if err != nil || len(blocked) != 2 {
		t.Fatalf("BlockedKeys = %+v, %v; want a (retry) and c (delayed)", blocked, err)
	}
	a, cc := blocked[0], blocked[1]
	if a.Key != "a" || a.Kind != claim.BlockedRetry || a.ID != byPayload(t, got, "a/0").ID || a.LastError != "try later" || a.Attempts != 1 || !a.At.After(time.Now().Add(30*time.Minute)) {
		t.Errorf("blocked a: %+v", a)
	}
	if cc.Key != "c" || cc.Kind != claim.BlockedDelayed || cc.ID != delayed.IDs[0] || cc.Attempts != 0 {
		t.Errorf("blocked c: %+v", cc)
	}
	if _, err := q.BlockedKeys(ctx, 0); err == nil {
		t.Error("BlockedKeys(0) was accepted")
	}
	if _, err := q.ReleaseSequenceKey(ctx, ""); err == nil {
		t.Error("ReleaseSequenceKey of an empty key was accepted")
	}
}

// A sequenced claim statement that runs past Options.SequencedClaimTimeout
// is stopped by the database and claims nothing (the heads it locked are
// free again), and the error says so. The statement is held up by a lock
// on the dead items table, which it reads (PostgreSQL's LOCK TABLE; the
// bound itself, statement_timeout, is the same on CockroachDB).
func TestSequencedClaimTimeout(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("LOCK TABLE is PostgreSQL's")
	}
	pool := setup(t)
	ctx := context.Background()
	q := sequencedQueue(t, pool, claim.Options{SequencedClaimTimeout: 300 * time.Millisecond})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, keyed("a", 2)...); err != nil {
		t.Fatal(err)
	}
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE crdbwork_dead_items IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	_, err = q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, claim.ErrSequencedClaimTimeout) {
		t.Fatalf("claim held up past its bound = %v, want ErrSequencedClaimTimeout", err)
	}
	var claimed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`).Scan(&claimed); err != nil || claimed != 0 {
		t.Fatalf("%d items claimed by the stopped claim (%v)", claimed, err)
	}
	claimOnly(t, ctx, q.Claimer(s.ID()), "once the lock is gone", "a/0")
	if _, err := claim.New(pool, claim.Options{SequencedClaimTimeout: -1}); err != nil {
		t.Fatalf("a negative bound (none) was refused: %v", err)
	}
}

// Sessions of their own, each on its own pool (a connection each, as
// separate processes would have), claim concurrently from a queue whose
// keys' heads die and are requeued while the keys' next items are queued
// or running, in each mode: no two items of a key are ever claimed at once
// (read from the database after every claim and by the handlers' own
// bookkeeping), each key's items are acked in enqueue order but for the
// requeued heads, which run before every later item of their key, and
// every item ends acked.
func TestSequencedRequeueUnderConcurrentClaimers(t *testing.T) {
	t.Parallel()
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			t.Parallel()
			requeueUnderClaimers(t, hold)
		})
	}
}

func requeueUnderClaimers(t *testing.T, hold bool) {
	pool := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(5*time.Minute))
	defer cancel()
	q := sequencedQueue(t, pool, claim.Options{})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: holdToggle(hold)}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE seq_acks (n BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 6, 12
	var items []claim.NewItem
	for i := range perKey {
		for k := range keys {
			items = append(items, claim.NewItem{Key: fmt.Sprint("k", k), Payload: []byte(fmt.Sprintf("k%d/%02d", k, i))})
		}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// Each key's first attempt at item 3 dies (Permanent), once.
	var mu sync.Mutex
	died := map[string]bool{}
	running := map[string]string{}
	var acked []string
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for w := range 3 {
		p, err := pgxpool.NewWithConfig(ctx, pool.Config())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		wq := newQueue(t, p, claim.Options{})
		c := wq.Claimer(startSession(t, ctx, p).ID())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				done := len(acked) == keys*perKey
				mu.Unlock()
				if done {
					return
				}
				got, err := c.Claim(ctx, claim.ClaimRequest{Max: 4})
				if err != nil {
					fail("worker %d claim: %v", w, err)
					return
				}
				if len(got) == 0 {
					time.Sleep(5 * time.Millisecond) // an idle claimer's pause, not a wait
					continue
				}
				for _, it := range got {
					mu.Lock()
					if other, ok := running[it.Key]; ok {
						failures = append(failures, fmt.Sprintf("%s claimed while %s of its key runs", it.Payload, other))
					}
					running[it.Key] = string(it.Payload)
					first := strings.HasSuffix(string(it.Payload), "/03") && !died[it.Key]
					if first {
						died[it.Key] = true
					}
					mu.Unlock()
					var perKeyClaimed int
					if err := p.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE item_key = $1 AND claim IS NOT NULL`, it.Key).Scan(&perKeyClaimed); err != nil || perKeyClaimed != 1 {
						fail("%s: %d items of its key claimed (%v)", it.Payload, perKeyClaimed, err)
					}
					mu.Lock()
					delete(running, it.Key)
					mu.Unlock()
					if first {
						if out, err := wq.Nack(ctx, it, claim.Permanent(errors.New("poison"))); err != nil || out != claim.Dead {
							fail("nack %s: %v %v", it.Payload, out, err)
						}
						continue
					}
					// The ack's order is the database's: a serial taken in
					// the ack transaction, before the key's next item can
					// be claimed (the order of appends to a list is not).
					payload := string(it.Payload)
					if err := wq.Ack(ctx, it, func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `INSERT INTO seq_acks (payload) VALUES ($1)`, payload)
						return err
					}); err != nil {
						fail("ack %s: %v", it.Payload, err)
						continue
					}
					mu.Lock()
					acked = append(acked, payload)
					mu.Unlock()
				}
			}
		}()
	}
	// The requeuer: every dead item goes back, after the key's next items
	// were enqueued long ago (and, in advance mode, are running or done).
	wg.Add(1)
	go func() {
		defer wg.Done()
		requeued := 0
		for requeued < keys && ctx.Err() == nil {
			dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 100}))
			if err != nil {
				fail("dead: %v", err)
				return
			}
			for _, d := range dead {
				if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: d.ID})); err != nil {
					fail("requeue: %v", err)
				} else if ok {
					requeued++
				}
			}
			time.Sleep(10 * time.Millisecond) // the requeuer's pause between its reads, not a wait
		}
	}()
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
	if len(acked) != keys*perKey {
		t.Fatalf("%d of %d items acked", len(acked), keys*perKey)
	}
	rows, err := pool.Query(ctx, `SELECT payload FROM seq_acks ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	if acked, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(acked) != keys*perKey {
		t.Fatalf("%d acks recorded (%v), want %d", len(acked), err, keys*perKey)
	}
	// Order per key: in hold mode strictly in enqueue order; in advance
	// mode the requeued /03 may come later than its place, but never
	// beside another item of its key (checked above), and every other item
	// in order.
	last := map[string]string{}
	for _, p := range acked {
		k := strings.Split(p, "/")[0]
		if hold || !strings.HasSuffix(p, "/03") {
			if prev := last[k]; prev > p && !(strings.HasSuffix(prev, "/03") && !hold) {
				t.Errorf("%s acked after %s", p, prev)
			}
			last[k] = p
		}
	}
}
