// Package e2e drives the dashboard's real pages in headless Chromium
// against a real database with workers running. It is its own module, so
// that the browser driver stays out of the library's go.mod; CI installs
// Chromium with scripts/setup-browser.
//
// Set CRDBWORK_SCREENSHOTS to a directory to save a PNG of each page
// there (desktop and phone width).
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// chromium returns the browser's path: $CHROMIUM, or chromium on PATH.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: run scripts/setup-browser (or set CHROMIUM)")
	return ""
}

// newBrowser starts a headless Chromium with an empty profile and no
// network of its own (no updates, sync or QUIC), and returns a tab's
// context; width and height set the window.
func newBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelC(); cancelA() })
	if _, err := chromedp.Run(ctx, chromedp.Steps()); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(cancelT)
	return ctx
}

// run runs browser actions, failing the test on an error.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Steps(actions...)); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a script in the page and returns its value.
func eval[T any](t *testing.T, ctx context.Context, js string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, opts...))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// text returns the text of the first element sel matches, "" if none.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return eval[string](t, ctx, fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.textContent.trim():""})()`, sel))
}

// eventually polls cond until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, got := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s (last: %s)", what, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eventuallyText waits until sel's text is want.
func eventuallyText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	eventually(t, sel+" = "+want, func() (bool, string) {
		got := text(t, ctx, sel)
		return got == want, got
	})
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// shot saves a screenshot of the page if CRDBWORK_SCREENSHOTS is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("CRDBWORK_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fleet runs workers of queue "mail" in this process, each with its own
// session: a handler that waits while the gate is shut, and fails items
// whose payload is "bad" permanently while failBad is set.
type fleet struct {
	t       *testing.T
	pool    *pgxpool.Pool
	q       *claim.Queue
	mu      sync.Mutex
	gate    chan struct{} // closed: open
	failBad atomic.Bool
	stops   []func()
}

func newFleet(t *testing.T, pool *pgxpool.Pool) *fleet {
	q, err := claim.New(pool, claim.Options{Queue: "mail"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, pool: pool, q: q, gate: make(chan struct{})}
	close(f.gate)
	t.Cleanup(func() {
		f.open()
		for _, stop := range f.stops {
			stop()
		}
	})
	return f
}

func (f *fleet) shut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
}

func (f *fleet) open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.gate:
	default:
		close(f.gate)
	}
}

// start starts one more worker.
func (f *fleet) start(name string) {
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		f.mu.Lock()
		gate := f.gate
		f.mu.Unlock()
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if string(it.Payload) == "bad" && f.failBad.Load() {
			return nil, claim.Permanent(fmt.Errorf("bad payload for %s", it.ID))
		}
		return nil, nil
	}
	w, err := worker.New(f.q, handle, worker.Options{
		Name: name, Concurrency: 4, Parts: 4, Poll: 50 * time.Millisecond,
		Session:   session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 900 * time.Millisecond},
		Partition: partition.Tuning{Poll: 100 * time.Millisecond},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	f.stops = append(f.stops, func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			f.t.Errorf("worker %s: %v", name, err)
		}
	})
}

func (f *fleet) enqueue(payloads ...string) {
	if err := f.tryEnqueue(payloads...); err != nil {
		f.t.Fatal(err)
	}
}

// tryEnqueue is enqueue for other goroutines than the test's.
func (f *fleet) tryEnqueue(payloads ...string) error {
	items := make([]claim.NewItem, len(payloads))
	for i, p := range payloads {
		items[i] = claim.NewItem{Payload: []byte(p), Key: "k" + strconv.Itoa(i)}
	}
	_, err := f.q.Enqueue(context.Background(), items...)
	return err
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// serve serves a dashboard on pool at a new address.
func serve(t *testing.T, pool *pgxpool.Pool, opts dashboard.Options) string {
	t.Helper()
	opts.Refresh = 300 * time.Millisecond
	h, err := dashboard.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func newDB(t *testing.T) *pgxpool.Pool {
	pool := testdb.New(t)
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestPagesFollowTheWorkers: the overview, queue and sessions pages show
// the database's counts, and follow them, without a reload, while
// workers claim and ack; the part map shows a rebalance as it happens.
func TestPagesFollowTheWorkers(t *testing.T) {
	pool := newDB(t)
	f := newFleet(t, pool)
	f.start("w1")
	base := serve(t, pool, dashboard.Options{Auth: func(*http.Request) (string, bool) { return "ada", true }})
	ctx := newBrowser(t, 1280, 900)

	// Shut the gate: 20 items, 4 held by the worker, 16 waiting.
	f.shut()
	f.enqueue(repeat("ok", 20)...)
	eventually(t, "the worker holds 4 items", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`)
		return n == 4, strconv.Itoa(n)
	})
	run(t, ctx, "opening the overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(`tr[data-queue="mail"]`),
		chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`))
	unclaimed := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'mail' AND claim IS NULL`)
	claimed := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'mail' AND claim IS NOT NULL`)
	if unclaimed != 16 || claimed != 4 {
		t.Fatalf("database: %d unclaimed, %d claimed; want 16 and 4", unclaimed, claimed)
	}
	eventuallyText(t, ctx, `tr[data-queue="mail"] td[data-k="unclaimed"]`, strconv.Itoa(unclaimed))
	eventuallyText(t, ctx, `tr[data-queue="mail"] td[data-k="claimed"]`, strconv.Itoa(claimed))
	eventuallyText(t, ctx, `#total-sessions`, strconv.Itoa(count(t, pool, `SELECT count(*) FROM crdbwork_sessions`)))
	shot(t, ctx, "overview")

	// Open the gate: the worker acks everything; the page follows.
	f.open()
	eventuallyText(t, ctx, `tr[data-queue="mail"] td[data-k="unclaimed"]`, "0")
	eventuallyText(t, ctx, `tr[data-queue="mail"] td[data-k="claimed"]`, "0")
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
	// A steady stream of work: the ended-per-second figure shows it.
	stop := make(chan struct{})
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if err := f.tryEnqueue(repeat("ok", 5)...); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	eventually(t, "the throughput shows", func() (bool, string) {
		got := text(t, ctx, `tr[data-queue="mail"] td[data-k="rate"]`)
		return got != "—" && got != "0.0/s" && got != "", got
	})
	close(stop)
	<-fed
	if !eval[bool](t, ctx, `window.notReloaded === true`) {
		t.Fatal("the page was reloaded: the figures must change in place")
	}
	shot(t, ctx, "overview-live")

	// The queue's own page.
	run(t, ctx, "opening the queue page", chromedp.Navigate(base+"/queue?name=mail"), chromedp.WaitVisible(`#q-unclaimed`))
	eventuallyText(t, ctx, `#q-unclaimed`, "0")
	eventuallyText(t, ctx, `#q-parts`, "4")
	eventuallyText(t, ctx, `#q-sequenced`, "off")
	eventuallyText(t, ctx, `#q-cancelling`, "0")
	shot(t, ctx, "queue")

	// Sessions and parts: one session owns the 4 parts; a second worker
	// joins and the map shows the rebalance without a reload.
	run(t, ctx, "opening the sessions page", chromedp.Navigate(base+"/sessions"), chromedp.WaitVisible(`section.partmap[data-queue="mail"]`),
		chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`))
	eventuallyText(t, ctx, `#session-count`, "1")
	f.start("w2")
	eventuallyText(t, ctx, `#session-count`, "2")
	eventually(t, "the part map shows two owners and the rebalance", func() (bool, string) {
		owners := eval[int](t, ctx, `new Set(Array.from(document.querySelectorAll('section.partmap[data-queue="mail"] .part')).map(p => p.dataset.owner)).size`)
		rows := text(t, ctx, `table.rebalances tbody`)
		return owners == 2 && strings.Contains(rows, "mail"), fmt.Sprintf("%d owners; rebalances: %s", owners, rows)
	})
	if !eval[bool](t, ctx, `window.notReloaded === true`) {
		t.Fatal("the sessions page was reloaded")
	}
	dbOwners := count(t, pool, `SELECT count(DISTINCT session_id) FROM crdbwork_session_parts WHERE queue = 'mail'`)
	if dbOwners != 2 {
		t.Fatalf("the database has %d owners of mail's parts, want 2", dbOwners)
	}
	shot(t, ctx, "sessions")
}

// TestActionsFromThePage: pause and requeue, each confirmed in the page,
// change the database and the page, and are in the audit list.
func TestActionsFromThePage(t *testing.T) {
	pool := newDB(t)
	f := newFleet(t, pool)
	f.failBad.Store(true)
	f.start("w1")
	base := serve(t, pool, dashboard.Options{Auth: func(*http.Request) (string, bool) { return "ada", true }})
	ctx := newBrowser(t, 1280, 900)

	// Three bad items die.
	f.enqueue("bad", "bad", "bad")
	eventually(t, "three dead items", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`)
		return n == 3, strconv.Itoa(n)
	})

	// Pause from the queue page.
	run(t, ctx, "pausing", chromedp.Navigate(base+"/queue?name=mail"), chromedp.WaitVisible(`#act-pause`),
		chromedp.Click(`#act-pause`), chromedp.WaitVisible(`#confirm`))
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 0 {
		t.Fatal("the confirmation page paused the queue")
	}
	shot(t, ctx, "confirm")
	run(t, ctx, "confirming", chromedp.Click(`#confirm`), chromedp.WaitVisible(`#msg`))
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE name = 'mail' AND paused`); n != 1 {
		t.Fatal("the queue is not paused")
	}
	eventuallyText(t, ctx, `#q-state`, "paused")
	// Paused: new items wait, and the page shows them arrive.
	f.failBad.Store(false)
	f.enqueue(repeat("ok", 5)...)
	eventuallyText(t, ctx, `#q-unclaimed`, "5")
	shot(t, ctx, "queue-paused")

	// Resume; the workers drain the queue.
	run(t, ctx, "resuming", chromedp.Click(`#act-resume`), chromedp.WaitVisible(`#confirm`), chromedp.Click(`#confirm`), chromedp.WaitVisible(`#msg`))
	eventuallyText(t, ctx, `#q-unclaimed`, "0")

	// Requeue two dead items, selected on the items page.
	run(t, ctx, "opening the dead items", chromedp.Navigate(base+"/items?queue=mail&state=dead"), chromedp.WaitVisible(`table.dead input[name="sel"]`))
	shot(t, ctx, "items-dead")
	run(t, ctx, "selecting two", chromedp.Evaluate[chromedp.Void](`Array.from(document.querySelectorAll('table.dead input[name="sel"]')).slice(0, 2).forEach(c => c.checked = true)`),
		chromedp.Click(`#act-requeue-selected`), chromedp.WaitVisible(`#confirm`))
	if !strings.Contains(text(t, ctx, `#confirm-what`), "Requeue 2 dead item(s)") {
		t.Fatalf("confirmation says %q", text(t, ctx, `#confirm-what`))
	}
	run(t, ctx, "confirming", chromedp.Click(`#confirm`), chromedp.WaitVisible(`#msg`))
	eventually(t, "one dead item left, the requeued ones acked", func() (bool, string) {
		dead, items := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`), count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return dead == 1 && items == 0, fmt.Sprintf("%d dead, %d items", dead, items)
	})
	// The items page is live too: one dead row left.
	eventually(t, "the dead items page shows one row", func() (bool, string) {
		n := eval[int](t, ctx, `document.querySelectorAll('table.dead tbody tr[data-id]').length`)
		return n == 1, strconv.Itoa(n)
	})
	// An item's page.
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT id::TEXT FROM crdbwork_dead_items`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, "opening the item", chromedp.Navigate(base+"/item?id="+id), chromedp.WaitVisible(`main h2`))
	if got := text(t, ctx, `main`); !strings.Contains(got, "bad payload for "+id) {
		t.Errorf("the item page does not show the last error: %s", got)
	}
	shot(t, ctx, "item")

	// The audit list names the three actions, by ada.
	run(t, ctx, "opening the audit list", chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(`table.audit`))
	actions := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('table.audit tr[data-action]')).map(r => r.dataset.action + ":" + r.children[1].textContent)`)
	if strings.Join(actions, ",") != "requeue:ada,resume:ada,pause:ada" {
		t.Fatalf("audit list %v", actions)
	}
	shot(t, ctx, "audit")

	// A fair queue's tenants, and the pages at a phone's width: nothing
	// wider than the screen.
	{
		fq, _ := claim.New(pool, claim.Options{Queue: "reports"})
		if err := fq.UpdateSettings(context.Background(), claim.SettingsUpdate{Policy: &claim.Policy{Fair: true, TenantMaxInFlight: 2}}); err != nil {
			t.Fatal(err)
		}
		var items []claim.NewItem
		for i := range 40 {
			items = append(items, claim.NewItem{Payload: []byte(`{"report":` + strconv.Itoa(i) + `}`), Tenant: fmt.Sprintf("tenant-%d", i%(1+i%5))})
		}
		if _, err := fq.Enqueue(context.Background(), items...); err != nil {
			t.Fatal(err)
		}
		run(t, ctx, "opening the tenants", chromedp.Navigate(base+"/tenants?queue=reports"), chromedp.WaitVisible(`table.tenants`))
		eventuallyText(t, ctx, `tr[data-tenant="tenant-0"] td[data-k="unclaimed"]`, strconv.Itoa(
			count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'reports' AND tenant = 'tenant-0'`)))
		shot(t, ctx, "tenants")
		phone := newBrowser(t, 390, 844)
		for _, p := range []struct{ name, path, sel string }{
			{"overview-phone", "/", `tr[data-queue="mail"]`},
			{"items-phone", "/items?queue=reports", `table.items`},
			{"queue-phone", "/queue?name=reports", `#q-unclaimed`},
			{"sessions-phone", "/sessions", `table.sessions`},
		} {
			run(t, phone, "opening "+p.path+" on a phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch),
				chromedp.Navigate(base+p.path), chromedp.WaitVisible(p.sel))
			if w := eval[int](t, phone, `window.innerWidth`); w != 390 {
				t.Fatalf("the phone's viewport is %dpx wide, want 390", w)
			}
			if over := eval[int](t, phone, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
				t.Errorf("%s on a phone: %dpx wider than the screen", p.path, over)
			}
			shot(t, phone, p.name)
		}
	}
}

// TestRefusedActions: a read-only dashboard refuses actions, and a forged
// cross-site form post (another origin, no token) is refused; neither
// changes the database.
func TestRefusedActions(t *testing.T) {
	pool := newDB(t)
	f := newFleet(t, pool)
	f.enqueue("ok")
	ctx := newBrowser(t, 1280, 900)

	// Read-only: no action forms; a POST made by the page's own script,
	// with the token, is refused with 403.
	ro := serve(t, pool, dashboard.Options{ReadOnly: true})
	run(t, ctx, "opening the read-only page", chromedp.Navigate(ro+"/queue?name=mail"), chromedp.WaitVisible(`#read-only`))
	forms := eval[int](t, ctx, `document.querySelectorAll('form[method="post"]').length`)
	if forms != 0 {
		t.Errorf("the read-only page shows %d action forms", forms)
	}
	status := eval[int](t, ctx, `(async () => {
		const token = document.querySelector('meta[name="csrf-token"]').content;
		const body = new URLSearchParams({act: "pause", queue: "mail", confirm: "yes", csrf: token});
		return (await fetch("/action", {method: "POST", body})).status;
	})()`, chromedp.EvalAwaitPromise)
	if status != http.StatusForbidden {
		t.Errorf("read-only action: %d, want 403", status)
	}
	shot(t, ctx, "read-only")

	// A forged cross-site post: an attacker's page at another origin
	// submits a form to the dashboard while the user has it open.
	base := serve(t, pool, dashboard.Options{})
	run(t, ctx, "opening the dashboard", chromedp.Navigate(base+"/queue?name=mail"), chromedp.WaitVisible(`#act-pause`))
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/action">
<input name="act" value="pause"><input name="queue" value="mail"><input name="confirm" value="yes"><input name="csrf" value="guessed">
</form><script>document.getElementById("f").submit()</script>`, base)
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)
	run(t, ctx, "visiting the attacker's page", chromedp.Navigate(evilURL), chromedp.WaitVisible(`body`))
	eventually(t, "the forged post is answered", func() (bool, string) {
		loc := eval[string](t, ctx, `location.href`)
		body := text(t, ctx, `body`)
		return strings.HasPrefix(loc, base) && strings.Contains(body, "refused"), loc + ": " + body
	})
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 0 {
		t.Fatal("the forged post paused the queue")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_audit`); n != 0 {
		t.Fatal("a refused post was recorded as done")
	}
	shot(t, ctx, "forged-refused")
}

// TestBinaryNeedsBasicAuth: crdbwork dashboard with a password answers
// the browser 401 without credentials and serves the pages with them.
func TestBinaryNeedsBasicAuth(t *testing.T) {
	url := testdb.NewURL(t)
	bin := filepath.Join(t.TempDir(), "crdbwork")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/crdbwork/crdbwork/cmd/crdbwork").CombinedOutput(); err != nil {
		t.Fatalf("building crdbwork: %v\n%s", err, out)
	}
	env := append(os.Environ(), "CRDBWORK_DATABASE_URL="+url, "CRDBWORK_DASHBOARD_PASSWORD=s3cret")
	if out, err := (&exec.Cmd{Path: bin, Args: []string{bin, "migrate"}, Env: env}).CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "dashboard", "--addr", "127.0.0.1:0", "--json", "--auth-user", "ops")
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	buf := make([]byte, 512)
	n, err := stdout.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	line := string(buf[:n])
	i, j := strings.Index(line, `"url":"`), strings.Index(line, `/"`)
	if i < 0 || j < i {
		t.Fatalf("no url in %q", line)
	}
	base := line[i+len(`"url":"`) : j]

	ctx := newBrowser(t, 1280, 900)
	// Headless Chromium has nobody to ask for credentials: a 401
	// challenge ends the navigation with ERR_INVALID_AUTH_CREDENTIALS.
	refused := func(what, url string) {
		t.Helper()
		resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(url))
		switch {
		case err != nil && strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS"):
		case err == nil && resp.Status == http.StatusUnauthorized:
		default:
			t.Fatalf("%s: %v, %v; want a refusal (401)", what, resp, err)
		}
	}
	refused("without credentials", base+"/")
	refused("with a wrong password", strings.Replace(base, "http://", "http://ops:wrong@", 1)+"/")
	// With the credentials in the address, Chromium answers the
	// challenge with them.
	run(t, ctx, "opening with the password", chromedp.Navigate(strings.Replace(base, "http://", "http://ops:s3cret@", 1)+"/"),
		chromedp.WaitVisible(`#total-queues`))
	if got := text(t, ctx, `.who`); !strings.Contains(got, "ops") {
		t.Errorf("the page names %q, want ops", got)
	}
}
