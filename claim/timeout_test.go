package claim_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// An item's own timeout (NewItem.Timeout) comes back with its claim by every
// enqueue path: the INSERT (caller-given and generated ids), the COPY of
// many generated ids, EnqueueTx, a Buffer, and a waiting item (After)
// released by its prerequisite's ack; items without one have none. It is
// stored at microsecond precision.
func TestItemTimeoutTravelsFromEnqueueToClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "timeouts"})
	want := map[uuid.UUID]time.Duration{}
	add := func(res claim.Enqueued, items []claim.NewItem) {
		t.Helper()
		for i, id := range res.IDs {
			if !res.New[i] {
				t.Fatalf("item %d not added", i)
			}
			want[id] = items[i].Timeout.Truncate(time.Microsecond)
		}
	}
	// INSERT: a caller-given id, a generated one, one without a timeout.
	few := []claim.NewItem{{ID: uuid.New(), Payload: []byte("a"), Timeout: 3 * time.Second},
		{Payload: []byte("b"), Timeout: 90*time.Minute + 1500*time.Nanosecond}, {Payload: []byte("c")}}
	res, err := q.Enqueue(ctx, few...)
	if err != nil {
		t.Fatal(err)
	}
	add(res, few)
	// COPY: 100 generated ids.
	many := payloads(100)
	for i := range many {
		if i%3 != 0 {
			many[i].Timeout = time.Duration(i+1) * time.Second
		}
	}
	if res, err = q.Enqueue(ctx, many...); err != nil {
		t.Fatal(err)
	}
	add(res, many)
	// EnqueueTx.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx := []claim.NewItem{{Payload: []byte("tx"), Timeout: 7 * time.Millisecond}}
	if res, err = q.EnqueueTx(ctx, tx, inTx...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	add(res, inTx)
	// A Buffer.
	b, err := claim.NewBuffer(q, claim.BufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buffered := []claim.NewItem{{Payload: []byte("buf"), Timeout: 11 * time.Second}}
	if res, err = b.Enqueue(ctx, buffered[0]); err != nil {
		t.Fatal(err)
	}
	add(res, buffered)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A waiting item, released when its prerequisite is acked below.
	pre := claim.NewItem{ID: uuid.New(), Payload: []byte("pre")}
	dep := claim.NewItem{Payload: []byte("dep"), Timeout: 13 * time.Second, After: []uuid.UUID{pre.ID}}
	if res, err = q.Enqueue(ctx, pre, dep); err != nil {
		t.Fatal(err)
	}
	add(res, []claim.NewItem{pre, dep})

	s := startSession(t, ctx, pool)
	seen := 0
	for {
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 50})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 0 {
			break
		}
		for _, it := range items {
			w, ok := want[it.ID]
			if !ok {
				t.Fatalf("claimed unknown item %s", it.ID)
			}
			if it.Timeout != w {
				t.Errorf("item %s (%s): timeout %v, want %v", it.ID, it.Payload, it.Timeout, w)
			}
			seen++
		}
		for _, it := range items {
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if seen != len(want) {
		t.Fatalf("claimed %d items, want %d", seen, len(want))
	}
}

// A timeout out of bounds is refused before anything is written.
func TestItemTimeoutValidation(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "bad-timeouts"})
	for _, d := range []time.Duration{-time.Second, time.Microsecond, claim.MaxTimeout + time.Second} {
		_, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("ok")}, claim.NewItem{Payload: []byte("x"), Timeout: d})
		if err == nil || !strings.Contains(err.Error(), "Timeout") {
			t.Errorf("timeout %v: %v, want an error about the Timeout", d, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items written by refused enqueues", n)
	}
}
