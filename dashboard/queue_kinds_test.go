package dashboard_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// A queue's page shows its items by kind (unclaimed, due, claimed, dead
// for each kind, the most unclaimed first, "(none)" for the items without
// a kind, each kind linked to its items) when the queue has more than one
// kind, and no such table for a queue of one kind.
func TestQueuePageShowsItemsByKind(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	enqueue(t, pool, "shop", 6, func(i int, it *claim.NewItem) { it.Kind = []string{"email", "email", "email", "sms", "", "report"}[i] })
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET vesting_at = now() + INTERVAL '1 hour' WHERE queue = 'shop' AND kind = 'report'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, reason, kind)
		VALUES (gen_random_uuid(), 'shop', 0, 0, 1, 1, '\x7b7d'::BYTEA, now(), 'failed', 'sms')`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "mail", 2, func(i int, it *claim.NewItem) { it.Kind = "digest" })
	b := newBrowser(t, srv.URL)
	page := b.get("/queue?name=shop")
	cells := regexp.MustCompile(`<tr data-kind="([^"]*)"><td>(?:<a href="[^"]*kind=[^"]*">)?([^<]*)(?:</a>)?</td><td>([^<]*)</td><td>([^<]*)</td><td>[^<]*</td><td>([^<]*)</td><td>([^<]*)</td></tr>`)
	var got []string
	for _, m := range cells.FindAllStringSubmatch(page, -1) {
		got = append(got, strings.Join([]string{m[1], m[2], m[3], m[4], m[5], m[6]}, " "))
	}
	want := []string{"email email 3 3 0 0", "sms sms 1 1 0 1", " (none) 1 1 0 0", "report report 1 0 0 0"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the queue page's kinds:\n got %q\nwant %q\n%s", got, want, page)
	}
	if !strings.Contains(page, `/items?kind=email&amp;queue=shop"`) {
		t.Errorf("the kind email does not link to its items:\n%s", page)
	}
	if page := b.get("/queue?name=mail"); strings.Contains(page, `id="q-kinds"`) {
		t.Errorf("the page of a queue of one kind shows the kinds:\n%s", page)
	}
}
