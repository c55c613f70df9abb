package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestOperatorViews: in a browser, a drained queue stays on the overview
// with its last activity; the dead items' reason selector offers every
// reason and "dependency died" selects every dependent's death; the part
// map of a queue no session works in parts mode is no alarm, while the
// worked queue's unowned parts still are.
func TestOperatorViews(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	// mail: worked in parts mode (4 parts) by one worker.
	f := newFleet(t, pool)
	f.start("w1")
	f.enqueue("ok", "ok")
	// reports: drained by hand (two acks, a permanent death); plain: three
	// parts set up, two items nobody claims yet, no session in parts mode.
	s, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	reports, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reports.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")}, claim.NewItem{Payload: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	items, err := reports.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(items) != 3 {
		t.Fatalf("claiming reports: %d, %v", len(items), err)
	}
	for _, it := range items[:2] {
		if err := reports.Ack(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reports.Nack(ctx, items[2], claim.Permanent(errors.New("broken"))); err != nil {
		t.Fatal(err)
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "plain", 3); err != nil { // parts set up, no session works them
		t.Fatal(err)
	}
	plain, err := claim.New(pool, claim.Options{Queue: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Enqueue(ctx, claim.NewItem{Payload: []byte("x"), Delay: time.Hour}, claim.NewItem{Payload: []byte("y"), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// pipeline's dead items, one per reason kind.
	pre := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, last_error, reason)
		SELECT gen_random_uuid(), 'pipeline', 0, 0, 1, 1, '\x7b7d'::BYTEA, now(), 'e', r
		FROM unnest(ARRAY['failed', 'snoozed too often', 'dependency died: `+pre.String()+`', 'dependency died: `+pre.String()+`']) AS r`); err != nil {
		t.Fatal(err)
	}
	base := serve(t, pool, dashboard.Options{})
	bctx := newBrowser(t, 1280, 900)

	run(t, bctx, "open the overview", chromedp.Navigate(base+"/"))
	eventually(t, "the overview to list reports with its last activity", func() (bool, string) {
		got := text(t, bctx, `tr[data-queue="reports"] td[data-k="activity"]`)
		return strings.HasSuffix(got, " ago"), got
	})
	if got := text(t, bctx, `tr[data-queue="reports"] td[data-k="unclaimed"]`); got != "0" {
		t.Errorf("reports' unclaimed items: %q, want 0", got)
	}
	shot(t, bctx, "operator-overview")

	run(t, bctx, "open pipeline's dead items", chromedp.Navigate(base+"/items?queue=pipeline&state=dead"))
	options := eval[[]string](t, bctx, `Array.from(document.querySelectorAll('select[name="reason"] option')).map(o => o.textContent)`)
	for _, r := range claim.Reasons() {
		if !contains(options, r) {
			t.Errorf("the reason selector has no %q: %v", r, options)
		}
	}
	run(t, bctx, "select dependency died and search",
		chromedp.SetValue(`select[name="reason"]`, "dependency died"),
		chromedp.Submit(`#search`),
		chromedp.WaitVisible(`select[name="reason"]`))
	eventually(t, "the dependents' two deaths", func() (bool, string) {
		n := eval[int](t, bctx, `document.querySelectorAll('tr[data-id]').length`)
		url := eval[string](t, bctx, `location.search`)
		return n == 2 && strings.Contains(url, "reason=dependency+died"), url
	})
	shot(t, bctx, "operator-dead-by-reason")

	run(t, bctx, "open the sessions page", chromedp.Navigate(base+"/sessions"))
	eventually(t, "mail's part map to show its owner", func() (bool, string) {
		got := text(t, bctx, `section.partmap[data-queue="mail"] h3 small`)
		return strings.Contains(got, "1 owner(s)"), got
	})
	plainMap := text(t, bctx, `section.partmap[data-queue="plain"] h3 small`)
	red := eval[int](t, bctx, `document.querySelectorAll('section.partmap[data-queue="plain"] .part.unowned, section.partmap[data-queue="plain"] .warn').length`)
	if !strings.Contains(plainMap, "not in use") || red != 0 {
		t.Errorf("plain's part map (no session works it in parts mode): %q, %d red elements; want \"not in use\", none", plainMap, red)
	}
	shot(t, bctx, "operator-sessions")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
