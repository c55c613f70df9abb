package dashboard_test

import (
	"context"
	"errors"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/session"
)

// field returns the text of the element with the id in page, tags removed
// and entities unescaped.
func field(page, id string) string {
	m := regexp.MustCompile(`(?s)id="` + regexp.QuoteMeta(id) + `"[^>]*>(.*?)</(?:dd|b|table)>`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	text := html.UnescapeString(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(m[1], " "))
	return strings.Join(strings.Fields(text), " ")
}

// The item page shows a running item's checkpoint, progress and pending
// cancel request (asked from the dashboard, with the user as its author),
// a snoozed item's snoozes, a sequenced item's order and headers, and what
// a waiting item waits for; the queue page shows the queue's sequencing,
// retention and its waiting, snoozed and cancelling items. The cancel
// action says that a running item is asked to stop, and leaves it in the
// items table, asked to stop, as claim.Queue.CancelItem does.
func TestItemAndQueuePagesShowTheNewState(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{Auth: func(r *http.Request) (string, bool) { return "ada", true }})
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{DeadMaxAge: 2 * time.Hour, DeadMaxCount: 500}}); err != nil {
		t.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("run"), Priority: -2}, claim.NewItem{Payload: []byte("snooze"), Priority: -1})
	if err != nil {
		t.Fatal(err)
	}
	running, snoozed := res.IDs[0], res.IDs[1]
	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(items) != 2 || items[0].ID != running {
		t.Fatalf("claim: %v, %d items; want the two", err, len(items))
	}
	if err := q.SaveCheckpoint(ctx, items[0], []byte("12345")); err != nil {
		t.Fatal(err)
	}
	if err := q.ReportProgress(ctx, items[0], claim.Progress{Done: 3, Total: 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Snooze(ctx, items[1], time.Hour); err != nil {
		t.Fatal(err)
	}
	res, err = q.Enqueue(ctx, claim.NewItem{Key: "k", Payload: []byte("keyed"), Headers: map[string]string{"traceparent": "00-abc-01"}})
	if err != nil {
		t.Fatal(err)
	}
	keyed := res.IDs[0]
	res, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("after"), After: []uuid.UUID{keyed}})
	if err != nil || !res.Waiting[0] {
		t.Fatalf("enqueue of the dependent: %+v, %v; want waiting", res, err)
	}
	waiting := res.IDs[0]

	b := newBrowser(t, srv.URL)
	// The cancel of the running item: the confirmation says it is asked
	// to stop; done, it stays in the items table, asked to stop by ada.
	form := url.Values{"act": {"cancel"}, "queue": {"jobs"}, "sel": {running.String()}}
	form.Set("csrf", b.token())
	if code, text, _ := b.do("POST", "/action", form, nil); code != 200 || !strings.Contains(text, "a running item is asked to stop") {
		t.Fatalf("the cancel's confirmation (%d) does not say a running item is asked to stop:\n%s", code, text)
	}
	code, _, hdr := act(t, b, url.Values{"act": {"cancel"}, "queue": {"jobs"}, "sel": {running.String()}, "return": {"/queue?name=jobs"}})
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "running+asked+to+stop") {
		t.Fatalf("cancel: %d, to %s; want a redirect that says the running item was asked to stop", code, hdr.Get("Location"))
	}
	var by, reason string
	if err := pool.QueryRow(ctx, `SELECT cancel_by, cancel_reason FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL AND cancel_requested_at IS NOT NULL`,
		running).Scan(&by, &reason); err != nil || by != "ada" || reason == "" {
		t.Fatalf("the running item after the cancel: by %q, reason %q, %v; want still claimed, asked to stop by ada", by, reason, err)
	}

	page := b.get("/item?id=" + running.String())
	for id, want := range map[string]string{
		"item-state":      "claimed, asked to stop",
		"item-cancel":     "by ada: cancelled from the dashboard",
		"item-progress":   "3 of 10, reported",
		"item-checkpoint": "5 bytes, saved",
		"item-seq":        "not sequenced",
		"item-snoozes":    "0 time(s)",
	} {
		if got := field(page, id); !strings.Contains(got, want) {
			t.Errorf("running item, %s: %q, want %q", id, got, want)
		}
	}
	if !strings.Contains(page, "Cancel (already asked to stop)") {
		t.Error("the running item's cancel button does not say it was asked to stop already")
	}
	page = b.get("/item?id=" + snoozed.String())
	if got := field(page, "item-snoozes"); got != "1 time(s)" {
		t.Errorf("snoozed item: snoozes %q, want 1 time(s)", got)
	}
	if got := field(page, "item-cancel"); got != "—" {
		t.Errorf("snoozed item: cancel %q, want none", got)
	}
	page = b.get("/item?id=" + keyed.String())
	if got := field(page, "item-seq"); !strings.Contains(got, "one item of key k at a time") || strings.Contains(got, "not sequenced") {
		t.Errorf("sequenced item: sequence order %q", got)
	}
	if got := field(page, "item-headers"); !strings.Contains(got, "traceparent : 00-abc-01") {
		t.Errorf("sequenced item: headers %q, want traceparent", got)
	}
	page = b.get("/item?id=" + waiting.String())
	if strings.Contains(page, `id="not-found"`) || field(page, "item-state") != "waiting for 1 prerequisite(s)" {
		t.Fatalf("the waiting item's page does not show it waiting:\n%s", page)
	}
	if row := regexp.MustCompile(`(?s)<tr data-prereq="` + keyed.String() + `">.*?</tr>`).FindString(page); !strings.Contains(row, "<td>queued</td>") {
		t.Errorf("the waiting item's page does not show its prerequisite queued: %q", row)
	}

	if !strings.Contains(page, "Cancel this waiting item") {
		t.Error("the waiting item's page has no cancel button")
	}
	page = b.get("/queue?name=jobs")
	for id, want := range map[string]string{
		"q-sequenced": "on",
		"q-retention": "at most 500",
	} {
		if got := field(page, id); !strings.Contains(got, want) {
			t.Errorf("queue page, %s: %q, want %q", id, got, want)
		}
	}
	for _, id := range []string{"q-waiting", "q-snoozed", "q-cancelling"} {
		if got := field(page, id); got != "1" {
			t.Errorf("queue page, %s: %q, want 1", id, got)
		}
	}
	if got := field(page, "q-retention"); strings.Contains(got, "no limit") {
		t.Errorf("queue page, retention %q: the age bound is missing", got)
	}
	// The waiting item cancelled from its page: it ends at once.
	if code, text, _ := act(t, b, url.Values{"act": {"cancel"}, "queue": {"jobs"}, "sel": {waiting.String()}}); code != http.StatusSeeOther {
		t.Fatalf("cancel of the waiting item: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE id = $1`, waiting); n != 0 {
		t.Fatal("the cancelled waiting item is still waiting")
	}
	if got := field(b.get("/queue?name=jobs"), "q-waiting"); got != "0" {
		t.Errorf("queue page after the cancel of the waiting item: waiting %q, want 0", got)
	}
	// Another queue: nothing sequenced, waiting, snoozed or cancelling,
	// the default retention.
	enqueue(t, pool, "plain", 1, nil)
	page = b.get("/queue?name=plain")
	for id, want := range map[string]string{"q-sequenced": "off", "q-waiting": "0", "q-snoozed": "0", "q-cancelling": "0"} {
		if got := field(page, id); got != want {
			t.Errorf("plain queue page, %s: %q, want %q", id, got, want)
		}
	}
	if got := field(page, "q-retention"); !strings.HasPrefix(got, "for ") || !strings.Contains(got, ", at most ") || strings.Contains(got, "no limit") {
		t.Errorf("plain queue page, retention %q", got)
	}
}

// The queue page of a sequenced queue says what a death does to a key and
// lists the blocked keys with the item that blocks each: a dead head in a
// hold queue, and a head waiting for its retry.
func TestQueuePageShowsBlockedKeys(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{Auth: func(r *http.Request) (string, bool) { return "ada", true }})
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "ledger", BackoffBase: time.Hour, BackoffMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	page := b.get("/queue?name=ledger")
	if got := field(page, "q-on-death"); !strings.HasPrefix(got, "advance") {
		t.Errorf("on a death: %q, want advance", got)
	}
	if !strings.Contains(page, `id="q-blocked-none"`) {
		t.Errorf("a sequenced queue without blocked keys does not say so:\n%s", page)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
		t.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Key: "acct-1", Payload: []byte("a")}, claim.NewItem{Key: "acct-1", Payload: []byte("b")},
		claim.NewItem{Key: "acct-2", Payload: []byte("c")}, claim.NewItem{Key: "acct-2", Payload: []byte("d")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(items) != 2 {
		t.Fatalf("claim: %v, %d items", err, len(items))
	}
	for _, it := range items {
		cause := errors.New("card declined")
		if it.ID == res.IDs[0] {
			cause = claim.Permanent(cause)
		}
		if _, err := q.Nack(ctx, it, cause); err != nil {
			t.Fatal(err)
		}
	}
	page = b.get("/queue?name=ledger")
	if got := field(page, "q-on-death"); !strings.HasPrefix(got, "hold") {
		t.Errorf("on a death: %q, want hold", got)
	}
	dead := regexp.MustCompile(`(?s)<tr data-key="acct-1">.*?</tr>`).FindString(page)
	if !strings.Contains(dead, "held by a dead item (permanent)") || !strings.Contains(dead, "card declined") || !strings.Contains(dead, res.IDs[0].String()) {
		t.Errorf("acct-1's row: %q", dead)
	}
	retry := regexp.MustCompile(`(?s)<tr data-key="acct-2">.*?</tr>`).FindString(page)
	if !strings.Contains(retry, "head waits for its retry") || !strings.Contains(retry, res.IDs[2].String()) {
		t.Errorf("acct-2's row: %q", retry)
	}
}
