package dashboard_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// The item page shows the kind of a cancelled item (the row its cancel
// kept for a requeue) and of a waiting one, as it does a live item's and a
// dead one's.
func TestItemPageShowsTheKindOfCancelledAndWaitingItems(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	ids := enqueue(t, pool, "shop", 2, func(i int, it *claim.NewItem) { it.Kind = []string{"refund", "invoice"}[i] })
	waiting := enqueue(t, pool, "shop", 1, func(i int, it *claim.NewItem) { it.Kind, it.After = "report", []uuid.UUID{ids[0]} })[0]
	if _, err := claimQueue(t, pool, "shop").CancelItem(ctx, ids[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	for _, c := range []struct {
		id          uuid.UUID
		state, kind string
	}{{ids[1], "cancelled", "invoice"}, {waiting, "waiting", "report"}} {
		page := b.get("/item?id=" + c.id.String())
		if !strings.Contains(page, `id="item-state">`+c.state) || !strings.Contains(page, `<dd id="item-kind">`+c.kind+`</dd>`) {
			t.Errorf("the page of the %s item does not show its kind %q:\n%s", c.state, c.kind, page)
		}
	}
}
