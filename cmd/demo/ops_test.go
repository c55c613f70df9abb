package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
)

// migrated returns the URL and environment of a fresh database after
// `demo migrate`, and a pool on it.
func migrated(t *testing.T) (string, []string, *pgxpool.Pool) {
	t.Helper()
	url := testdb.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	if r := demo(t, time.Minute, env, "migrate"); r.code != 0 {
		t.Fatalf("migrate: exit status %d\n%s", r.code, r.stderr)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, env, pool
}

func countRows(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// makeDead enqueues n items into queue and fails each one permanently, so
// that they end in the dead-items table; it returns their ids.
func makeDead(t *testing.T, pool *pgxpool.Pool, queue string, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte("poison")}
	}
	ids, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	claimed, err := q.Claim(ctx, sess.ID(), n)
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d of %d: %v", len(claimed), n, err)
	}
	for _, it := range claimed {
		if out, err := q.Nack(ctx, it, claim.Permanent(errors.New("cannot parse the payload"))); err != nil || out != claim.Dead {
			t.Fatalf("nack: %v, %v", out, err)
		}
	}
	return ids
}

func jsonOut(t *testing.T, r result, v any) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), v); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, r.stdout)
	}
}

func wantExit(t *testing.T, r result, code int, msg string) {
	t.Helper()
	if r.code != code || !strings.Contains(r.stderr, msg) {
		t.Errorf("exit status %d, stderr %q; want %d and a message with %q", r.code, r.stderr, code, msg)
	}
}

func TestDeadRequeueCancel(t *testing.T) {
	_, env, pool := migrated(t)
	ids := makeDead(t, pool, "q1", 3)
	makeDead(t, pool, "other", 1) // another queue's dead item is not listed nor requeued

	var dead struct {
		Queue string `json:"queue"`
		Total int    `json:"total"`
		Items []struct {
			ID        string `json:"id"`
			LastError string `json:"last_error"`
			Payload   []byte `json:"payload"`
		} `json:"items"`
	}
	jsonOut(t, demo(t, time.Minute, env, "dead", "--queue", "q1", "--json"), &dead)
	if dead.Total != 3 || len(dead.Items) != 3 {
		t.Fatalf("dead: total %d, %d items; want 3", dead.Total, len(dead.Items))
	}
	if !strings.Contains(dead.Items[0].LastError, "cannot parse") || string(dead.Items[0].Payload) != "poison" {
		t.Errorf("dead item %+v: want its last error and payload", dead.Items[0])
	}
	if r := demo(t, time.Minute, env, "dead", "--queue", "q1", "--limit", "2"); r.code != 0 ||
		!strings.Contains(r.stdout, "3 dead items (the 2 most recent") || !strings.Contains(r.stdout, "cannot parse") {
		t.Errorf("dead --limit 2: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// One id.
	r := demo(t, time.Minute, env, "requeue", ids[0].String(), "--queue", "q1")
	if r.code != 0 || !strings.Contains(r.stdout, "requeued item "+ids[0].String()) {
		t.Fatalf("requeue ID: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND queue = 'q1'`, ids[0]); n != 1 {
		t.Errorf("the requeued item is in the items table %d times, want 1", n)
	}
	wantExit(t, demo(t, time.Minute, env, "requeue", ids[0].String(), "--queue", "q1"), 1, "is not a dead item")
	// Bad input.
	wantExit(t, demo(t, time.Minute, env, "requeue", "--queue", "q1"), 2, "or --all")
	wantExit(t, demo(t, time.Minute, env, "requeue", "not-a-uuid", "--queue", "q1"), 2, "is not an item id")
	wantExit(t, demo(t, time.Minute, env, "requeue", ids[1].String(), "--all", "--queue", "q1"), 2, "not both")
	wantExit(t, demo(t, time.Minute, env, "requeue", ids[1].String(), ids[2].String()), 2, "unexpected argument")

	// All the rest.
	var all struct {
		Requeued int `json:"requeued"`
	}
	jsonOut(t, demo(t, time.Minute, env, "requeue", "--all", "--queue", "q1", "--json"), &all)
	if all.Requeued != 2 {
		t.Errorf("requeue --all requeued %d, want 2", all.Requeued)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'q1'`); n != 0 {
		t.Errorf("%d dead items of q1 left, want 0", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'other'`); n != 1 {
		t.Errorf("%d dead items of the other queue, want 1 (untouched)", n)
	}
	if r := demo(t, time.Minute, env, "dead", "--queue", "q1"); r.code != 0 || !strings.Contains(r.stdout, "no dead items") {
		t.Errorf("dead after requeue --all: %d\n%s", r.code, r.stdout)
	}

	// Cancel.
	r = demo(t, time.Minute, env, "cancel", ids[1].String(), "--queue", "q1", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, ids[1].String()) {
		t.Fatalf("cancel: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, ids[1]); n != 0 {
		t.Errorf("the cancelled item is still there")
	}
	wantExit(t, demo(t, time.Minute, env, "cancel", ids[1].String(), "--queue", "q1"), 1, "has no item")
	wantExit(t, demo(t, time.Minute, env, "cancel", ids[2].String(), "--queue", "other"), 1, "has no item")
	wantExit(t, demo(t, time.Minute, env, "cancel"), 2, "give the id")
}

func TestPartsAndStatus(t *testing.T) {
	_, env, pool := migrated(t)
	var p struct {
		Parts    int    `json:"parts"`
		Stored   bool   `json:"stored"`
		Previous int    `json:"previous"`
		Unowned  string `json:"unowned"`
	}
	jsonOut(t, demo(t, time.Minute, env, "parts", "--queue", "pq", "--json"), &p)
	if p.Parts != 1 || p.Stored {
		t.Errorf("parts of a new queue: %+v, want 1, not stored", p)
	}
	jsonOut(t, demo(t, time.Minute, env, "parts", "--queue", "pq", "--set", "8", "--json"), &p)
	if p.Parts != 8 || p.Previous != 1 || !p.Stored || p.Unowned != "0-7" {
		t.Errorf("parts --set 8: %+v", p)
	}
	if n := countRows(t, pool, `SELECT num_parts FROM crdbwork_queues WHERE name = 'pq'`); n != 8 {
		t.Errorf("stored parts %d, want 8", n)
	}
	wantExit(t, demo(t, time.Minute, env, "parts", "--queue", "pq", "--set", "0"), 2, "--set")
	wantExit(t, demo(t, time.Minute, env, "parts", "--queue", "pq", "--set", "5000"), 2, "--set")

	// The enqueue default is the run/work default: a new queue gets 16.
	r := demo(t, time.Minute, env, "enqueue", "--count", "50", "--json")
	if r.code != 0 || num(t, lastJSON(t, r), "parts") != 16 {
		t.Fatalf("enqueue into a new queue: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Status: the parts nobody owns are named; a mistyped queue warns.
	r = demo(t, time.Minute, env, "status")
	if r.code != 0 || !strings.Contains(r.stdout, `owned by nobody: 16 (parts 0-15)`) || strings.Contains(r.stdout, "warning") {
		t.Errorf("status:\n%s%s", r.stdout, r.stderr)
	}
	if !regexp.MustCompile(`50 unclaimed \(50 due, oldest due [0-9.]+m?s\)`).MatchString(r.stdout) {
		t.Errorf("status does not show the due backlog and its oldest item's age:\n%s", r.stdout)
	}
	r = demo(t, time.Minute, env, "status", "--queue", "demo-typo")
	if r.code != 0 || !strings.Contains(r.stdout, `warning: nobody has enqueued to queue "demo-typo"`) {
		t.Errorf("status of an unknown queue does not warn:\n%s", r.stdout)
	}
}

// TestStatusWatch runs status --watch with stdout a pipe: plain snapshots,
// each with the current backlog, until SIGINT, then exit 0.
func TestStatusWatch(t *testing.T) {
	_, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "20"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, demoBin, "status", "--watch", "--interval", "100ms")
	cmd.Env = env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	snapshots, sawBacklog, sawEmpty := 0, false, false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "--- ") {
			snapshots++
		}
		if strings.Contains(line, `queue "demo": 16 parts, 20 unclaimed`) && !sawBacklog {
			sawBacklog = true
			// The next snapshots must see the change.
			if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items`); err != nil {
				t.Fatal(err)
			}
		}
		if sawBacklog && strings.Contains(line, `queue "demo": 16 parts, 0 unclaimed`) {
			sawEmpty = true
			break
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	go io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Errorf("status --watch after SIGINT: %v", err)
	}
	if !sawBacklog || !sawEmpty || snapshots < 2 {
		t.Errorf("snapshots %d, saw the backlog %v, then empty %v", snapshots, sawBacklog, sawEmpty)
	}
}

// TestMetricsEndpoint scrapes `demo work --metrics-addr` while it works.
func TestMetricsEndpoint(t *testing.T) {
	const n = 400
	_, env, _ := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "400", "--parts", "4"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, demoBin, "work", "--metrics-addr", "127.0.0.1:0", "--name", "metrics-worker", "--task-time", "1ms")
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	sc := bufio.NewScanner(stderr)
	var addr string
	started := false
	var lines []string
	for (addr == "" || !started) && sc.Scan() {
		lines = append(lines, sc.Text())
		if m := regexp.MustCompile(`serving metrics on (http://\S+/metrics)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
		if strings.Contains(sc.Text(), `metrics-worker working on queue "demo" (postgres, 4 parts, session `) {
			started = true
		}
	}
	if addr == "" || !started {
		t.Fatalf("no metrics address or start line on stderr:\n%s", strings.Join(lines, "\n"))
	}
	go io.Copy(io.Discard, stderr)

	scrape := func() map[string]float64 {
		t.Helper()
		resp, err := http.Get(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		vals := map[string]float64{}
		for name, f := range fams {
			for _, m := range f.Metric {
				key := name
				for _, l := range m.Label {
					if l.GetName() == "outcome" || l.GetName() == "part" {
						key += "/" + l.GetValue()
					}
				}
				switch {
				case m.Counter != nil:
					vals[key] += m.Counter.GetValue()
				case m.Gauge != nil:
					vals[key] += m.Gauge.GetValue()
				case m.Histogram != nil:
					vals[key+"_count"] += float64(m.Histogram.GetSampleCount())
					vals[key+"_sum"] += m.Histogram.GetSampleSum()
				}
			}
		}
		return vals
	}
	deadline := time.Now().Add(90 * time.Second)
	var v map[string]float64
	for {
		v = scrape()
		backlog := 0.0
		for p := range 4 {
			backlog += v["crdbwork_backlog_items/"+strconv.Itoa(p)]
		}
		// The database gauges are cached for a few seconds.
		if v["crdbwork_items_acked_total"] == n && backlog == 0 && v["crdbwork_claimed_items"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acked_total %v after 90s, want %d", v["crdbwork_items_acked_total"], n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for key, want := range map[string]float64{
		"crdbwork_handler_duration_seconds/acked_count": n,
		"crdbwork_ack_batch_size_sum":                   n,
		"crdbwork_sessions_started_total":               1,
		"crdbwork_parts_acquired_total":                 4,
		"crdbwork_sessions_live":                        1,
		"crdbwork_database_up":                          1,
		"crdbwork_dead_items":                           0,
	} {
		if got := v[key]; got != want {
			t.Errorf("%s = %v, want %v", key, got, want)
		}
	}
	for p := range 4 {
		if _, ok := v["crdbwork_backlog_items/"+strconv.Itoa(p)]; !ok {
			t.Errorf("no backlog series for part %d of the drained queue (want 0)", p)
		}
	}
	if v["go_goroutines"] == 0 {
		t.Error("the Go runtime's metrics are missing")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("work after SIGTERM: %v", err)
	}
}

func TestCleanup(t *testing.T) {
	url, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "30"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	makeDead(t, pool, "demo", 2)
	makeDead(t, pool, "keep", 1)
	var out struct {
		Items int `json:"items_deleted"`
		Dead  int `json:"dead_items_deleted"`
	}
	jsonOut(t, demo(t, time.Minute, env, "cleanup", "--json"), &out)
	if out.Items != 30 || out.Dead != 2 {
		t.Errorf("cleanup deleted %d items and %d dead items, want 30 and 2", out.Items, out.Dead)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'demo\_%'`); n != 0 {
		t.Errorf("%d demo tables left", n)
	}
	// Another queue's dead item keeps the schema.
	wantExit(t, demo(t, time.Minute, env, "cleanup", "--drop-schema"), 1, `"keep"`)
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'keep'`); n != 1 {
		t.Errorf("the other queue's dead item is gone")
	}
	r := demo(t, time.Minute, env, "cleanup", "--queue", "keep", "--drop-schema")
	if r.code != 0 {
		t.Fatalf("cleanup --drop-schema: %d\n%s", r.code, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'crdbwork\_%'`); n != 0 {
		t.Errorf("%d crdbwork tables left after --drop-schema", n)
	}
	wantExit(t, demo(t, time.Minute, demoEnv(), "status", "--database-url", url), 2, "demo migrate")
}

func TestOperatorBadInput(t *testing.T) {
	url, env, pool := migrated(t)
	u, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	other := func(db, user string) string {
		c := strings.Replace(url, "/"+u.Database, "/"+db, 1)
		return strings.Replace(c, "://"+u.User+"@", "://"+user+"@", 1)
	}
	wantExit(t, demo(t, time.Minute, nil, "run", "--items", "99999999999999999999"), 2, "too large (must be between 1 and 100000000)")
	r := demo(t, time.Minute, nil, "status", "--database-url", "mysql://u:secret@host/db")
	wantExit(t, r, 2, `unsupported scheme "mysql"`)
	if strings.Contains(r.stderr, "secret") || !strings.Contains(r.stderr, "postgresql://") {
		t.Errorf("the message shows the password or does not list the accepted schemes: %s", r.stderr)
	}
	wantExit(t, demo(t, time.Minute, nil, "status", "--database-url", other("no_such_db", u.User)), 2, `the database "no_such_db" does not exist`)
	wantExit(t, demo(t, time.Minute, nil, "status", "--database-url", other(u.Database, "no_such_user")), 2, `refused user "no_such_user"`)
	// A partly missing schema.
	if _, err := pool.Exec(context.Background(), `DROP TABLE crdbwork_dead_items`); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"status", "dead", "parts"} {
		wantExit(t, demo(t, time.Minute, env, cmd), 2, `"crdbwork_dead_items" is missing`)
	}
	r = demo(t, time.Minute, nil, "--version")
	if r.code != 0 || !regexp.MustCompile(`^crdbwork demo \d+\.\d+\.\d+ \(.*go1\.\d+`).MatchString(r.stdout) {
		t.Errorf("--version: %d %q", r.code, r.stdout)
	}
}
