package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// The Items page shows each item's kind (claim.NewItem.Kind) and filters by
// it (kind=, exactly; the search text matches a kind's start too), in one
// queue or every queue, live items and dead ones; the item page shows it;
// and a requeue by filter takes the kind: only the dead items of that kind
// go back, their kind kept.
func TestItemsShowAndFilterKinds(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	shop := enqueue(t, pool, "shop", 4, func(i int, it *claim.NewItem) {
		it.Kind = []string{"order", "refund", "order", ""}[i]
	})
	enqueue(t, pool, "mail", 1, func(i int, it *claim.NewItem) { it.Kind = "refund" })
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, last_error, reason, kind)
		SELECT gen_random_uuid(), 'shop', 0, 0, 1, 3, '\x7b7d'::BYTEA, now(), 'no handler', 'unknown kind: ' || k, k
		FROM unnest(ARRAY['refund', 'refund', 'invoice']) AS k`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	rowsOf := func(path string) map[string]string { // id → kind cell
		out := map[string]string{}
		re := regexp.MustCompile(`(?s)<tr data-id="([^"]+)"[^>]*>.*?<td data-label="kind">([^<]*)</td>`)
		for _, m := range re.FindAllStringSubmatch(b.get(path), -1) {
			out[m[1]] = m[2]
		}
		return out
	}
	if got := rowsOf("/items?queue=shop"); len(got) != 4 || got[shop[0].String()] != "order" || got[shop[1].String()] != "refund" || got[shop[3].String()] != "" {
		t.Fatalf("the kinds of shop's items: %v", got)
	}
	for _, c := range []struct {
		query url.Values
		want  []string // kinds
	}{
		{url.Values{"queue": {"shop"}, "kind": {"order"}}, []string{"order", "order"}},
		{url.Values{"kind": {"refund"}}, []string{"refund", "refund"}}, // shop's and mail's
		{url.Values{"q": {"refu"}}, []string{"refund", "refund"}},
		{url.Values{"queue": {"shop"}, "kind": {"ord"}}, nil}, // exactly
		{url.Values{"queue": {"shop"}, "state": {"dead"}, "kind": {"refund"}}, []string{"refund", "refund"}},
		{url.Values{"state": {"dead"}, "q": {"inv"}}, []string{"invoice"}},
	} {
		var got []string
		for _, k := range rowsOf("/items?" + c.query.Encode()) {
			got = append(got, k)
		}
		if strings.Join(sortedCopy(got), ",") != strings.Join(c.want, ",") {
			t.Errorf("%v: kinds %v, want %v", c.query, got, c.want)
		}
	}
	if page := b.get("/item?id=" + shop[1].String()); !strings.Contains(page, `<dd id="item-kind">refund</dd>`) {
		t.Errorf("the item page does not show the kind:\n%s", page)
	}
	// The cancelled items of a kind.
	if _, err := claimQueue(t, pool, "shop").CancelItem(ctx, shop[0], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if _, err := claimQueue(t, pool, "shop").CancelItem(ctx, shop[1], claim.CancelOptions{By: "ops"}); err != nil {
		t.Fatal(err)
	}
	if got := rowsOf("/items?queue=shop&state=cancelled&kind=order"); len(got) != 1 || got[shop[0].String()] != "order" {
		t.Errorf("the cancelled items of kind order: %v, want %s", got, shop[0])
	}
	if code, text, _ := act(t, b, url.Values{"act": {"requeue-filter"}, "queue": {"shop"}, "kind": {"refund"}}); code != http.StatusSeeOther {
		t.Fatalf("requeue by kind: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'shop'`); n != 1 {
		t.Fatalf("%d dead items left, want 1 (the invoice)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'shop' AND kind = 'refund'`); n != 2 {
		t.Fatalf("%d refunds in shop, want 2 (the 2 requeued; the third was cancelled)", n)
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func claimQueue(t *testing.T, pool *pgxpool.Pool, name string) *claim.Queue {
	t.Helper()
	q, err := claim.New(pool, claim.Options{Queue: name})
	if err != nil {
		t.Fatal(err)
	}
	return q
}
