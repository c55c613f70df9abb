package dashboard_test

import (
	"context"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/dashboard"
)

// On 100,000 unclaimed items in 20 queues, a search of every queue for a
// payload text that only the last item in the list holds reads one scan
// window (2,000 entries) per page and finds it by searching on, page after
// page, never more than a window at a time; a search of one key's prefix
// in one queue finds its items on the first page. The pages' times are
// logged, not asserted (docs/dashboard.md gives the figures).
func TestItemsSearchOn100kItemsIsWindowed(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, item_key, tenant, payload, vesting_at, turn_at)
		SELECT gen_random_uuid(), 'q' || lpad((g % 20)::TEXT, 2, '0'), 0, 'key-' || g::TEXT, 'tenant-' || (g % 300)::TEXT,
		       convert_to('{"order":' || g::TEXT || ',"to":"someone@example.com"}', 'UTF8'), now(), now() + g * INTERVAL '1 millisecond'
		FROM generate_series(1, 100000) AS g`); err != nil {
		t.Fatal(err)
	}
	// The needle: the last item of the last queue in list order.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET payload = convert_to('{"to":"needle@example.org"}', 'UTF8')
		WHERE id = (SELECT id FROM crdbwork_items WHERE queue = 'q19' ORDER BY priority DESC, turn_at DESC LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE crdbwork_items`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	scanned := regexp.MustCompile(`Searched ([0-9,]+) entries`)
	next := regexp.MustCompile(`id="next" href="\?([^"]+)"`)
	rows := regexp.MustCompile(`<tr data-id="`)
	path := "/items?" + url.Values{"q": {"needle@"}}.Encode()
	found, pages := 0, 0
	var slowest time.Duration
	var took []time.Duration
	for path != "" {
		pages++
		if pages > 100000/dashboard.DefaultScanWindow+2 {
			t.Fatalf("the search did not end after %d pages", pages)
		}
		start := time.Now()
		page := b.get(path)
		slowest = max(slowest, time.Since(start))
		took = append(took, time.Since(start))
		m := scanned.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("page %d does not say what it searched:\n%s", pages, page)
		}
		if n := strings.ReplaceAll(m[1], ",", ""); len(n) > 4 || n > "2000" && len(n) == 4 {
			t.Fatalf("page %d searched %s entries, more than the window of 2,000", pages, m[1])
		}
		found += len(rows.FindAllString(page, -1))
		path = ""
		if m := next.FindStringSubmatch(page); m != nil {
			path = "/items?" + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	// 50 windows hold the 100,000 items; a 51st may say that nothing follows.
	if want := 100000 / dashboard.DefaultScanWindow; found != 1 || pages < want || pages > want+1 {
		t.Errorf("the search of every queue found %d items in %d pages, want 1 in %d or %d", found, pages, want, want+1)
	}
	slices.Sort(took)
	t.Logf("every queue, payload text: %d pages of a 2,000-entry window, median %v, slowest %v", pages, took[len(took)/2], slowest)
	start := time.Now()
	page := b.get("/items?" + url.Values{"q": {"key-1000"}, "queue": {"q00"}}.Encode())
	t.Logf("one queue, key prefix, first page: %v", time.Since(start))
	// q00 holds the items of g % 20 = 0, 5,000 in the order of g: key-1000
	// (its 50th) and key-10000 (its 500th) are in the first window,
	// key-100000 (its last) is not.
	if n := len(rows.FindAllString(page, -1)); n != 2 || !strings.Contains(page, `id="next"`) {
		t.Errorf("key-1000 in q00, first window: %d rows, want 2 (key-1000, key-10000) and a link to search on", n)
	}
}
