package dashboard_test

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// The dead items' reason selector offers every reason an item can end
// with, and the filter takes them all: "dependency died" every dependent's
// death, "dependency died: <id start>" one prerequisite's. An unknown reason
// is a bad request, not an empty list (before: four reasons, exact match).
func TestDeadReasonFilterTakesEveryReason(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, last_error, reason)
		SELECT gen_random_uuid(), 'reports', 0, 0, 1, 1, '\x7b7d'::BYTEA, now(), 'e', r
		FROM unnest(ARRAY['failed', 'snoozed too often', 'dependency died: aaaaaaaa-0000-4000-8000-000000000001',
		                  'dependency died: aaaaaaaa-0000-4000-8000-000000000001', 'dependency died: bbbbbbbb-0000-4000-8000-000000000002',
		                  'refused by the database']) AS r`); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	rows := regexp.MustCompile(`<tr data-id="`)
	page := b.get("/items?queue=reports&state=dead")
	for _, r := range claim.Reasons() {
		if !strings.Contains(page, "<option>"+r+"</option>") {
			t.Errorf("the reason selector has no option %q", r)
		}
	}
	for reason, want := range map[string]int{
		"failed": 1, "snoozed too often": 1, "refused by the database": 1, "expired": 0,
		"dependency died": 3, "dependency died: aaaaaaaa": 2, "dependency died: bbbbbbbb-0000-4000-8000-000000000002": 1,
	} {
		page := b.get("/items?" + url.Values{"queue": {"reports"}, "state": {"dead"}, "reason": {reason}}.Encode())
		if n := len(rows.FindAllString(page, -1)); n != want {
			t.Errorf("reason %q: %d rows, want %d", reason, n, want)
		}
	}
	if code, _, _ := b.do("GET", "/items?"+url.Values{"queue": {"reports"}, "state": {"dead"}, "reason": {"dependency died: …"}}.Encode(), nil, nil); code != 400 {
		t.Errorf("an unknown reason: status %d, want 400", code)
	}
}
