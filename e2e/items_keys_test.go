package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/await"
)

// colorScheme emulates the system's prefers-color-scheme ("light" or
// "dark") for the tab.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return chromedp.Void{}, err
	}
}

// soft evaluates js as eval does, but answers the zero value on an error:
// for polls while the page navigates (the evaluation may meet the old page
// as it goes away).
func soft[T any](ctx context.Context, js string) T {
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		var zero T
		return zero
	}
	return v
}

// TestItemsListSearchDarkModeAndShortcuts: in a browser, the Items page
// lists every queue's items with the counts beside the state selector; the
// search finds an item by key and by payload text; the page follows the
// system's dark mode; and the keyboard moves through the list (j/k), opens
// a row (Enter), focuses the search (/), shows the help (?), jumps to a
// page (g then q), ticks a row (x) and cancels it (c) through the
// confirmation page, which changes nothing until confirmed.
func TestItemsListSearchDarkModeAndShortcuts(t *testing.T) {
	pool := newDB(t)
	ctx := context.Background()
	for q, n := range map[string]int{"mail": 3, "reports": 2} {
		cq, err := claim.New(pool, claim.Options{Queue: q})
		if err != nil {
			t.Fatal(err)
		}
		items := make([]claim.NewItem, n)
		for i := range items {
			items[i] = claim.NewItem{Key: fmt.Sprintf("%s-%d", q, i), Payload: []byte(fmt.Sprintf(`{"to":"%s%d@example.com"}`, q, i))}
		}
		if _, err := cq.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
	}
	base := serve(t, pool, dashboard.Options{})
	bctx := newBrowser(t, 1280, 900)
	rows := func() int { return eval[int](t, bctx, `document.querySelectorAll('tr[data-id]').length`) }

	// The list of every queue, with the counts.
	run(t, bctx, "open the items", chromedp.Navigate(base+"/items"), chromedp.WaitVisible(`#state-counts`))
	if n := rows(); n != 5 {
		t.Fatalf("the items of every queue: %d rows, want 5", n)
	}
	await.Until(t, "the unclaimed count of every queue", func() (bool, string) {
		run(t, bctx, "reload", chromedp.Reload(), chromedp.WaitVisible(`#state-counts`))
		got := text(t, bctx, `#state-counts a[data-state="unclaimed"] b`)
		return got == "5", got
	})
	shot(t, bctx, "items-every-queue")

	// / focuses the search; typing and Enter searches.
	run(t, bctx, "press /", chromedp.KeyEvent("/"))
	if id := eval[string](t, bctx, `document.activeElement.id`); id != "search-text" {
		t.Fatalf("after /, the focus is on %q, want the search field", id)
	}
	// (The protocol's key events send the "/" as a separate character event,
	// which the page's preventDefault of the keydown does not stop, as a
	// browser's own keyboard does: clear what it typed.)
	eval[string](t, bctx, `document.activeElement.value = ""`)
	run(t, bctx, "search reports1@", chromedp.KeyEvent("reports1@\r"))
	await.Until(t, "the search by payload", func() (bool, string) {
		s := soft[string](bctx, `location.search`)
		n := soft[int](bctx, `document.querySelectorAll('tr[data-id]').length`)
		return strings.Contains(s, "q=reports1%40") && n == 1, fmt.Sprint(n, s)
	})
	run(t, bctx, "wait for the results", chromedp.WaitReady(`#state-counts`))
	if got := text(t, bctx, `tr[data-id] td[data-label="key"]`); got != "reports-1" {
		t.Errorf("the search of reports1@ found key %q, want reports-1", got)
	}
	run(t, bctx, "search by key", chromedp.Navigate(base+"/items?q=mail-"), chromedp.WaitVisible(`#state-counts`))
	if n := rows(); n != 3 {
		t.Errorf("the search of mail-: %d rows, want 3", n)
	}
	shot(t, bctx, "items-search")

	// j/k move the cursor, Enter opens the row.
	run(t, bctx, "open the items", chromedp.Navigate(base+"/items"), chromedp.WaitVisible(`#state-counts`))
	cursor := func() int {
		return eval[int](t, bctx, `Array.from(document.querySelectorAll('#live tbody tr')).findIndex(function(r){return r.classList.contains('cursor')})`)
	}
	run(t, bctx, "press j j k", chromedp.KeyEvent("j"), chromedp.KeyEvent("j"), chromedp.KeyEvent("j"), chromedp.KeyEvent("k"))
	if c := cursor(); c != 1 {
		t.Fatalf("after j j j k the cursor is on row %d, want 1", c)
	}
	id := eval[string](t, bctx, `document.querySelector('tr.cursor').getAttribute('data-id')`)
	run(t, bctx, "press Enter", chromedp.KeyEvent("\r"))
	await.Until(t, "the item's page", func() (bool, string) {
		got := soft[string](bctx, `location.pathname + location.search`)
		return got == "/item?id="+id, got
	})

	// ? shows the help, Escape hides it; g q goes to the overview.
	run(t, bctx, "press ?", chromedp.WaitReady(`#help`), chromedp.KeyEvent("?"))
	if eval[bool](t, bctx, `document.getElementById('help').hidden`) {
		t.Fatal("? does not show the help")
	}
	shot(t, bctx, "help-overlay")
	run(t, bctx, "press Escape", chromedp.KeyEvent("\x1b"))
	await.Until(t, "the help to hide", func() (bool, string) {
		return soft[bool](bctx, `document.getElementById('help').hidden`), ""
	})
	run(t, bctx, "press g q", chromedp.KeyEvent("g"), chromedp.KeyEvent("q"))
	await.Until(t, "the overview", func() (bool, string) {
		got := soft[string](bctx, `location.pathname`)
		return got == "/", got
	})

	// x ticks the row, c asks to cancel it: the confirmation page, nothing cancelled.
	run(t, bctx, "open mail's items", chromedp.Navigate(base+"/items?queue=mail"), chromedp.WaitVisible(`#act-cancel-selected`))
	run(t, bctx, "press j x", chromedp.WaitReady(`#help`), chromedp.KeyEvent("j"), chromedp.KeyEvent("x"))
	if n := eval[int](t, bctx, `document.querySelectorAll('input[name="sel"]:checked').length`); n != 1 {
		t.Fatalf("after j x, %d rows ticked, want 1", n)
	}
	run(t, bctx, "press c", chromedp.KeyEvent("c"))
	await.Until(t, "the confirmation page", func() (bool, string) {
		got := soft[string](bctx, `location.pathname + " " + document.body.textContent`)
		return strings.HasPrefix(got, "/action") && strings.Contains(got, "Yes, do it"), got[:min(len(got), 200)]
	})
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'mail'`); n != 3 {
		t.Errorf("before the confirmation, mail holds %d items, want 3", n)
	}

	// Dark mode follows the system, light is the default.
	for _, c := range []struct{ scheme, bg, fg string }{
		{"light", "rgb(247, 248, 250)", "rgb(29, 35, 42)"},
		{"dark", "rgb(18, 23, 29)", "rgb(227, 232, 238)"},
	} {
		run(t, bctx, "emulate "+c.scheme, colorScheme(c.scheme), chromedp.Navigate(base+"/items"), chromedp.WaitVisible(`#state-counts`))
		bg := eval[string](t, bctx, `getComputedStyle(document.body).backgroundColor`)
		fg := eval[string](t, bctx, `getComputedStyle(document.body).color`)
		cell := eval[string](t, bctx, `getComputedStyle(document.querySelector('table.items td')).backgroundColor`)
		if bg != c.bg || fg != c.fg {
			t.Errorf("%s: the page's background %s and text %s, want %s and %s", c.scheme, bg, fg, c.bg, c.fg)
		}
		if c.scheme == "dark" && cell == "rgb(255, 255, 255)" {
			t.Errorf("dark: the table's cells stay white")
		}
		shot(t, bctx, "items-"+c.scheme)
	}
}
