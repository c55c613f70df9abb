package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The operator's commands know kinds (claim.NewItem.Kind): crdbwork dead
// shows them (KIND, "kind" in --json) and --kind and --reason "unknown
// kind: KIND" filter by them; crdbwork requeue --kind requeues only that
// kind's dead items, their kind kept; crdbwork cancelled shows the kind and
// --kind filters; crdbwork item shows it.
func TestKindsInTheCLI(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q := d.queue(t, "shop", crsql.Tables{})
	enq, err := q.Enqueue(ctx,
		claim.NewItem{Kind: "refund", Payload: []byte(`{"order":1}`)},
		claim.NewItem{Kind: "refund", Payload: []byte(`{"order":2}`)},
		claim.NewItem{Kind: "invoice", Payload: []byte(`{"order":3}`)})
	if err != nil {
		t.Fatal(err)
	}
	// A worker without those kinds' handlers: each ends dead.
	hb := await.Stretch(500 * time.Millisecond)
	s, err := session.Start(ctx, d.pool, session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(items) != 3 {
		t.Fatalf("claimed %d items, %v", len(items), err)
	}
	for _, it := range items {
		if out, err := q.Nack(ctx, it, &claim.UnknownKindError{Kind: it.Kind}); err != nil || out != claim.Dead {
			t.Fatalf("nack: %v, %v", out, err)
		}
	}

	r := must(t, d.env, "dead", "--queue", "shop", "--kind", "refund")
	if !strings.Contains(r.stdout, "KIND") || strings.Count(r.stdout, "unknown kind: refund") != 2 || strings.Contains(r.stdout, "invoice") {
		t.Errorf("dead --kind refund:\n%s", r.stdout)
	}
	m := jsonOf(t, must(t, d.env, "dead", "--queue", "shop", "--reason", "unknown kind: invoice", "--json"))
	list, _ := m["items"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["kind"] != "invoice" {
		t.Errorf("dead --reason \"unknown kind: invoice\" --json: %v", m)
	}
	if r := must(t, d.env, "dead", "--queue", "shop", "--reason", "unknown kind", "--count"); strings.TrimSpace(r.stdout) != "3" {
		t.Errorf("dead --reason \"unknown kind\" --count: %q, want 3", r.stdout)
	}
	want(t, d.env, 2, []string{"unknown kind: KIND"}, "dead", "--queue", "shop", "--reason", "unknown kinds")

	must(t, d.env, "requeue", "--queue", "shop", "--kind", "refund", "--yes")
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'shop' AND kind = 'refund'`); n != 2 {
		t.Fatalf("%d refunds requeued with their kind, want 2", n)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'shop'`); n != 1 {
		t.Fatalf("%d dead items left, want the invoice", n)
	}
	if r := must(t, d.env, "item", enq.IDs[0].String()); !strings.Contains(r.stdout, "kind:") || !strings.Contains(r.stdout, "refund") {
		t.Errorf("item of a refund:\n%s", r.stdout)
	}
	if r := must(t, d.env, "item", enq.IDs[2].String()); !strings.Contains(r.stdout, "invoice") {
		t.Errorf("item of the dead invoice:\n%s", r.stdout)
	}

	if _, err := q.CancelItem(ctx, enq.IDs[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	other, err := q.Enqueue(ctx, claim.NewItem{Kind: "order", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.CancelItem(ctx, other.IDs[0], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	r = must(t, d.env, "cancelled", "--queue", "shop", "--kind", "refund")
	if !strings.Contains(r.stdout, enq.IDs[1].String()) || !strings.Contains(r.stdout, `kind "refund"`) || strings.Contains(r.stdout, other.IDs[0].String()) {
		t.Errorf("cancelled --kind refund:\n%s", r.stdout)
	}
	if r := must(t, d.env, "cancelled", "--queue", "shop"); !strings.Contains(r.stdout, `kind "order"`) || !strings.Contains(r.stdout, `kind "refund"`) {
		t.Errorf("cancelled:\n%s", r.stdout)
	}
	// requeue --cancelled --kind: only that kind's kept items go back.
	want(t, d.env, 2, []string{"--yes"}, "requeue", "--queue", "shop", "--cancelled", "--kind", "order")
	want(t, d.env, 2, []string{"not both"}, "requeue", "--queue", "shop", "--cancelled", "--kind", "order", "--yes", other.IDs[0].String())
	must(t, d.env, "requeue", "--queue", "shop", "--cancelled", "--kind", "order", "--yes")
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND kind = 'order'`, other.IDs[0]); n != 1 {
		t.Errorf("the cancelled order is not back with its kind")
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, enq.IDs[1]); n != 0 {
		t.Errorf("the cancelled refund was requeued by --kind order")
	}
}
