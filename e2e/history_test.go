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
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
)

// TestItemTimeline: in a browser, the item page shows each attempt of an
// item as an entry of a timeline, for an acked item (two failures, one a
// panic whose stack trace is preformatted line for line and whose markup
// stays text, then the success), a dead item, a cancelled one and a live
// one; an ended record of older code says "no history recorded"; and the
// timeline follows the system's dark mode.
func TestItemTimeline(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "invoices", BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, pool, session.Options{Name: "timeline"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	claimIt := func(id uuid.UUID) claim.Item {
		var it claim.Item
		await.Until(t, "the item to be due", func() bool {
			items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(items) == 1 {
				if items[0].ID != id {
					t.Fatalf("claimed %s, want %s", items[0].ID, id)
				}
				it = items[0]
			}
			return len(items) == 1
		})
		return it
	}
	enqueue := func(it claim.NewItem) uuid.UUID {
		res, err := q.Enqueue(ctx, it)
		if err != nil {
			t.Fatal(err)
		}
		return res.IDs[0]
	}
	nack := func(it claim.Item, cause error) {
		if _, err := q.Nack(ctx, it, cause); err != nil {
			t.Fatal(err)
		}
	}
	trace := "handler panic: <script>window.pwned=1</script> nil map\ngoroutine 71 [running]:\nmain.render(...)\n\t/srv/app/invoice.go:42 +0x1d"

	acked := enqueue(claim.NewItem{Payload: []byte(`{"invoice":1}`)})
	nack(claimIt(acked), errors.New("the billing service refused: 503"))
	nack(claimIt(acked), errors.New(trace))
	if err := q.Ack(ctx, claimIt(acked), nil); err != nil {
		t.Fatal(err)
	}
	dead := enqueue(claim.NewItem{Payload: []byte(`{"invoice":2}`), MaxAttempts: 2})
	nack(claimIt(dead), errors.New("bad input 1"))
	nack(claimIt(dead), errors.New("bad input 2"))
	live := enqueue(claim.NewItem{Payload: []byte(`{"invoice":3}`)})
	nack(claimIt(live), claim.RetryAfter(time.Hour, errors.New("upstream down")))
	cancelled := enqueue(claim.NewItem{Payload: []byte(`{"invoice":4}`)})
	nack(claimIt(cancelled), claim.RetryAfter(time.Hour, errors.New("quota exceeded")))
	if _, err := q.CancelItem(ctx, cancelled, claim.CancelOptions{By: "ops", Reason: "stale"}); err != nil {
		t.Fatal(err)
	}
	old := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) VALUES ('invoices', $1, 'acked')`, old); err != nil {
		t.Fatal(err)
	}

	base := serve(t, pool, dashboard.Options{})
	bctx := newBrowser(t, 1280, 900)
	outcomes := func() string {
		return eval[string](t, bctx, `Array.from(document.querySelectorAll('#timeline li.attempt')).map(function(li){return li.dataset.outcome}).join(",")`)
	}
	for _, c := range []struct {
		name  string
		id    uuid.UUID
		state string
		want  string
	}{
		{"acked", acked, "acked", "failed,failed,succeeded"},
		{"dead", dead, "", "failed,dead"},
		{"live", live, "unclaimed", "failed"},
		{"cancelled", cancelled, "cancelled", "failed"},
	} {
		run(t, bctx, "open the "+c.name+" item", chromedp.Navigate(base+"/item?id="+c.id.String()), chromedp.WaitVisible(`#timeline`))
		if got := outcomes(); got != c.want {
			t.Errorf("%s item: timeline %q, want %q", c.name, got, c.want)
		}
		if c.state != "" {
			if got := text(t, bctx, `#item-state`); got != c.state {
				t.Errorf("%s item: state %q, want %q", c.name, got, c.state)
			}
		}
		shot(t, bctx, "item-timeline-"+c.name)
	}

	// The acked item: sessions, errors, the stack trace preformatted, its
	// markup text.
	run(t, bctx, "open the acked item", chromedp.Navigate(base+"/item?id="+acked.String()), chromedp.WaitVisible(`#timeline`))
	if got := text(t, bctx, `#timeline li[data-number="1"] .attempt-error`); got != "the billing service refused: 503" {
		t.Errorf("attempt 1's error: %q", got)
	}
	if got := text(t, bctx, `#timeline li[data-number="2"] .attempt-error`); !strings.Contains(got, "<script>window.pwned=1</script>") {
		t.Errorf("attempt 2's error line: %q", got)
	}
	if got := eval[string](t, bctx, `document.querySelector('#timeline li[data-number="2"] pre.trace').textContent`); got != "goroutine 71 [running]:\nmain.render(...)\n\t/srv/app/invoice.go:42 +0x1d" {
		t.Errorf("attempt 2's stack trace: %q", got)
	}
	if eval[bool](t, bctx, `!!window.pwned || document.querySelectorAll('#timeline script').length > 0`) {
		t.Error("the error's markup ran or became an element")
	}
	if got := eval[string](t, bctx, `getComputedStyle(document.querySelector('pre.trace')).whiteSpace`); got != "pre" {
		t.Errorf("the stack trace's white-space is %q, want pre", got)
	}
	if got := text(t, bctx, `#timeline li[data-number="3"] .session`); got != "session "+s.ID().String() {
		t.Errorf("attempt 3's session: %q", got)
	}

	// An ended record of older code.
	run(t, bctx, "open the old item", chromedp.Navigate(base+"/item?id="+old.String()), chromedp.WaitVisible(`#timeline-summary`))
	if got := text(t, bctx, `#timeline-summary`); !strings.Contains(got, "no history recorded") {
		t.Errorf("an old ended record's timeline: %q", got)
	}

	// Dark mode: the entries and the trace take the dark colors.
	for _, c := range []struct{ scheme, card string }{
		{"light", "rgb(255, 255, 255)"},
		{"dark", "rgb(26, 33, 41)"},
	} {
		run(t, bctx, "emulate "+c.scheme, colorScheme(c.scheme), chromedp.Navigate(base+"/item?id="+acked.String()), chromedp.WaitVisible(`#timeline`))
		entry := eval[string](t, bctx, `getComputedStyle(document.querySelector('#timeline li.attempt')).backgroundColor`)
		pre := eval[string](t, bctx, `getComputedStyle(document.querySelector('pre.trace')).backgroundColor`)
		if entry != c.card || pre != c.card {
			t.Errorf("%s: the timeline's entry %s and trace %s, want %s", c.scheme, entry, pre, c.card)
		}
		shot(t, bctx, "item-timeline-"+c.scheme)
	}
}
