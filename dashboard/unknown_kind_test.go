package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// A kind filter that no item has is an empty list on every view of the
// Items page (live, dead, cancelled; one queue or every queue), not an
// error, and a requeue by that filter moves nothing, as the CLI's --kind
// (crdbwork's TestUnknownKindIsAnEmptyResult).
func TestUnknownKindIsAnEmptyResult(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	ids := enqueue(t, pool, "shop", 2, func(i int, it *claim.NewItem) { it.Kind = "refund" })
	if _, err := claimQueue(t, pool, "shop").CancelItem(ctx, ids[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason, kind)
		VALUES (gen_random_uuid(), 'shop', 0, 0, 1, 1, '\x7b7d'::BYTEA, now(), 'failed', 'refund')`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	for _, q := range []string{"queue=shop", "", "queue=shop&state=dead", "state=dead", "queue=shop&state=cancelled"} {
		path := "/items?" + q
		if page := b.get(path + "&kind=refund"); !strings.Contains(page, `<tr data-id="`) {
			t.Fatalf("GET %s&kind=refund lists no item: the premise fails", path)
		}
		code, page, _ := b.do("GET", path+"&kind=nosuch", nil, nil)
		if code != http.StatusOK || strings.Contains(page, `<tr data-id="`) || !strings.Contains(page, "None") {
			t.Errorf("GET %s&kind=nosuch: %d, want 200 and no rows (None):\n%s", path, code, page)
		}
	}
	if code, text, _ := act(t, b, url.Values{"act": {"requeue-filter"}, "queue": {"shop"}, "kind": {"nosuch"}}); code != http.StatusSeeOther {
		t.Fatalf("requeue by an unknown kind: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'shop'`); n != 1 {
		t.Errorf("%d dead items after a requeue of an unknown kind, want 1", n)
	}
}
