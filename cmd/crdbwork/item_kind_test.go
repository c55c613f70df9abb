package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork item shows the kind of an item in every state that holds it:
// queued, waiting, dead, cancelled, acked and taken (an at-most-once item
// handed out by its claim: its ended record keeps the kind), in the text
// ("kind: X") and in --json (the top-level "kind", and the ended
// record's). An ended record written without a kind, as code of versions
// 3 to 5 writes it, shows none.
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
	acked, taken := endOne(t, d, claim.NewItem{Kind: "payout", Payload: []byte(`{}`)}), endOne(t, d, claim.NewItem{Kind: "notice", Payload: []byte(`{}`), AtMostOnce: true})
	for _, c := range []struct {
		id          uuid.UUID
		state, kind string
	}{
		{queued, "queued", "refund"},
		{waiting, "waiting", "report"},
		{dead, "dead", "receipt"},
		{cancelled, "cancelled", "invoice"},
		{acked, "acked", "payout"},
		{taken, "taken", "notice"},
	} {
		r := must(t, d.env, "item", c.id.String())
		if !strings.Contains(r.stdout, ": "+c.state+" in queue") || !strings.Contains(r.stdout, "  kind:        "+c.kind+"\n") {
			t.Errorf("item of the %s %s does not say \"kind: %s\":\n%s", c.state, c.id, c.kind, r.stdout)
		}
		j := jsonOf(t, must(t, d.env, "item", "--json", c.id.String()))
		if j["state"] != c.state || j["kind"] != c.kind {
			t.Errorf("item --json of the %s %s: state %v, kind %v, want %q", c.state, c.id, j["state"], j["kind"], c.kind)
		}
		if c.state == "cancelled" || c.state == "acked" || c.state == "taken" {
			ended, _ := j["ended"].([]any)
			if len(ended) != 1 || ended[0].(map[string]any)["kind"] != c.kind {
				t.Errorf("item --json of the %s item: ended %v, want its kind %q", c.state, j["ended"], c.kind)
			}
		}
	}
	old := uuid.New()
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('done', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	r := must(t, d.env, "item", old.String())
	if !strings.Contains(r.stdout, ": acked in queue") || strings.Contains(r.stdout, "kind:") {
		t.Errorf("item of an ended record without a kind: want acked, no kind:\n%s", r.stdout)
	}
	if j := jsonOf(t, must(t, d.env, "item", "--json", old.String())); j["state"] != "acked" || j["kind"] != nil {
		t.Errorf("item --json of an ended record without a kind: state %v, kind %v; want acked, none", j["state"], j["kind"])
	}
}

// endOne enqueues it into queue "done" and claims it; an at-most-once item
// is then taken (its claim handed it out), any other acked.
func endOne(t *testing.T, d *db, it claim.NewItem) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	q := d.queue(t, "done", crsql.Tables{})
	res, err := q.Enqueue(ctx, it)
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, d.pool, session.Options{Name: "kinds"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	var got claim.Item
	await.Until(t, "the item to be claimed", func() bool {
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(items) == 1 {
			got = items[0]
		}
		return len(items) == 1
	})
	if got.ID != res.IDs[0] {
		t.Fatalf("claimed %s, want %s", got.ID, res.IDs[0])
	}
	if !it.AtMostOnce {
		if err := q.Ack(ctx, got, nil); err != nil {
			t.Fatal(err)
		}
	}
	return got.ID
}
