package dashboard_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/session"
)

// The item page shows the kind of a cancelled item, of a waiting one, of an
// acked one and of a taken (at-most-once) one, as it does a live item's
// and a dead one's; an ended record written without a kind (as code of
// versions 3 to 5 writes it) shows none.
func TestItemPageShowsTheKindOfEndedAndWaitingItems(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	ids := enqueue(t, pool, "shop", 2, func(i int, it *claim.NewItem) { it.Kind = []string{"refund", "invoice"}[i] })
	waiting := enqueue(t, pool, "shop", 1, func(i int, it *claim.NewItem) { it.Kind, it.After = "report", []uuid.UUID{ids[0]} })[0]
	if _, err := claimQueue(t, pool, "shop").CancelItem(ctx, ids[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	ended := enqueue(t, pool, "done", 2, func(i int, it *claim.NewItem) {
		it.Kind, it.AtMostOnce, it.Priority = []string{"payout", "notice"}[i], i == 1, -i
	})
	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	done := claimQueue(t, pool, "done")
	items, err := done.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(items) != 2 {
		t.Fatalf("claim: %d items, %v; want both", len(items), err)
	}
	for _, it := range items {
		if it.ID == ended[0] {
			if err := done.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('done', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	for _, c := range []struct {
		id          uuid.UUID
		state, kind string
	}{{ids[1], "cancelled", "invoice"}, {waiting, "waiting", "report"}, {ended[0], "acked", "payout"}, {ended[1], "taken", "notice"}, {old, "acked", "—"}} {
		page := b.get("/item?id=" + c.id.String())
		if !strings.Contains(page, `id="item-state">`+c.state) || !strings.Contains(page, `<dd id="item-kind">`+c.kind+`</dd>`) {
			t.Errorf("the page of the %s item does not show its kind %q:\n%s", c.state, c.kind, page)
		}
	}
}
