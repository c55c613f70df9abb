package dashboard_test

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/await"
)

// stateCount reads the count of state beside the Items page's state
// selector ("" if none).
func stateCount(page, state string) string {
	m := regexp.MustCompile(`data-state="` + state + `"[^>]*>` + state + ` <b>([^<]*)</b>`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return m[1]
}

// The Items page lists every queue's items by default (before: "Pick a
// queue"), pages through them across queues with its cursor, shows the
// per-state counts of every queue or of the queue picked, and searches ids,
// keys and tenants by prefix and payloads by content, in the state chosen;
// a whole id opens the item's page.
func TestItemsListsEveryQueueWithCountsAndSearch(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{PageSize: 2})
	mail := enqueue(t, pool, "mail", 3, func(i int, it *claim.NewItem) {
		it.Key = fmt.Sprintf("order-%d", i+1)
		it.Payload = []byte(fmt.Sprintf(`{"to":"user%d@example.com"}`, i))
	})
	enqueue(t, pool, "reports", 2, func(i int, it *claim.NewItem) {
		it.Tenant = "acme"
		if i == 1 {
			it.Delay = time.Hour
		}
	})
	kill(t, pool, "audit", 1)
	b := newBrowser(t, srv.URL)
	ids := regexp.MustCompile(`<tr data-id="([^"]+)"`)
	listed := func(path string) []string {
		var out []string
		for _, m := range ids.FindAllStringSubmatch(b.get(path), -1) {
			out = append(out, m[1])
		}
		return out
	}

	// Every queue, paged by 2: the 5 unclaimed items, each once, mail's before reports'.
	var seen []string
	path := "/items"
	for pages := 0; path != ""; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		page := b.get(path)
		if strings.Contains(page, "Pick a queue.") || !strings.Contains(page, "<th>queue</th>") {
			t.Fatalf("the items page of every queue does not list them with their queue:\n%s", page)
		}
		for _, m := range ids.FindAllStringSubmatch(page, -1) {
			seen = append(seen, m[1])
		}
		path = ""
		if m := regexp.MustCompile(`id="next" href="\?([^"]+)"`).FindStringSubmatch(page); m != nil {
			path = "/items?" + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	isMail := map[string]bool{mail[0].String(): true, mail[1].String(): true, mail[2].String(): true}
	if len(seen) != 5 || !isMail[seen[0]] || !isMail[seen[1]] || !isMail[seen[2]] || isMail[seen[3]] || isMail[seen[4]] {
		t.Fatalf("every queue's pages listed %v, want mail's 3 items (%v) then reports' 2", seen, mail)
	}
	dup := map[string]bool{}
	for _, id := range seen {
		if dup[id] {
			t.Fatalf("item %s on two pages", id)
		}
		dup[id] = true
	}

	// The counts beside the state selector, of every queue and of one (from
	// the sampler's reading: awaited).
	want := map[string]map[string]string{
		"":        {"unclaimed": "5", "due": "4", "scheduled": "1", "claimed": "0", "dead": "1"},
		"reports": {"unclaimed": "2", "due": "1", "scheduled": "1", "claimed": "0", "dead": "0"},
	}
	for queue, counts := range want {
		await.Until(t, "the counts of "+queue, func() (bool, string) {
			page := b.get("/items?" + url.Values{"queue": {queue}}.Encode())
			var got []string
			ok := true
			for _, s := range []string{"unclaimed", "due", "scheduled", "claimed", "dead"} {
				c := stateCount(page, s)
				got = append(got, s+"="+c)
				ok = ok && c == counts[s]
			}
			return ok, strings.Join(got, " ")
		})
	}

	// Search: id prefix, key prefix, tenant prefix, payload content; in
	// one queue or all; dead items too.
	for _, c := range []struct {
		query url.Values
		want  int
	}{
		{url.Values{"q": {mail[1].String()[:8]}}, 1},
		{url.Values{"q": {"order-"}}, 2}, // of 3: a page holds 2
		{url.Values{"q": {"order-2"}}, 1},
		{url.Values{"q": {"acm"}}, 2},
		{url.Values{"q": {"user2@example"}}, 1},
		{url.Values{"q": {"example.com"}, "queue": {"mail"}}, 2}, // of 3
		{url.Values{"q": {"example.com"}, "queue": {"reports"}}, 0},
		{url.Values{"q": {"nothing like it"}}, 0},
		{url.Values{"q": {"key-1"}, "state": {"dead"}}, 1},
		{url.Values{"q": {"{}"}, "state": {"dead"}, "queue": {"audit"}}, 1},
		{url.Values{"q": {"order-"}, "state": {"dead"}}, 0},
		{url.Values{"q": {"acme"}, "state": {"scheduled"}}, 1},
	} {
		if got := listed("/items?" + c.query.Encode()); len(got) != c.want {
			t.Errorf("search %v: %d rows %v, want %d", c.query, len(got), got, c.want)
		}
	}
	// The search text is shown escaped.
	if page := b.get("/items?" + url.Values{"q": {`<b>"x`}}.Encode()); strings.Contains(page, `<b>"x`) || !strings.Contains(page, `&lt;b&gt;&#34;x`) {
		t.Errorf("the search text is not escaped in the page")
	}
	// A whole id opens its page.
	code, _, hdr := b.do("GET", "/items?"+url.Values{"q": {mail[2].String()}}.Encode(), nil, nil)
	if code != 303 || hdr.Get("Location") != "/item?id="+mail[2].String() {
		t.Errorf("a whole id: %d to %q, want 303 to its item page", code, hdr.Get("Location"))
	}
}

// The cancelled items are listed per queue: in the list of every queue the
// page asks for one instead of failing.
func TestItemsCancelledOfEveryQueueAsksForAQueue(t *testing.T) {
	t.Parallel()
	_, srv := setup(t, dashboard.Options{})
	page := newBrowser(t, srv.URL).get("/items?state=cancelled")
	if !strings.Contains(page, `id="pick-queue"`) {
		t.Errorf("the cancelled items of every queue do not ask for a queue:\n%s", page)
	}
}
