package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// Tests of issue 16, "dead items keep every death", through real workers.
// They use only the API that existed before the fix, so that they can be run
// on the code of schema version 3 (where each of them fails).

// allowReuse turns the queue's dedup window off where the schema has one
// (version 4 and later), so that an id enqueued again after its item died
// is a new item.
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

// sessionRow starts a session by inserting its row (no heartbeats): its
// claims last until the row is deleted.
func sessionRow(t *testing.T, pool *pgxpool.Pool) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	if err := pool.QueryRow(context.Background(), `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// runs counts handler runs per payload, and fails items whose payload says
// "permanent" with a Permanent error.
type runs struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *runs) handler(ctx context.Context, it claim.Item) (worker.Record, error) {
	r.mu.Lock()
	r.n[string(it.Payload)]++
	r.mu.Unlock()
	if strings.HasPrefix(string(it.Payload), "permanent") {
		return nil, claim.Permanent(errors.New("broken for good"))
	}
	return nil, nil
}

func (r *runs) of(payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[payload]
}

// Ids that already died die again under a running worker, by each path: a
// Permanent failure (nack), a deadline (reaper), attempts used up by a crash
// loop (reaper); every other expired or crash-looped item of the queue is
// moved with them, and the rest is acked. (Schema version 3: the worker
// retried the reused id's nack for ever and it stayed claimed, and the
// reaper's crash-loop step failed on every pass, so that nothing of those
// steps was ever moved.)
func TestWorkerReusedIDsDieAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "deaths"
	allowReuse(t, pool, queue)
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	permanent, expiring, looping := uuid.New(), uuid.New(), uuid.New()
	first := sessionRow(t, pool)
	for _, id := range []uuid.UUID{permanent, expiring, looping} {
		if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("first life")}); err != nil {
			t.Fatal(err)
		}
		got, err := q.Claimer(first).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %d items, %v", len(got), err)
		}
		if out, err := q.Nack(ctx, got[0], claim.Permanent(errors.New("first death"))); err != nil || out != claim.Dead {
			t.Fatalf("first death: %v %v", out, err)
		}
	}

	// Crash loops: the reused id and two others, one attempt each, claimed
	// by a session that dies.
	if _, err := q.Enqueue(ctx,
		claim.NewItem{ID: looping, Payload: []byte("loop again"), MaxAttempts: 1},
		claim.NewItem{Payload: []byte("loop 1"), MaxAttempts: 1},
		claim.NewItem{Payload: []byte("loop 2"), MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	crashed := sessionRow(t, pool)
	if got, err := q.Claimer(crashed).Claim(ctx, claim.ClaimRequest{Max: 10}); err != nil || len(got) != 3 {
		t.Fatalf("crashed claim: %d items, %v", len(got), err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id IN ($1, $2)`, crashed, first); err != nil {
		t.Fatal(err)
	}
	// Expiries: the reused id and three others, never vested before their
	// deadlines. A permanent failure of the reused id, and work to ack.
	items := []claim.NewItem{
		{ID: expiring, Payload: []byte("expire again"), Delay: time.Hour, TTL: 100 * time.Millisecond},
		{ID: permanent, Payload: []byte("permanent again")},
	}
	for i := range 3 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("expire ", i)), Delay: time.Hour, TTL: 100 * time.Millisecond})
	}
	for i := range 5 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("ok ", i))})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}

	r := &runs{n: map[string]int{}}
	startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), r.handler, worker.Options{})
	waitFor(t, "every item to end (acked or dead)", 60*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	for _, id := range []uuid.UUID{permanent, expiring, looping} {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id); n != 2 {
			t.Errorf("%d deaths of the reused id %s, want 2", n, id)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != 3+1+3+4 {
		t.Errorf("%d dead items, want %d", n, 3+1+3+4)
	}
	if n := r.of("permanent again"); n != 1 {
		t.Errorf("the reused id's permanent failure ran %d times, want 1", n)
	}
	for i := range 5 {
		if n := r.of(fmt.Sprint("ok ", i)); n != 1 {
			t.Errorf("item ok %d ran %d times, want 1", i, n)
		}
	}
}

// A worker's nack whose move to the dead items fails for something about
// the item ends at once: the item is released, never handed out again, and
// the handler ran once; the other items die as usual. (Schema version 3,
// with a reused id: the worker retried the nack for ever while the item
// stayed claimed.)
func TestWorkerNackEndsWhenTheMoveFails(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "refused"
	bad := uuid.New()
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_dead_items ADD CONSTRAINT test_refuse CHECK (id <> '`+bad.String()+`')`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	items := []claim.NewItem{{ID: bad, Payload: []byte("permanent bad"), MaxAttempts: 5}}
	for i := range 3 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("permanent ", i))})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	r := &runs{n: map[string]int{}}
	w := startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), r.handler, worker.Options{})
	waitFor(t, "the refused item released with its attempts used up, the others dead", 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`) == 3 &&
			count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL AND attempts >= max_attempts`, bad) == 1
	})
	if n := r.of("permanent bad"); n != 1 {
		t.Errorf("the refused item's handler ran %d times, want 1", n)
	}
	if n := w.w.Stats().SettleRetries; n != 0 {
		t.Errorf("%d settle retries, want 0: the nack is settled by its first try", n)
	}
}

// A worker's reaper moves every expired item but one it cannot move, and
// logs that one with its id, pass after pass, without stopping its other
// work. (Schema version 3: the failing batch moved nothing, and the reaper
// logged only the batch's error.)
func TestWorkerReaperLogsAnItemItCannotMove(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "stuck"
	bad := uuid.New()
	if _, err := pool.Exec(ctx, `ALTER TABLE crdbwork_dead_items ADD CONSTRAINT test_refuse CHECK (id <> '`+bad.String()+`')`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	items := []claim.NewItem{{ID: bad, Payload: []byte("bad"), Delay: time.Hour, TTL: time.Millisecond}}
	for i := range 20 {
		items = append(items, claim.NewItem{Payload: []byte(fmt.Sprint("expire ", i)), Delay: time.Hour, TTL: 100 * time.Millisecond})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), (&runs{n: map[string]int{}}).handler, worker.Options{Logger: zap.New(core)})
	logged := func() bool {
		for _, e := range logs.All() {
			if e.ContextMap()["item"] == bad.String() && strings.Contains(e.Message, "cannot release or move") {
				return true
			}
		}
		return false
	}
	waitFor(t, "the other expired items moved and the stuck one logged with its id", 30*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`) == 20 && logged()
	})
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL`, bad); n != 1 {
		t.Fatalf("the stuck item is not in the items table, unclaimed")
	}
}

// A nack that fails for a reason a retry cannot fix (here the move to the
// dead items and the hold that replaces it are both refused) is not retried
// for ever: the attempt ends at once, logged, and the item's lease is left
// to release it. (Before: the worker retried the nack with backoff for as
// long as its session lived.)
func TestWorkerNackGivesUpWhenNothingCanSettleIt(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const queue = "unsettled"
	bad := uuid.New()
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: bad, Payload: []byte("permanent bad")}); err != nil {
		t.Fatal(err)
	}
	// The item may be claimed, never released again (NOT VALID: the
	// unclaimed row already there is not checked).
	for _, stmt := range []string{
		`ALTER TABLE crdbwork_dead_items ADD CONSTRAINT test_refuse CHECK (id <> '` + bad.String() + `')`,
		`ALTER TABLE crdbwork_items ADD CONSTRAINT test_hold CHECK (claim IS NOT NULL OR id <> '` + bad.String() + `') NOT VALID`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zap.WarnLevel)
	r := &runs{n: map[string]int{}}
	w := startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), r.handler, worker.Options{Logger: zap.New(core)})
	waitFor(t, "the nack given up, logged", 30*time.Second, func() bool {
		return logs.FilterMessageSnippet("a retry will not fix").Len() > 0
	})
	if st := w.w.Stats(); st.SettleRetries != 0 || st.InFlight != 0 {
		t.Errorf("settle retries %d, in flight %d; want 0 and 0: the nack was not retried and the slot is free", st.SettleRetries, st.InFlight)
	}
	if n := r.of("permanent bad"); n != 1 {
		t.Errorf("the handler ran %d times, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL`, bad); n != 1 {
		t.Errorf("the item is not left claimed for its lease to release")
	}
}
