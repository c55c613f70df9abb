package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// An ended item keeps its kind: Item and Items (StateAcked) show the kind
// of an acked item and of a taken (at-most-once) one, Item that of a dead
// item whose dead row is gone (its ended record says dead); an item
// without a kind, and an ended record written without one (as code of
// versions 3 to 5 writes it), show none. Items with StateAcked or
// StateCancelled and a Kind lists that kind's ended items only.
func TestEndedItemsKeepTheirKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testschema.New(t)
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "kinds"})
	enqueue := func(it claim.NewItem) uuid.UUID {
		t.Helper()
		res, err := q.Enqueue(ctx, it)
		if err != nil {
			t.Fatal(err)
		}
		return res.IDs[0]
	}
	acked := enqueue(claim.NewItem{Kind: "refund", Payload: []byte(`{}`)})
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), acked)})
	plain := enqueue(claim.NewItem{Payload: []byte(`{}`)})
	ackAll(t, q, []claim.Item{claimThis(t, q, s.ID(), plain)})
	taken := enqueue(claim.NewItem{Kind: "report", Payload: []byte(`{}`), AtMostOnce: true})
	if it := claimThis(t, q, s.ID(), taken); it.Kind != "report" {
		t.Fatalf("the claim of the at-most-once item: kind %q, want report", it.Kind)
	}
	dead := enqueue(claim.NewItem{Kind: "invoice", Payload: []byte(`{}`), MaxAttempts: 1})
	if _, err := q.Nack(ctx, claimThis(t, q, s.ID(), dead), errors.New("once")); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_dead_items WHERE id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	old := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('kinds', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]struct {
		state claim.ItemState
		kind  string
	}{
		acked: {claim.StateAcked, "refund"}, plain: {claim.StateAcked, ""}, taken: {claim.StateTaken, "report"},
		dead: {claim.StateDead, "invoice"}, old: {claim.StateAcked, ""},
	}
	for id, w := range want {
		it, err := q.Item(ctx, id)
		if err != nil || it.State != w.state || it.Kind != w.kind {
			t.Errorf("Item of the %s item of kind %q: state %s kind %q, %v", w.state, w.kind, it.State, it.Kind, err)
		}
	}
	page, err := q.Items(ctx, claim.ItemQuery{State: claim.StateAcked, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	for _, it := range page.Items {
		w, ok := want[it.ID]
		if !ok || w.state == claim.StateDead {
			t.Errorf("the acked list has %s (%s), not an acked or taken item", it.ID, it.State)
			continue
		}
		listed++
		if it.State != w.state || it.Kind != w.kind {
			t.Errorf("the acked list: %s %s kind %q; want %s kind %q", it.ID, it.State, it.Kind, w.state, w.kind)
		}
	}
	if listed != 4 {
		t.Errorf("the acked list has %d of the 4 acked and taken items", listed)
	}
	for kind, ids := range map[string][]uuid.UUID{"refund": {acked}, "report": {taken}, "invoice": nil, "nothing": nil} {
		page, err := q.Items(ctx, claim.ItemQuery{State: claim.StateAcked, Kind: kind, Limit: 10})
		if err != nil || len(page.Items) != len(ids) || (len(ids) == 1 && page.Items[0].ID != ids[0]) {
			t.Errorf("the acked items of kind %q: %+v, %v; want %v", kind, page.Items, err, ids)
		}
	}
	cancelled := enqueue(claim.NewItem{Kind: "refund", Payload: []byte(`{}`)})
	if _, err := q.CancelItem(ctx, cancelled, claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	// A cancelled item of another kind.
	if _, err := q.CancelItem(ctx, enqueue(claim.NewItem{Kind: "report", Payload: []byte(`{}`)}), claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	page, err = q.Items(ctx, claim.ItemQuery{State: claim.StateCancelled, Kind: "refund", Limit: 10})
	if err != nil || len(page.Items) != 1 || page.Items[0].ID != cancelled || page.Items[0].Kind != "refund" {
		t.Errorf("the cancelled items of kind refund: %+v, %v; want %s alone", page.Items, err, cancelled)
	}
	for name, bad := range map[string]claim.ItemQuery{
		"key of acked": {State: claim.StateAcked, Kind: "refund", Key: "k"}, "tenant of cancelled": {State: claim.StateCancelled, Tenant: "t"},
	} {
		if _, err := q.Items(ctx, bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
