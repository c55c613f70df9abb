package claim_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// Headers given at enqueue come back with the claim, by every enqueue path:
// the INSERT (with caller-given and generated ids), the COPY of many
// generated ids, EnqueueTx and a Buffer; items without headers have none.
func TestHeadersTravelFromEnqueueToClaim(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "hdr"})
	want := map[uuid.UUID]map[string]string{}
	add := func(res claim.Enqueued, items []claim.NewItem) {
		t.Helper()
		for i, id := range res.IDs {
			if !res.New[i] {
				t.Fatalf("item %d not added", i)
			}
			want[id] = items[i].Headers
		}
	}
	hdr := func(i int) map[string]string {
		return map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i+1, i+1), "x-note": "é \"quoted\" <tag>"}
	}
	// INSERT: a caller-given id, a generated one, one without headers.
	few := []claim.NewItem{{ID: uuid.New(), Payload: []byte("a"), Headers: hdr(0)}, {Payload: []byte("b"), Headers: hdr(1)}, {Payload: []byte("c")}}
	res, err := q.Enqueue(ctx, few...)
	if err != nil {
		t.Fatal(err)
	}
	add(res, few)
	// COPY: 100 generated ids.
	many := payloads(100)
	for i := range many {
		if i%3 != 0 {
			many[i].Headers = hdr(10 + i)
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
	inTx := []claim.NewItem{{Payload: []byte("tx"), Headers: hdr(500)}}
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
	buffered := []claim.NewItem{{Payload: []byte("buf"), Headers: hdr(600)}}
	if res, err = b.Enqueue(ctx, buffered[0]); err != nil {
		t.Fatal(err)
	}
	add(res, buffered)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}

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
			if len(w) == 0 && it.Headers != nil {
				t.Errorf("item %s: headers %v, want none", it.ID, it.Headers)
			}
			if len(w) > 0 && !maps.Equal(w, it.Headers) {
				t.Errorf("item %s: headers %v, want %v", it.ID, it.Headers, w)
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

// Headers that cannot be stored are refused before anything is written; a
// headers column written by hand with values that are not strings does not
// stop the item: the strings come through, the rest is left out.
func TestHeadersValidationAndLenientRead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "hdrbad"})
	for name, h := range map[string]map[string]string{
		"empty name": {"": "x"},
		"NUL":        {"a": "b\x00c"},
		"bad UTF-8":  {"a\xff": "b"},
		"too large":  {"big": strings.Repeat("x", claim.MaxHeadersBytes)},
	} {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), Headers: h}); err == nil {
			t.Errorf("%s: enqueued", name)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items after refused enqueues, want 0", n)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET headers = '{"a": "b", "n": 1, "o": {"x": "y"}}' WHERE id = $1`, res.IDs[0]); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v, %d items", err, len(items))
	}
	if !maps.Equal(items[0].Headers, map[string]string{"a": "b"}) {
		t.Errorf("headers %v, want only a=b", items[0].Headers)
	}
}

// recHooks records what a queue's Hooks see, and adds a header to every
// enqueued item (on copies).
type recHooks struct {
	claim.NoHooks
	mu    sync.Mutex
	steps []string
}

func (h *recHooks) Enqueue(ctx context.Context, queue string, items []claim.NewItem, next claim.EnqueueFunc) (claim.Enqueued, error) {
	cp := make([]claim.NewItem, len(items))
	for i, it := range items {
		it.Headers = maps.Clone(it.Headers)
		if it.Headers == nil {
			it.Headers = map[string]string{}
		}
		it.Headers["hooked"] = queue
		cp[i] = it
	}
	res, err := next(ctx, cp)
	h.mu.Lock()
	h.steps = append(h.steps, fmt.Sprintf("enqueue %d %v", len(items), err == nil))
	h.mu.Unlock()
	return res, err
}

func (h *recHooks) Step(ctx context.Context, s *claim.Step) func(error) {
	before := len(s.Items)
	return func(err error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.steps = append(h.steps, fmt.Sprintf("%s %s %d→%d %v", s.Kind, s.Queue, before, len(s.Items), err == nil))
	}
}

func (h *recHooks) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.steps...)
}

// Options.Hooks wraps every enqueue (and may add headers, without changing
// the caller's items) and is told of every claim, ack, nack and release,
// with their items and errors.
func TestHooksSeeEnqueuesAndSteps(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	h := &recHooks{}
	q := newQueue(t, pool, claim.Options{Queue: "hooked", Hooks: h})
	mine := []claim.NewItem{{Payload: []byte("1"), Headers: map[string]string{"k": "v"}}, {Payload: []byte("2")}, {Payload: []byte("3")}}
	if _, err := q.Enqueue(ctx, mine...); err != nil {
		t.Fatal(err)
	}
	if len(mine[0].Headers) != 1 || mine[1].Headers != nil {
		t.Fatalf("the hook changed the caller's items: %v, %v", mine[0].Headers, mine[1].Headers)
	}
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(items) != 3 {
		t.Fatalf("claim: %v, %d items", err, len(items))
	}
	for _, it := range items {
		if it.Headers["hooked"] != "hooked" {
			t.Errorf("item %s: headers %v, want hooked=hooked", it.ID, it.Headers)
		}
	}
	if errs := q.AckMany(ctx, []claim.AckRequest{{Item: items[0]}}, claim.AckOptions{}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if _, err := q.Nack(ctx, items[1], errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	if err := q.Release(ctx, items[2]); err != nil {
		t.Fatal(err)
	}
	// A lost claim: the ack step ends with its error.
	if err := q.Ack(ctx, items[0], nil); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("second ack: %v, want ErrClaimLost", err)
	}
	want := []string{"enqueue 3 true", "claim hooked 0→3 true", "ack hooked 1→1 true", "nack hooked 1→1 true",
		"release hooked 1→1 true", "ack hooked 1→1 false"}
	if got := h.got(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("hooks saw\n%v\nwant\n%v", got, want)
	}
	// EnqueueTx goes through the hook too.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{Payload: []byte("tx")}); err != nil {
		t.Fatal(err)
	}
	var hooked string
	if err := tx.QueryRow(ctx, `SELECT headers->>'hooked' FROM crdbwork_items WHERE payload = 'tx'`).Scan(&hooked); err != nil || hooked != "hooked" {
		t.Errorf("EnqueueTx: header %q, %v; want hooked", hooked, err)
	}
}

// badHooks passes on fewer items than it was given.
type badHooks struct{ claim.NoHooks }

func (badHooks) Enqueue(ctx context.Context, _ string, items []claim.NewItem, next claim.EnqueueFunc) (claim.Enqueued, error) {
	return next(ctx, items[:len(items)-1])
}

// A hook that drops items fails the enqueue, which then writes nothing.
func TestHooksMustPassEveryItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "bad", Hooks: badHooks{}})
	if _, err := q.Enqueue(ctx, payloads(2)...); err == nil {
		t.Fatal("enqueue succeeded with a hook that dropped an item")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items, want 0", n)
	}
}
