package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

type mailArgs struct {
	To string `json:"to"`
}

func (mailArgs) Kind() string { return "mail" }

type emptyKind struct{}

func (emptyKind) Kind() string { return "" }

type badJSON struct{ C chan int }

func (badJSON) Kind() string { return "bad" }

// ArgsItem makes the item of typed arguments: their kind and their JSON;
// a nil pointer, an empty kind, or a value JSON cannot encode is an error
// wrapping ErrBadArgs.
func TestArgsItem(t *testing.T) {
	t.Parallel()
	it, err := claim.ArgsItem(mailArgs{To: "ada"})
	if err != nil || it.Kind != "mail" || string(it.Payload) != `{"to":"ada"}` {
		t.Fatalf("ArgsItem: %+v, %v", it, err)
	}
	var nilMail *mailArgs
	for _, bad := range []claim.Args{nil, nilMail, emptyKind{}, badJSON{C: make(chan int)}} {
		if _, err := claim.ArgsItem(bad); !errors.Is(err, claim.ErrBadArgs) {
			t.Errorf("ArgsItem(%#v): %v, want ErrBadArgs", bad, err)
		}
	}
}

// A kind out of bounds (too long, not UTF-8, with a NUL byte) is refused
// before anything is written; the longest kind is taken.
func TestKindValidation(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "bad-kinds"})
	for _, k := range []string{strings.Repeat("k", claim.MaxKindLength+1), "\xff", "a\x00b"} {
		_, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("ok")}, claim.NewItem{Payload: []byte("x"), Kind: k})
		if err == nil || !strings.Contains(err.Error(), "kind") {
			t.Errorf("kind %q: %v, want an error about the kind", k, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items written by refused enqueues", n)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), Kind: strings.Repeat("k", claim.MaxKindLength)}); err != nil {
		t.Fatalf("a kind of MaxKindLength bytes: %v", err)
	}
}

// An item's kind comes back with its claim by every enqueue path (INSERT,
// COPY, EnqueueTx, a Buffer, a waiting item released by its prerequisite's
// ack, the SQL function), and travels with the item: a death keeps it
// (DeadItem.Kind), a requeue from the dead items or from the cancelled
// items gives it back.
func TestKindTravelsWithTheItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "kinds"})
	want := map[uuid.UUID]string{}
	add := func(res claim.Enqueued, items []claim.NewItem) {
		t.Helper()
		for i, id := range res.IDs {
			if !res.New[i] {
				t.Fatalf("item %d not added", i)
			}
			want[id] = items[i].Kind
		}
	}
	few := []claim.NewItem{{ID: uuid.New(), Payload: []byte("a"), Kind: "mail"}, {Payload: []byte("b"), Kind: "resize"}, {Payload: []byte("c")}}
	res, err := q.Enqueue(ctx, few...)
	if err != nil {
		t.Fatal(err)
	}
	add(res, few)
	many := payloads(100) // COPY
	for i := range many {
		if i%3 != 0 {
			many[i].Kind = fmt.Sprintf("k%d", i%7)
		}
	}
	if res, err = q.Enqueue(ctx, many...); err != nil {
		t.Fatal(err)
	}
	add(res, many)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx := []claim.NewItem{{Payload: []byte("tx"), Kind: "tx"}}
	if res, err = q.EnqueueTx(ctx, tx, inTx...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	add(res, inTx)
	b, err := claim.NewBuffer(q, claim.BufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buffered := []claim.NewItem{{Payload: []byte("buf"), Kind: "buffered"}}
	if res, err = b.Enqueue(ctx, buffered[0]); err != nil {
		t.Fatal(err)
	}
	add(res, buffered)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pre := claim.NewItem{ID: uuid.New(), Payload: []byte("pre")}
	dep := claim.NewItem{Payload: []byte("dep"), Kind: "waiting", After: []uuid.UUID{pre.ID}}
	if res, err = q.Enqueue(ctx, pre, dep); err != nil {
		t.Fatal(err)
	}
	add(res, []claim.NewItem{pre, dep})
	var sqlID uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT item_id FROM crdbwork_enqueue(`+testdb.EnqueueArgs("'kinds'", "'{}'::BYTEA", "kind", "'from-sql'")+`)`).Scan(&sqlID); err != nil {
		t.Fatal(err)
	}
	want[sqlID] = "from-sql"

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
			if it.Kind != w {
				t.Errorf("item %s (%s): kind %q, want %q", it.ID, it.Payload, it.Kind, w)
			}
			seen++
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if seen != len(want) {
		t.Fatalf("claimed %d items, want %d", seen, len(want))
	}

	// A death keeps the kind; a requeue gives it back.
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("dies"), Kind: "mail", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	it := claimOne(t, q, s.ID())
	if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("no"))); err != nil {
		t.Fatal(err)
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{})
	if err != nil || len(page.Items) != 1 || page.Items[0].Kind != "mail" {
		t.Fatalf("dead items: %+v, %v; want one of kind mail", page.Items, err)
	}
	if r, err := q.Requeue(ctx, claim.RequeueOptions{ID: res.IDs[0]}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue: %+v, %v", r, err)
	}
	if it := claimOne(t, q, s.ID()); it.ID != res.IDs[0] || it.Kind != "mail" {
		t.Fatalf("the requeued item: %s of kind %q, want %s of kind mail", it.ID, it.Kind, res.IDs[0])
	} else if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatal(err)
	}

	// A cancel keeps it too (for a requeue from the cancelled items).
	if res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("cancelled"), Kind: "resize"}); err != nil {
		t.Fatal(err)
	}
	if r, err := q.CancelItem(ctx, res.IDs[0], claim.CancelOptions{By: "test"}); err != nil || !r.Found {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	if r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: res.IDs[0]}); err != nil || r.Requeued != 1 {
		t.Fatalf("requeue of the cancelled item: %+v, %v", r, err)
	}
	if it := claimOne(t, q, s.ID()); it.ID != res.IDs[0] || it.Kind != "resize" {
		t.Fatalf("the requeued cancelled item: %s of kind %q, want %s of kind resize", it.ID, it.Kind, res.IDs[0])
	} else if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatal(err)
	}
}

// Nack of an UnknownKindError or an ArgsError ends the item dead at its
// first attempt of many, with the reason that names its kind; the reasons
// filter the dead items: "unknown kind" every kind, "unknown kind: a" kind
// a only (not kind ab), and DeadFilter.Kind the kind whatever the reason.
func TestKindDeaths(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "kind-deaths"})
	s := startSession(t, ctx, pool)
	causes := map[string]error{
		"a":    &claim.UnknownKindError{Kind: "a"},
		"ab":   fmt.Errorf("wrapped: %w", &claim.UnknownKindError{Kind: "ab"}),
		"mail": &claim.ArgsError{Kind: "mail", Err: errors.New("invalid character 'x'")},
	}
	for kind := range causes {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), Kind: kind, MaxAttempts: 10}); err != nil {
			t.Fatal(err)
		}
	}
	for range causes {
		it := claimOne(t, q, s.ID())
		out, err := q.Nack(ctx, it, causes[it.Kind])
		if err != nil || out != claim.Dead {
			t.Fatalf("nack of kind %q: %v, %v; want Dead at the first of 10 attempts", it.Kind, out, err)
		}
	}
	for _, c := range []struct {
		f    claim.DeadFilter
		want []string // kinds
	}{
		{claim.DeadFilter{Reason: "unknown kind"}, []string{"a", "ab"}},
		{claim.DeadFilter{Reason: "unknown kind: a"}, []string{"a"}},
		{claim.DeadFilter{Reason: "unknown kind: ab"}, []string{"ab"}},
		{claim.DeadFilter{Reason: "bad arguments"}, []string{"mail"}},
		{claim.DeadFilter{Reason: "bad arguments: mail"}, []string{"mail"}},
		{claim.DeadFilter{Kind: "ab"}, []string{"ab"}},
		{claim.DeadFilter{Kind: "a", Reason: "unknown kind"}, []string{"a"}},
		{claim.DeadFilter{Reason: claim.ReasonFailed}, nil},
	} {
		page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: c.f, Count: true})
		if err != nil {
			t.Fatalf("%+v: %v", c.f, err)
		}
		var got []string
		for _, d := range page.Items {
			got = append(got, d.Kind)
			wantReason := claim.ReasonUnknownKind + d.Kind
			if d.Kind == "mail" {
				wantReason = claim.ReasonBadArgs + "mail"
				if !strings.Contains(d.LastError, "invalid character 'x'") {
					t.Errorf("the bad arguments' last error %q does not give the decoder's", d.LastError)
				}
			}
			if d.Reason != wantReason || d.Attempts != 1 {
				t.Errorf("death of kind %q: reason %q after %d attempts, want %q after 1", d.Kind, d.Reason, d.Attempts, wantReason)
			}
			if c.f.Reason != "" && !claim.MatchReason(c.f.Reason, d.Reason) {
				t.Errorf("MatchReason(%q, %q) is false for a listed death", c.f.Reason, d.Reason)
			}
		}
		if fmt.Sprint(sortedStrings(got)) != fmt.Sprint(c.want) || page.Count != int64(len(c.want)) {
			t.Errorf("%+v: kinds %v (count %d), want %v", c.f, got, page.Count, c.want)
		}
	}
	if claim.MatchReason("unknown kind: a", "unknown kind: ab") {
		t.Error(`MatchReason("unknown kind: a", "unknown kind: ab") is true`)
	}
	if _, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: claim.DeadFilter{Reason: "unknown kind: a", Kind: "b"}}); !errors.Is(err, claim.ErrUnknownReason) {
		t.Errorf("a reason that names another kind than the filter's: %v, want ErrUnknownReason", err)
	}
	// Requeue by reason moves the unknown kinds' items back, kinds kept.
	if r, err := q.Requeue(ctx, claim.RequeueOptions{Filter: claim.DeadFilter{Reason: "unknown kind"}}); err != nil || r.Requeued != 2 {
		t.Fatalf("requeue of the unknown kinds: %+v, %v", r, err)
	}
	var kinds []string
	for range 2 {
		it := claimOne(t, q, s.ID())
		kinds = append(kinds, it.Kind)
		if err := q.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(sortedStrings(kinds)) != "[a ab]" {
		t.Fatalf("requeued kinds %v, want [a ab]", kinds)
	}
}

func sortedStrings(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// Requeue of the cancelled items takes a kind (Filter.Kind, without an ID):
// only the kept cancelled items of that kind go back, their kind kept; a
// Filter with more than a kind, or an ID beside the kind, is refused.
func TestRequeueCancelledOfAKind(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "cancelled-kinds"})
	res, err := q.Enqueue(ctx, claim.NewItem{Kind: "a", Payload: []byte("1")}, claim.NewItem{Kind: "b", Payload: []byte("2")},
		claim.NewItem{Kind: "a", Payload: []byte("3")}, claim.NewItem{Payload: []byte("4")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range res.IDs {
		if r, err := q.CancelItem(ctx, id, claim.CancelOptions{By: "test"}); err != nil || !r.Found {
			t.Fatalf("cancel: %+v, %v", r, err)
		}
	}
	page, err := q.CancelledItems(ctx, claim.CancelledQuery{Kind: "a"})
	if err != nil || len(page.Items) != 2 || page.Items[0].Kind != "a" || page.Items[1].Kind != "a" {
		t.Fatalf("cancelled items of kind a: %+v, %v", page.Items, err)
	}
	for _, bad := range []claim.RequeueOptions{
		{Cancelled: true, Filter: claim.DeadFilter{Kind: "a", Tenant: "t"}},
		{Cancelled: true, Filter: claim.DeadFilter{Kind: "a"}, ID: res.IDs[0]},
	} {
		if _, err := q.Requeue(ctx, bad); err == nil {
			t.Errorf("Requeue(%+v) was not refused", bad)
		}
	}
	r, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, Filter: claim.DeadFilter{Kind: "a"}})
	if err != nil || r.Requeued != 2 {
		t.Fatalf("requeue of the cancelled items of kind a: %+v, %v", r, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE kind = 'a'`); n != 2 {
		t.Fatalf("%d items of kind a back, want 2", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 2 {
		t.Fatalf("%d items back, want only the 2 of kind a", n)
	}
}
