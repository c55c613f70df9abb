package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork item shows the kind of an item in every state that holds it:
// queued, waiting, dead and cancelled (the kind of the row its cancel kept
// for a requeue), in the text ("kind: X") and in --json (the top-level
// "kind", and the cancelled record's). An acked item's ended record holds
// no kind: neither shows one.
func TestItemShowsTheKindInEveryState(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q := d.queue(t, "shop", crsql.Tables{})
	enq, err := q.Enqueue(ctx,
		claim.NewItem{Kind: "refund", Payload: []byte(`{"order":1}`)},
		claim.NewItem{Kind: "invoice", Payload: []byte(`{"order":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	queued, cancelled := enq.IDs[0], enq.IDs[1]
	w, err := q.Enqueue(ctx, claim.NewItem{Kind: "report", After: []uuid.UUID{queued}, Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	waiting := w.IDs[0]
	if st, err := q.CancelItem(ctx, cancelled, claim.CancelOptions{By: "ops", Reason: "customer asked"}); err != nil {
		t.Fatalf("cancel: %v, %v", st, err)
	}
	dead := uuid.New()
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason, kind)
		VALUES ($1, 'shop', 0, 0, 1, 1, '\x7b7d'::BYTEA, now(), 'failed', 'receipt')`, dead); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id          uuid.UUID
		state, kind string
	}{
		{queued, "queued", "refund"},
		{waiting, "waiting", "report"},
		{dead, "dead", "receipt"},
		{cancelled, "cancelled", "invoice"},
	} {
		r := must(t, d.env, "item", c.id.String())
		if !strings.Contains(r.stdout, ": "+c.state+" in queue") || !strings.Contains(r.stdout, "  kind:        "+c.kind+"\n") {
			t.Errorf("item of the %s %s does not say \"kind: %s\":\n%s", c.state, c.id, c.kind, r.stdout)
		}
		j := jsonOf(t, must(t, d.env, "item", "--json", c.id.String()))
		if j["state"] != c.state || j["kind"] != c.kind {
			t.Errorf("item --json of the %s %s: state %v, kind %v, want %q", c.state, c.id, j["state"], j["kind"], c.kind)
		}
		if c.state == "cancelled" {
			ended, _ := j["ended"].([]any)
			if len(ended) != 1 || ended[0].(map[string]any)["kind"] != c.kind {
				t.Errorf("item --json of the cancelled item: ended %v, want its kind %q", j["ended"], c.kind)
			}
		}
	}
}
