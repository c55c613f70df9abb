package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// setup returns a database with the schema and a dashboard server on it.
func setup(t *testing.T, opts dashboard.Options) (*pgxpool.Pool, *httptest.Server) {
	t.Helper()
	var pool *pgxpool.Pool
	if opts.Tables == (crsql.Tables{}) {
		pool = testschema.New(t)
	} else {
		pool = testdb.New(t)
		if err := crsql.Apply(context.Background(), pool, opts.Tables); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Refresh == 0 {
		opts.Refresh = 200 * time.Millisecond
	}
	h, err := dashboard.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return pool, srv
}

// browser is an HTTP client with a cookie jar, as a browser of the page.
type browser struct {
	t      *testing.T
	c      *http.Client
	base   string
	header http.Header
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, header: http.Header{},
		c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values, hdr map[string]string) (int, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, vs := range b.header {
		req.Header[k] = vs
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v // sent as the Host header (and the jar's cookies are Host's); the connection stays to base
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(text), resp.Header
}

func (b *browser) get(path string) string {
	b.t.Helper()
	code, text, _ := b.do("GET", path, nil, nil)
	if code != 200 {
		b.t.Fatalf("GET %s: %d %s", path, code, text)
	}
	return text
}

var tokenRE = regexp.MustCompile(`name="csrf-token" content="([^"]+)"`)

func (b *browser) token() string {
	b.t.Helper()
	m := tokenRE.FindStringSubmatch(b.get("/"))
	if m == nil {
		b.t.Fatal("no CSRF token in the page")
	}
	return m[1]
}

func enqueue(t *testing.T, pool *pgxpool.Pool, queue string, n int, mod func(i int, it *claim.NewItem)) []uuid.UUID {
	t.Helper()
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		if mod != nil {
			mod(i, &items[i])
		}
	}
	res, err := q.Enqueue(context.Background(), items...)
	if err != nil {
		t.Fatal(err)
	}
	return res.IDs
}

// kill moves n items of queue to the dead items through claims and
// permanent nacks, as a worker would.
func kill(t *testing.T, pool *pgxpool.Pool, queue string, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, last_error, reason, item_key)
		SELECT gen_random_uuid(), $1, 0, 0, 3, 3, '\x7b7d'::BYTEA, now(), 'boom ' || g::TEXT, 'failed', 'key-' || g::TEXT FROM generate_series(1, $2) AS g`, queue, n); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// cell returns the text of a queue's figure in the overview.
func cell(page, queue, k string) string {
	re := regexp.MustCompile(`(?s)<tr data-queue="` + regexp.QuoteMeta(queue) + `">.*?<td data-k="` + k + `"[^>]*>(.*?)</td>`)
	m := re.FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return strings.TrimSpace(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(m[1], ""))
}

func TestOverviewShowsTheDatabaseCountsAndFollowsThem(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	enqueue(t, pool, "mail", 7, nil)
	enqueue(t, pool, "later", 3, func(_ int, it *claim.NewItem) { it.Delay = time.Hour })
	kill(t, pool, "mail", 2)
	b := newBrowser(t, srv.URL)
	page := b.get("/")
	for q, want := range map[string]map[string]string{
		"mail":  {"unclaimed": "7", "due": "7", "claimed": "0", "dead": "2", "state": "running"},
		"later": {"unclaimed": "3", "due": "0", "dead": "0"},
	} {
		for k, v := range want {
			if got := cell(page, q, k); got != v {
				t.Errorf("queue %s %s: page shows %q, want %q", q, k, got, v)
			}
		}
	}
	// The live part alone, as the page's refresh asks for it, follows
	// the database.
	enqueue(t, pool, "mail", 5, nil)
	await.Until(t, "the overview shows 12 unclaimed", func() (bool, string) {
		_, text, _ := b.do("GET", "/", nil, map[string]string{"X-Crdbwork-Live": "1"})
		if strings.Contains(text, "<html") {
			t.Fatal("the live refresh answered the whole page")
		}
		got := cell(text, "mail", "unclaimed")
		return got == "12", got
	})
}

func TestCountsStopAtTheCap(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{CountCap: 5})
	enqueue(t, pool, "big", 9, nil)
	page := newBrowser(t, srv.URL).get("/")
	if got := cell(page, "big", "unclaimed"); got != "≥5" {
		t.Fatalf("unclaimed shows %q, want ≥5", got)
	}
}

func TestOverviewPagesThroughManyQueues(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{PageSize: 10})
	for i := range 25 {
		enqueue(t, pool, fmt.Sprintf("q%02d", i), 1, nil)
	}
	b := newBrowser(t, srv.URL)
	first, third := b.get("/"), b.get("/?page=3")
	if !strings.Contains(first, `data-queue="q00"`) || strings.Contains(first, `data-queue="q10"`) || !strings.Contains(first, "page 1 of 3") {
		t.Errorf("page 1 does not list q00-q09 alone")
	}
	if !strings.Contains(third, `data-queue="q24"`) || strings.Contains(third, `data-queue="q19"`) {
		t.Errorf("page 3 does not list q20-q24 alone")
	}
	if f := b.get("/?q=q1"); !strings.Contains(f, `data-queue="q13"`) || strings.Contains(f, `data-queue="q23"`) {
		t.Errorf("the filter q1 does not keep q1x alone")
	}
}

// act posts an action with the browser's token: first without confirm (a
// confirmation page, nothing done), then confirmed.
func act(t *testing.T, b *browser, form url.Values) (int, string, http.Header) {
	t.Helper()
	form.Set("csrf", b.token())
	code, text, _ := b.do("POST", "/action", form, nil)
	if code != 200 || !strings.Contains(text, `id="confirm"`) {
		t.Fatalf("the unconfirmed action answered %d:\n%s", code, text)
	}
	form.Set("confirm", "yes")
	return b.do("POST", "/action", form, nil)
}

func TestActionsChangeTheDatabaseAndAreAudited(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{Auth: func(r *http.Request) (string, bool) { return "ada", true }})
	enqueue(t, pool, "mail", 3, nil)
	kill(t, pool, "mail", 4)
	b := newBrowser(t, srv.URL)

	// Pause: the confirmation page changes nothing; the confirmed action
	// pauses and redirects with a message.
	form := url.Values{"act": {"pause"}, "queue": {"mail"}, "return": {"/queue?name=mail"}}
	form.Set("csrf", b.token())
	if code, text, _ := b.do("POST", "/action", form, nil); code != 200 || !strings.Contains(text, "Pause queue") {
		t.Fatalf("confirmation: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 0 {
		t.Fatal("the confirmation page paused the queue")
	}
	code, _, hdr := act(t, b, url.Values{"act": {"pause"}, "queue": {"mail"}, "return": {"/queue?name=mail"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/queue?") {
		t.Fatalf("pause answered %d, Location %q", code, hdr.Get("Location"))
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE name = 'mail' AND paused`); n != 1 {
		t.Fatal("the queue is not paused")
	}
	if !strings.Contains(cell(b.get("/"), "mail", "state"), "paused") {
		t.Error("the overview does not show the pause")
	}

	// Requeue two selected dead items, then the rest by filter.
	rows, err := pool.Query(context.Background(), `SELECT id::TEXT || '/' || death::TEXT FROM crdbwork_dead_items WHERE queue = 'mail' ORDER BY id LIMIT 2`)
	if err != nil {
		t.Fatal(err)
	}
	var sel []string
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		sel = append(sel, s)
	}
	rows.Close()
	if code, text, _ := act(t, b, url.Values{"act": {"requeue"}, "queue": {"mail"}, "sel": sel}); code != http.StatusSeeOther {
		t.Fatalf("requeue: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'mail'`); n != 2 {
		t.Fatalf("%d dead items left, want 2", n)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"requeue-filter"}, "queue": {"mail"}, "error": {"boom"}}); code != http.StatusSeeOther {
		t.Fatalf("requeue by filter: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'mail'`); n != 7 {
		t.Fatalf("%d items, want 7 (3 + 4 requeued)", n)
	}
	// Limits and parts.
	if code, text, _ := act(t, b, url.Values{"act": {"limits"}, "queue": {"mail"}, "max_in_flight": {"4"}, "rate": {"2.5"}}); code != http.StatusSeeOther {
		t.Fatalf("limits: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE name = 'mail' AND max_in_flight = 4 AND rate_limit = 2.5 AND paused`); n != 1 {
		t.Fatal("the limits are not stored (or the pause was lost)")
	}
	if got := cell(b.get("/"), "mail", "limits"); got != "≤4 in flight, ≤2.5/s" {
		t.Errorf("the overview shows the limits %q", got)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"parts"}, "queue": {"mail"}, "parts": {"4"}}); code != http.StatusSeeOther {
		t.Fatalf("parts: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT num_parts FROM crdbwork_queues WHERE name = 'mail'`); n != 4 {
		t.Fatalf("%d parts, want 4", n)
	}
	// Cancel one item, delete a dead one.
	var id uuid.UUID
	if err := pool.QueryRow(context.Background(), `SELECT id FROM crdbwork_items WHERE queue = 'mail' LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"cancel"}, "queue": {"mail"}, "sel": {id.String()}}); code != http.StatusSeeOther {
		t.Fatalf("cancel: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id); n != 0 {
		t.Fatal("the cancelled item is still there")
	}
	// The cancelled item is listed (state cancelled) and requeued from
	// there: back in the items table, no longer listed.
	if page := b.get("/items?queue=mail&state=cancelled"); !strings.Contains(page, `<tr data-id="`+id.String()+`">`) ||
		!strings.Contains(page, `id="act-requeue-cancelled"`) {
		t.Fatalf("the cancelled items page does not list %s:\n%s", id, page)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"requeue-cancelled"}, "queue": {"mail"}, "sel": {id.String()}}); code != http.StatusSeeOther {
		t.Fatalf("requeue-cancelled: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id); n != 1 {
		t.Fatal("the requeued cancelled item is not back")
	}
	if page := b.get("/items?queue=mail&state=cancelled"); strings.Contains(page, `<tr data-id="`+id.String()+`">`) {
		t.Fatalf("the requeued item is still listed as cancelled:\n%s", page)
	}
	kill(t, pool, "mail", 1)
	var death string
	if err := pool.QueryRow(context.Background(), `SELECT id::TEXT || '/' || death::TEXT FROM crdbwork_dead_items WHERE queue = 'mail'`).Scan(&death); err != nil {
		t.Fatal(err)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"delete-dead"}, "queue": {"mail"}, "sel": {death}}); code != http.StatusSeeOther {
		t.Fatalf("delete-dead: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'mail'`); n != 0 {
		t.Fatal("the dead item is still there")
	}
	if code, _, _ := act(t, b, url.Values{"act": {"resume"}, "queue": {"mail"}}); code != http.StatusSeeOther {
		t.Fatal("resume failed")
	}
	// Every action is in the audit list, by ada, newest first.
	want := []string{"resume", "delete-dead", "requeue-cancelled", "cancel", "parts", "limits", "requeue-filter", "requeue", "pause"}
	rows, err = pool.Query(context.Background(), `SELECT action, actor, source, detail FROM crdbwork_audit ORDER BY at DESC, id DESC`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var a, who, src, detail string
		_ = rows.Scan(&a, &who, &src, &detail)
		if who != "ada" || src != "dashboard" || detail == "" {
			t.Errorf("audit row %s by %q from %q: %q", a, who, src, detail)
		}
		got = append(got, a)
	}
	rows.Close()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("audit list %v, want %v", got, want)
	}
	if page := b.get("/audit"); strings.Count(page, `<tr data-action=`) != len(want) || !strings.Contains(page, "requeued 2 of 2") {
		t.Errorf("the audit page does not list the actions:\n%s", page)
	}
}

func TestForgedAndReadOnlyActionsAreRefused(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	enqueue(t, pool, "mail", 1, nil)
	b := newBrowser(t, srv.URL)
	tok := b.token()
	pause := func(extra url.Values) url.Values {
		f := url.Values{"act": {"pause"}, "queue": {"mail"}, "confirm": {"yes"}}
		for k, v := range extra {
			f[k] = v
		}
		return f
	}
	cases := []struct {
		name string
		b    *browser
		form url.Values
		hdr  map[string]string
	}{
		{"no token", b, pause(nil), nil},
		{"a wrong token", b, pause(url.Values{"csrf": {tok[:len(tok)-2] + "xx"}}), nil},
		{"another browser's token", newBrowser(t, srv.URL), pause(url.Values{"csrf": {tok}}), nil},
		{"a cross-site request", b, pause(url.Values{"csrf": {tok}}), map[string]string{"Sec-Fetch-Site": "cross-site"}},
		{"a foreign origin", b, pause(url.Values{"csrf": {tok}}), map[string]string{"Origin": "https://evil.example"}},
	}
	cases[2].b.get("/") // that browser has a cookie of its own
	for _, c := range cases {
		code, text, _ := c.b.do("POST", "/action", c.form, c.hdr)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", c.name, code, text)
		}
	}
	if code, _, _ := b.do("GET", "/action?act=pause&queue=mail&confirm=yes&csrf="+url.QueryEscape(tok), nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /action: %d, want 405", code)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 0 {
		t.Fatal("a refused request paused the queue")
	}
	// The same request, same-origin and with the token, passes.
	if code, _, _ := b.do("POST", "/action", pause(url.Values{"csrf": {tok}}), map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL}); code != http.StatusSeeOther {
		t.Fatalf("the genuine request answered %d", code)
	}

	// Read-only: no forms, and every action refused.
	_, ro := setupOn(t, pool, dashboard.Options{ReadOnly: true})
	rb := newBrowser(t, ro.URL)
	page := rb.get("/queue?name=mail")
	if strings.Contains(page, `action="/action"`) {
		t.Error("the read-only queue page shows action forms")
	}
	code, _, _ := rb.do("POST", "/action", url.Values{"act": {"resume"}, "queue": {"mail"}, "confirm": {"yes"}, "csrf": {rb.token()}}, nil)
	if code != http.StatusForbidden {
		t.Errorf("read-only action: %d, want 403", code)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 1 {
		t.Fatal("the read-only dashboard resumed the queue")
	}
}

// setupOn is setup on an existing database.
func setupOn(t *testing.T, pool *pgxpool.Pool, opts dashboard.Options) (http.Handler, *httptest.Server) {
	t.Helper()
	opts.Refresh = 200 * time.Millisecond
	h, err := dashboard.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

func TestAuthHookAndBasePath(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, dashboard.Options{})
	h, err := dashboard.New(pool, dashboard.Options{BasePath: "/ops/queues", Auth: func(r *http.Request) (string, bool) {
		u, p, ok := r.BasicAuth()
		return u, ok && u == "ada" && p == "secret"
	}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/queues/", http.StripPrefix("/ops/queues", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	b := newBrowser(t, srv.URL)
	if code, _, _ := b.do("GET", "/ops/queues/", nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("without credentials: %d, want 401", code)
	}
	b.header.Set("Authorization", "Basic "+basic("ada", "wrong"))
	if code, _, _ := b.do("GET", "/ops/queues/", nil, nil); code != http.StatusUnauthorized {
		t.Fatalf("with a wrong password: %d, want 401", code)
	}
	b.header.Set("Authorization", "Basic "+basic("ada", "secret"))
	page := b.get("/ops/queues/")
	if !strings.Contains(page, `href="/ops/queues/static/style.css"`) || !strings.Contains(page, `href="/ops/queues/sessions"`) || !strings.Contains(page, ">ada") {
		t.Fatalf("the page does not link under the base path or name the user:\n%s", page)
	}
	if code, _, _ := b.do("GET", "/ops/queues/static/app.js", nil, nil); code != 200 {
		t.Fatalf("app.js: %d", code)
	}
}

func basic(u, p string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(u, p)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func TestItemSearchFiltersPagesAndShowsAnItem(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{PageSize: 5, ScanWindow: 20})
	ids := enqueue(t, pool, "mail", 30, func(i int, it *claim.NewItem) {
		it.Key = fmt.Sprintf("k%d", i%3)
		// Distinct priorities fix the claim order, so that any 20 entries
		// in a row hold at least 6 items of key k1 (below); with one
		// priority and one turn, the order was the enqueue's, by id.
		it.Priority = i
		if i%10 == 0 {
			it.Tenant = "acme"
		}
	})
	kill(t, pool, "mail", 12)
	b := newBrowser(t, srv.URL)
	rowRE := regexp.MustCompile(`<tr data-id="`)
	// Unfiltered pages of 5 walk all 30 items once.
	seen := map[string]bool{}
	path := "/items?queue=mail"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("paging does not end")
		}
		page := b.get(path)
		for _, m := range regexp.MustCompile(`<tr data-id="([^"]+)"`).FindAllStringSubmatch(page, -1) {
			if seen[m[1]] {
				t.Fatalf("item %s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		path = ""
		if m := regexp.MustCompile(`id="next" href="\?([^"]+)"`).FindStringSubmatch(page); m != nil {
			path = "/items?" + strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 30 {
		t.Fatalf("the pages listed %d items, want 30", len(seen))
	}
	// The tenant filter reads the tenant's index: 3 items.
	if n := len(rowRE.FindAllString(b.get("/items?queue=mail&tenant=acme"), -1)); n != 3 {
		t.Errorf("tenant acme: %d rows, want 3", n)
	}
	// A key filter reads at most the scan window (20 entries) per page.
	page := b.get("/items?queue=mail&key=k1")
	if n := len(rowRE.FindAllString(page, -1)); n != 5 || !strings.Contains(page, `id="next"`) {
		t.Errorf("key k1, first page: %d rows, want 5 and a next link", n)
	}
	// Dead items, filtered by error text.
	if n := len(rowRE.FindAllString(b.get("/items?queue=mail&state=dead&error=boom+1"), -1)); n != 4 { // boom 1, 10, 11, 12
		t.Errorf("dead items with error 'boom 1': %d rows, want 4", n)
	}
	// One item: its payload and attempts.
	item := b.get("/item?id=" + ids[4].String())
	if !strings.Contains(item, "&#34;n&#34;: 4") || !strings.Contains(item, `id="item-attempts">0 of 25`) {
		t.Errorf("the item page does not show the payload and attempts:\n%s", item)
	}
}

func TestAThousandQueuesArePaged(t *testing.T) {
	t.Parallel()
	// A sampling round reads the 1000 queues one by one within five
	// refreshes (10 s at least): stretched with the machine's load, or a
	// busy machine's round times out and the page lists none.
	pool, srv := setup(t, dashboard.Options{Refresh: await.Stretch(2 * time.Second)})
	if _, err := pool.Exec(context.Background(), `INSERT INTO crdbwork_queues (name, num_parts, paused)
		SELECT 'queue-' || lpad(g::TEXT, 4, '0'), 1 + g % 4, g % 7 = 0 FROM generate_series(1, 1000) AS g`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "queue-0999", 3, nil)
	b := newBrowser(t, srv.URL)
	first := b.get("/")
	if n := strings.Count(first, `<tr data-queue=`); n != 50 || !strings.Contains(first, "page 1 of 20") || !strings.Contains(first, `id="total-queues">1000<`) {
		t.Fatalf("the first page lists %d queues (want 50 of 1000, page 1 of 20):\n%s", n, first)
	}
	// Sorted by backlog, the queue with items comes first; the pages'
	// links keep the sort.
	byBacklog := b.get("/?sort=backlog")
	if i := strings.Index(byBacklog, `<tr data-queue="queue-0999">`); i < 0 || i > strings.Index(byBacklog, `<tr data-queue="queue-0001">`) && strings.Contains(byBacklog, `<tr data-queue="queue-0001">`) {
		t.Error("sorted by backlog, queue-0999 does not come first")
	}
	if !strings.Contains(byBacklog, `href="?page=2&amp;sort=backlog"`) {
		t.Error("the next page's link drops the sort")
	}
	last := b.get("/?page=20")
	if !strings.Contains(last, `<tr data-queue="queue-1000">`) || cell(last, "queue-0994", "state") != "paused" {
		t.Error("the last page does not show queue-1000, or queue-0994's pause")
	}
}

func TestOtherTables(t *testing.T) {
	t.Parallel()
	tables := crsql.Tables{Schema: "work", Prefix: "jobs_"}
	pool, srv := setup(t, dashboard.Options{Tables: tables})
	q, err := claim.New(pool, claim.Options{Queue: "mail", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(context.Background(), claim.NewItem{Payload: []byte("x")}, claim.NewItem{Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	if got := cell(b.get("/"), "mail", "unclaimed"); got != "2" {
		t.Fatalf("unclaimed shows %q, want 2", got)
	}
	for _, p := range []string{"/sessions", "/items?queue=mail", "/tenants?queue=mail", "/audit", "/queue?name=mail"} {
		b.get(p)
	}
	if code, text, _ := act(t, b, url.Values{"act": {"pause"}, "queue": {"mail"}}); code != http.StatusSeeOther {
		t.Fatalf("pause: %d %s", code, text)
	}
	if n := count(t, pool, `SELECT count(*) FROM work.jobs_audit WHERE action = 'pause'`); n != 1 {
		t.Fatalf("%d audit rows in work.jobs_audit, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM work.jobs_queues WHERE paused`); n != 1 {
		t.Fatal("the queue is not paused in work.jobs_queues")
	}
}

func TestSessionsPartsAndTenants(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	live, stale := uuid.New(), uuid.New()
	for _, s := range []string{
		`INSERT INTO crdbwork_sessions (id, expiry, host, pid, name) VALUES ('` + live.String() + `', INTERVAL '1 hour', 'host-a', 41, 'fresh')`,
		// Two heartbeats missed (expiry 1 h: heartbeats at most every 20
		// min), not yet expired.
		`INSERT INTO crdbwork_sessions (id, expiry, host, pid, name, heartbeat_at) VALUES ('` + stale.String() + `', INTERVAL '1 hour', 'host-b', 42, 'quiet', now() - INTERVAL '50 minutes')`,
		`INSERT INTO crdbwork_queues (name, num_parts) VALUES ('mail', 4)`,
		`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ('` + live.String() + `', 'mail', 0), ('` + stale.String() + `', 'mail', 1)`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(t, pool, "mail", 6, func(i int, it *claim.NewItem) {
		it.Key = fmt.Sprintf("key-%d", i)
		if i < 4 {
			it.Tenant = "acme"
		} else {
			it.Tenant = "zeta"
		}
	})
	page := newBrowser(t, srv.URL).get("/sessions")
	staleRow := regexp.MustCompile(`(?s)<tr data-session="` + stale.String() + `" class="stale">.*?</tr>`).FindString(page)
	if !strings.Contains(staleRow, "host-b") || !strings.Contains(staleRow, ">42<") || !strings.Contains(staleRow, "stale</b>") {
		t.Errorf("the quiet session is not marked stale with its host and pid:\n%s", staleRow)
	}
	if strings.Contains(page, `<tr data-session="`+live.String()+`" class="stale">`) {
		t.Error("the fresh session is marked stale")
	}
	if !strings.Contains(page, `data-k="unowned">2 owned by nobody`) {
		t.Error("the part map does not say that 2 parts are owned by nobody")
	}
	var backlog int
	for p := range 4 {
		m := regexp.MustCompile(`(?s)<div class="part[^"]*" data-part="` + fmt.Sprint(p) + `" data-owner="[^"]*"[^>]*><b>\d+</b><span class="mono">[^<]*</span><span>(\d+)</span>`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no cell of part %d", p)
		}
		var n int
		fmt.Sscan(m[1], &n)
		backlog += n
	}
	if backlog != 6 {
		t.Errorf("the part map's backlogs add up to %d, want 6", backlog)
	}

	// Tenants of a fair queue: most unclaimed first, with their wait.
	q, _ := claim.New(pool, claim.Options{Queue: "mail"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	tp := newBrowser(t, srv.URL).get("/tenants?queue=mail")
	acme, zeta := strings.Index(tp, `<tr data-tenant="acme">`), strings.Index(tp, `<tr data-tenant="zeta">`)
	if acme < 0 || zeta < acme {
		t.Fatalf("the tenants page does not list acme before zeta:\n%s", tp)
	}
	if !strings.Contains(tp, `data-k="unclaimed" data-label="unclaimed">4<`) || !strings.Contains(tp, `data-k="unclaimed" data-label="unclaimed">2<`) {
		t.Error("the tenants page does not show 4 and 2 unclaimed items")
	}
}

// The overview reads the first MaxQueues queues by name and says that
// there are more; a negative bound is refused.
func TestOverviewBoundsTheQueues(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{MaxQueues: 2})
	for _, q := range []string{"c", "a", "b"} {
		enqueue(t, pool, q, 1, nil)
	}
	page := newBrowser(t, srv.URL).get("/")
	rows := regexp.MustCompile(`<tr data-queue="([^"]+)">`).FindAllStringSubmatch(page, -1)
	if len(rows) != 2 || rows[0][1] != "a" || rows[1][1] != "b" || !strings.Contains(page, `id="more-queues"`) {
		t.Errorf("the overview of 3 queues, 2 read: rows %v, notice %v", rows, strings.Contains(page, `id="more-queues"`))
	}
	if _, err := dashboard.New(pool, dashboard.Options{MaxQueues: -1}); err == nil {
		t.Error("a negative MaxQueues was taken")
	}
}
