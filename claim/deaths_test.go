package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// Tests of issue 16, "dead items keep every death": an id enqueued again
// after its item died may die again, by every path, and an item that cannot
// be moved to the dead items never keeps the reaper (or a nack) from the
// rest of its work. These tests use only the API that existed before the
// fix, so that they can be run on the code of schema version 3 (where each
// of them fails).

// allowReuse turns the queue's dedup window off where the schema has one
// (version 4 and later), so that an id enqueued again after its item died
// is a new item rather than a duplicate of the ended one.
func allowReuse(t *testing.T, pool *pgxpool.Pool, queue string) {
	t.Helper()
	ctx := context.Background()
	var has bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'crdbwork_queues' AND column_name = 'dedup_window')`).Scan(&has); err != nil {
		t.Fatal(err)
	}
	if !has {
		return
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, dedup_window) VALUES ($1, INTERVAL '0 seconds')
		ON CONFLICT (name) DO UPDATE SET dedup_window = excluded.dedup_window`, queue); err != nil {
		t.Fatal(err)
	}
}

// dieOnce enqueues an item with id and moves it to the dead items through a
// claim and a Permanent nack.
func dieOnce(t *testing.T, q *claim.Queue, session uuid.UUID, id uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("first life")}); err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, session)
	if it.ID != id {
		t.Fatalf("claimed %s, want %s", it.ID, id)
	}
	if out, err := q.Nack(ctx, it, claim.Permanent(errors.New("first death"))); err != nil || out != claim.Dead {
		t.Fatalf("first death of %s: %v %v", id, out, err)
	}
}

// crashClaim claims every vested item of q with a session that then dies
// (its row deleted, its claims released by the foreign key), so that items
// with one attempt have used it up without an ack or a nack.
func crashClaim(t *testing.T, pool *pgxpool.Pool, q *claim.Queue, want int) {
	t.Helper()
	ctx := context.Background()
	crashed, err := startSessionNoCleanup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < want {
		items, err := q.Claimer(crashed).Claim(ctx, claim.ClaimRequest{Max: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 0 {
			t.Fatalf("claimed %d items, want %d", got, want)
		}
		got += len(items)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, crashed); err != nil {
		t.Fatal(err)
	}
}

// waitExpired waits until n items of the queue are past their deadline.
func waitExpired(t *testing.T, pool *pgxpool.Pool, queue string, n int) {
	t.Helper()
	await.Until(t, fmt.Sprintf("%d items of %q to pass their deadlines by the database's clock", n, queue), func() (bool, string) {
		got := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND expires_at <= now()`, queue)
		return got >= n, fmt.Sprintf("%d passed", got)
	})
}

// An id that already died dies again through Nack, with a Permanent error
// and with its attempts used up, and every death is kept. (Schema version 3:
// the second death's move failed on the dead items' primary key, and the
// nack failed, leaving the item claimed.)
func TestReusedIDDiesAgainByNack(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	allowReuse(t, pool, q.Name())
	s := startSession(t, ctx, pool)
	id := uuid.New()
	dieOnce(t, q, s.ID(), id)

	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("second life")}); err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	out, err := q.Nack(ctx, it, claim.Permanent(errors.New("second death")))
	if err != nil || out != claim.Dead {
		t.Fatalf("second death (permanent) of a reused id: Nack = %v, %v; want Dead, nil", out, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id); n != 0 {
		t.Fatalf("the item is still in the items table (%d rows) after its second death", n)
	}

	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("third life"), MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	it = claimOne(t, q, s.ID())
	if out, err := q.Nack(ctx, it, errors.New("third death")); err != nil || out != claim.Dead {
		t.Fatalf("third death (attempts used up) of a reused id: Nack = %v, %v; want Dead, nil", out, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, d := range dead {
		if d.ID != id {
			t.Fatalf("dead item %s listed, want only %s", d.ID, id)
		}
		texts = append(texts, d.LastError)
	}
	if got := strings.Join(texts, ", "); got != "third death, second death, first death" {
		t.Fatalf("deaths listed: %q; want every death, the newest first", got)
	}
}

// The reaper moves a reused id that expired and one whose attempts were used
// up by a crash loop, and every other expired or crash-looped item of the
// queue with them. (Schema version 3: the batch with the reused id failed,
// and Reap stopped at that step: nothing was moved, ever.)
func TestReaperMovesReusedIDsAndTheRest(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	allowReuse(t, pool, q.Name())
	s := startSession(t, ctx, pool)
	expiring, looping := uuid.New(), uuid.New()
	dieOnce(t, q, s.ID(), expiring)
	dieOnce(t, q, s.ID(), looping)

	// The crash-loop path: the reused id and two others, one attempt each,
	// claimed by a session that dies.
	if _, err := q.Enqueue(ctx,
		claim.NewItem{ID: looping, Payload: []byte("loops again"), MaxAttempts: 1},
		claim.NewItem{Payload: []byte("loops"), MaxAttempts: 1},
		claim.NewItem{Payload: []byte("loops too"), MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	crashClaim(t, pool, q, 3)
	// The expiry path: the reused id and three others, never claimable
	// before their deadlines.
	items := []claim.NewItem{{ID: expiring, Payload: []byte("expires again"), Delay: time.Hour, TTL: 100 * time.Millisecond}}
	for i := range 3 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("expires ", i)), Delay: time.Hour, TTL: 100 * time.Millisecond})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, pool, q.Name(), 4)

	st, err := queuemaint.For(q).Reap(ctx)
	if err != nil || st.Dead != 3 || st.Expired != 4 {
		t.Fatalf("Reap = %+v, %v; want 3 crash-looped and 4 expired items moved, no error", st, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left in the items table, want 0", n)
	}
	for _, id := range []uuid.UUID{expiring, looping} {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id); n != 2 {
			t.Fatalf("%d deaths of the reused id %s, want 2", n, id)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != 9 {
		t.Fatalf("%d dead items, want 9", n)
	}
}

// refuse makes the database refuse to move the given ids to the dead items
// (a CHECK constraint on the dead items: the move of such an item fails for
// something about that item, as a conflict on the old primary key did).
func refuse(t *testing.T, pool *pgxpool.Pool, ids ...uuid.UUID) {
	t.Helper()
	list := make([]string, len(ids))
	for i, id := range ids {
		list[i] = "'" + id.String() + "'"
	}
	if _, err := pool.Exec(context.Background(), `ALTER TABLE crdbwork_dead_items ADD CONSTRAINT test_refuse
		CHECK (id NOT IN (`+strings.Join(list, ", ")+`))`); err != nil {
		t.Fatal(err)
	}
}

// allowAll drops refuse's constraint.
func allowAll(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `ALTER TABLE crdbwork_dead_items DROP CONSTRAINT test_refuse`); err != nil {
		t.Fatal(err)
	}
}

// An item the database refuses to move (in each moving step: crash loop
// and expiry) fails alone: Reap reports it, with its id, and still moves
// every other item of both steps, more than one batch of them; nothing is
// lost, and once the move is possible the next Reap moves it. (Schema
// version 3: Reap stopped at the first failing step, and the failing batch
// moved nothing.)
func TestReaperIsolatesAnItemThatCannotMove(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	badLoop, badExpiry := uuid.New(), uuid.New()
	refuse(t, pool, badLoop, badExpiry)

	loops := []claim.NewItem{{ID: badLoop, Payload: []byte("bad loop"), MaxAttempts: 1}}
	for i := range 5 {
		loops = append(loops, claim.NewItem{Payload: []byte(fmt.Sprint("loop ", i)), MaxAttempts: 1})
	}
	if _, err := q.Enqueue(ctx, loops...); err != nil {
		t.Fatal(err)
	}
	crashClaim(t, pool, q, len(loops))
	// The bad expiring item expires first, so every batch of the expiry
	// step meets it; the others are more than one batch (1000).
	const expiring = 1100
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: badExpiry, Payload: []byte("bad expiry"), Delay: time.Hour, TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, expiring)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint("expires ", i)), Delay: time.Hour, TTL: 100 * time.Millisecond}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, pool, q.Name(), expiring+1)

	st, err := queuemaint.For(q).Reap(ctx)
	if st.Dead != 5 || st.Expired != expiring {
		t.Fatalf("Reap = %+v (%v); want the 5 other crash-looped and %d other expired items moved", st, err, expiring)
	}
	if err == nil || !strings.Contains(err.Error(), badLoop.String()) || !strings.Contains(err.Error(), badExpiry.String()) {
		t.Fatalf("Reap's error %v: want both refused items named", err)
	}
	left := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id IN ($1, $2) AND claim IS NULL`, badLoop, badExpiry)
	if left != 2 || count(t, pool, `SELECT count(*) FROM crdbwork_items`) != 2 {
		t.Fatalf("items left: want exactly the two refused ones, unclaimed")
	}

	allowAll(t, pool)
	st, err = queuemaint.For(q).Reap(ctx)
	if err != nil || st.Dead != 1 || st.Expired != 1 {
		t.Fatalf("Reap once the moves are allowed = %+v, %v; want the two items moved", st, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != len(loops)+expiring+1 {
		t.Fatalf("%d dead items, want %d", n, len(loops)+expiring+1)
	}
}

// A nack whose move to the dead items fails for something about the item
// settles all the same: the claim ends, and the item is never handed out
// again (its attempts are used up) but stays in the items table for the
// reaper. (Schema version 3, with a reused id: the nack failed, and a
// worker retried it for ever while the item stayed claimed.)
func TestNackSettlesWhenTheMoveFails(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	bad := uuid.New()
	refuse(t, pool, bad)
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: bad, Payload: []byte("cannot die"), MaxAttempts: 5}); err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	_, nackErr := q.Nack(ctx, it, claim.Permanent(errors.New("broken for good")))
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL AND attempts >= max_attempts`, bad); n != 1 {
		t.Fatalf("after a nack whose move failed (%v): the item is not released with its attempts used up", nackErr)
	}
	if got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 0 {
		t.Fatalf("the item was handed out again: %d items, %v", len(got), err)
	}
	// A second nack of the same claim is refused: it was settled.
	if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("again"))); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("a second nack of the settled claim = %v, want ErrClaimLost", err)
	}
	allowAll(t, pool)
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.Dead != 1 {
		t.Fatalf("Reap = %+v, %v; want the held item moved", st, err)
	}
	dead, err := deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10}))
	if err != nil || len(dead) != 1 || dead[0].ID != bad {
		t.Fatalf("dead items %+v, %v", dead, err)
	}
}

// Requeue takes the newest death of an id that died twice and keeps the
// other as history; while the id is live it moves nothing and the dead item
// stays; once the live item ended, the older death can be requeued too.
// (Schema version 4 before the fix: the requeue moved both deaths, and the
// second insert failed on the items' primary key.)
func TestRequeueTakesTheNewestDeath(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	allowReuse(t, pool, q.Name())
	s := startSession(t, ctx, pool)
	id := uuid.New()
	dieOnce(t, q, s.ID(), id)
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("second life")}); err != nil {
		t.Fatal(err)
	}
	if out, err := q.Nack(ctx, claimOne(t, q, s.ID()), claim.Permanent(errors.New("second death"))); err != nil || out != claim.Dead {
		t.Fatalf("second death: %v %v", out, err)
	}

	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id})); err != nil || !ok {
		t.Fatalf("Requeue of an id with two deaths = %v, %v; want true, nil", ok, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND last_error = 'first death'`, id); n != 1 ||
		count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id) != 1 {
		t.Fatalf("after the requeue: want only the first death left as history")
	}
	it := claimOne(t, q, s.ID())
	if string(it.Payload) != "second life" || it.LastError != "second death" {
		t.Fatalf("requeued %q (last error %q), want the newest death", it.Payload, it.LastError)
	}
	// Live: refused, nothing moves.
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id})); err == nil || ok {
		t.Fatalf("Requeue while the id is live = %v, %v; want a refusal", ok, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id); n != 1 {
		t.Fatalf("%d deaths left after a refused requeue, want 1", n)
	}
	if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatal(err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id})); err != nil || !ok {
		t.Fatalf("Requeue of the older death once the live item ended = %v, %v", ok, err)
	}
	if it := claimOne(t, q, s.ID()); string(it.Payload) != "first life" {
		t.Fatalf("requeued %q, want the first death's item", it.Payload)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id})); err != nil || ok {
		t.Fatalf("Requeue with no death left (the id live) = %v, %v; want false, nil: not a dead item", ok, err)
	}
}
