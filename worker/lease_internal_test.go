package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
)

// Extensions start at half the lease, are grouped in one statement, and
// never take a lease past its item's bound.
func TestLeaseExtensionsStayWithinBounds(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	t0 := time.Now()
	f := newFlights(lease)
	near := claim.Item{ID: uuid.New(), Token: 1}
	far := claim.Item{ID: uuid.New(), Token: 1}
	far2 := claim.Item{ID: uuid.New(), Token: 1}
	noop := func(error) {}
	f.add(near, t0, t0.Add(1500*time.Millisecond), noop)
	f.add(far, t0, t0.Add(time.Hour), noop)
	f.add(far2, t0, t0.Add(time.Hour), noop)

	if got := f.due(t0.Add(400 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("before half the lease: %d extensions, want none", len(got))
	}
	now := t0.Add(600 * time.Millisecond)
	got := f.due(now)
	if len(got) != 2 || len(got[0].items) != 2 || got[0].d != lease || len(got[1].items) != 1 || got[1].items[0].ID != near.ID {
		t.Fatalf("past half: %+v, want the two far items by a full lease, then the near one", got)
	}
	if end := now.Add(got[1].d); end.After(t0.Add(1500 * time.Millisecond)) {
		t.Fatalf("the near item's lease would end at +%v, past its bound +1.5s", end.Sub(t0))
	}
	f.extended(got[0].items, got[0].items, now, got[0].d)
	f.extended(got[1].items, got[1].items, now, got[1].d)
	// At its bound, the near item is not extended again; the far ones are
	// once past half of their new lease.
	now = t0.Add(1500 * time.Millisecond)
	for _, e := range f.due(now) {
		for _, it := range e.items {
			if it.ID == near.ID {
				t.Fatalf("item at its bound extended by %v", e.d)
			}
		}
	}
	// An extension that finds the claim gone cancels the handler.
	ctx, cancel := context.WithCancelCause(context.Background())
	lost := claim.Item{ID: uuid.New(), Token: 1}
	f.add(lost, t0, t0.Add(time.Hour), cancel)
	gone := f.extended([]claim.Item{lost}, nil, now, lease)
	f.lose(gone)
	if n := len(gone); n != 1 || !errors.Is(context.Cause(ctx), errLeaseLost) {
		t.Fatalf("lost claim: %d lost, cause %v; want 1 and errLeaseLost", n, context.Cause(ctx))
	}
	// A cancel request found first stays the handler's cause.
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	asked := claim.Item{ID: uuid.New(), Token: 4}
	f.add(asked, t0, t0.Add(time.Hour), cancel2)
	why := &claim.CancelledError{By: "ops", Reason: "wrong input"}
	if n := len(f.cancelled([]claim.CancelRequest{{ID: asked.ID, Token: 3, Cause: why}})); n != 0 {
		t.Fatalf("a request of another claim (token 3) cancelled %d handlers", n)
	}
	if n := len(f.cancelled([]claim.CancelRequest{{ID: asked.ID, Token: 4, Cause: why}})); n != 1 {
		t.Fatalf("cancel request: %d handlers cancelled, want 1", n)
	}
	f.lose(f.extended([]claim.Item{asked}, nil, now, lease))
	if ce, ok := Cancelled(ctx2); !ok || ce != why || !errors.Is(context.Cause(ctx2), claim.ErrCancelled) {
		t.Fatalf("cause after a cancel request and a failed extension: %v", context.Cause(ctx2))
	}
}
