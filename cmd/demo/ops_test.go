package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// migrated returns the URL and environment of a fresh database with the
// crdbwork schema (what `crdbwork migrate` makes, copied from the test
// binary's template: TestOperatorCommands and TestMigrateUpgrade run
// migrate itself), and a pool on it.
func migrated(t *testing.T) (string, []string, *pgxpool.Pool) {
	t.Helper()
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
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
	claimed, err := q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d of %d: %v", len(claimed), n, err)
	}
	for _, it := range claimed {
		if out, err := q.Nack(ctx, it, claim.Permanent(errors.New("cannot parse the payload"))); err != nil || out != claim.Dead {
			t.Fatalf("nack: %v, %v", out, err)
		}
	}
	return ids.IDs
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
	t.Parallel()
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
	jsonOut(t, op(t, time.Minute, env, "dead", "--queue", "q1", "--json"), &dead)
	if dead.Total != 3 || len(dead.Items) != 3 {
		t.Fatalf("dead: total %d, %d items; want 3", dead.Total, len(dead.Items))
	}
	if !strings.Contains(dead.Items[0].LastError, "cannot parse") || string(dead.Items[0].Payload) != "poison" {
		t.Errorf("dead item %+v: want its last error and payload", dead.Items[0])
	}
	if r := op(t, time.Minute, env, "dead", "--queue", "q1", "--limit", "2"); r.code != 0 ||
		!strings.Contains(r.stdout, "3 dead items (2 shown)") || !strings.Contains(r.stdout, "more: --after ") || !strings.Contains(r.stdout, "cannot parse") {
		t.Errorf("dead --limit 2: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// One id.
	r := op(t, time.Minute, env, "requeue", ids[0].String(), "--queue", "q1")
	if r.code != 0 || !strings.Contains(r.stdout, "requeued item "+ids[0].String()) {
		t.Fatalf("requeue ID: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND queue = 'q1'`, ids[0]); n != 1 {
		t.Errorf("the requeued item is in the items table %d times, want 1", n)
	}
	wantExit(t, op(t, time.Minute, env, "requeue", ids[0].String(), "--queue", "q1"), 1, "is not a dead item")
	// Bad input.
	wantExit(t, op(t, time.Minute, env, "requeue", "--queue", "q1"), 2, "or --all")
	wantExit(t, op(t, time.Minute, env, "requeue", "not-a-uuid", "--queue", "q1"), 2, "is not an item id")
	wantExit(t, op(t, time.Minute, env, "requeue", ids[1].String(), "--all", "--queue", "q1"), 2, "not both")
	wantExit(t, op(t, time.Minute, env, "requeue", ids[1].String(), ids[2].String()), 2, "unexpected argument")

	// All the rest.
	var all struct {
		Requeued int `json:"requeued"`
	}
	wantExit(t, op(t, time.Minute, env, "requeue", "--all", "--queue", "q1"), 2, "--yes")
	jsonOut(t, op(t, time.Minute, env, "requeue", "--all", "--queue", "q1", "--yes", "--json"), &all)
	if all.Requeued != 2 {
		t.Errorf("requeue --all requeued %d, want 2", all.Requeued)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'q1'`); n != 0 {
		t.Errorf("%d dead items of q1 left, want 0", n)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'other'`); n != 1 {
		t.Errorf("%d dead items of the other queue, want 1 (untouched)", n)
	}
	if r := op(t, time.Minute, env, "dead", "--queue", "q1"); r.code != 0 || !strings.Contains(r.stdout, "no dead items") {
		t.Errorf("dead after requeue --all: %d\n%s", r.code, r.stdout)
	}

	// Cancel.
	wantExit(t, op(t, time.Minute, env, "cancel", ids[1].String(), "--queue", "q1"), 2, "--yes")
	r = op(t, time.Minute, env, "cancel", ids[1].String(), "--queue", "q1", "--yes", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, ids[1].String()) {
		t.Fatalf("cancel: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, ids[1]); n != 0 {
		t.Errorf("the cancelled item is still there")
	}
	wantExit(t, op(t, time.Minute, env, "cancel", ids[1].String(), "--queue", "q1", "--yes"), 1, "has no item")
	wantExit(t, op(t, time.Minute, env, "cancel", ids[2].String(), "--queue", "other", "--yes"), 1, "has no item")
	wantExit(t, op(t, time.Minute, env, "cancel"), 2, "give the id")
}

func TestPartsAndStatus(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	var p struct {
		Parts    int    `json:"parts"`
		Stored   bool   `json:"stored"`
		Previous int    `json:"previous"`
		Unowned  string `json:"unowned"`
		InUse    bool   `json:"in_use"`
	}
	wantExit(t, op(t, time.Minute, env, "parts", "--queue", "pq", "--json"), 2, `unknown queue "pq"`)
	jsonOut(t, op(t, time.Minute, env, "parts", "--queue", "pq", "--create", "--json"), &p)
	if p.Parts != 1 || p.Stored {
		t.Errorf("parts of a new queue: %+v, want 1, not stored", p)
	}
	jsonOut(t, op(t, time.Minute, env, "parts", "--queue", "pq", "--set", "8", "--yes", "--create", "--json"), &p)
	if p.Parts != 8 || p.Previous != 1 || !p.Stored || p.Unowned != "" || p.InUse { // no session works it: no alarm
		t.Errorf("parts --set 8: %+v", p)
	}
	if n := countRows(t, pool, `SELECT num_parts FROM crdbwork_queues WHERE name = 'pq'`); n != 8 {
		t.Errorf("stored parts %d, want 8", n)
	}
	wantExit(t, op(t, time.Minute, env, "parts", "--queue", "pq", "--set", "0"), 2, "--set")
	wantExit(t, op(t, time.Minute, env, "parts", "--queue", "pq", "--set", "5000"), 2, "--set")

	// The enqueue default is the run/work default: a new queue gets 16.
	r := demo(t, time.Minute, env, "enqueue", "--count", "50", "--json", "--shared-database") // beside pq
	if r.code != 0 || num(t, lastJSON(t, r), "parts") != 16 {
		t.Fatalf("enqueue into a new queue: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Status: parts no session works are no alarm; a mistyped queue warns.
	r = op(t, time.Minute, env, "status")
	if r.code != 0 || !strings.Contains(r.stdout, `not in use (16 parts, no session owns one`) || strings.Contains(r.stdout, "owned by nobody") || strings.Contains(r.stdout, "warning") {
		t.Errorf("status:\n%s%s", r.stdout, r.stderr)
	}
	if !regexp.MustCompile(`backlog: 50 unclaimed, 50 due \(oldest due for [0-9.]+m?s\), 0 claimed`).MatchString(r.stdout) {
		t.Errorf("status does not show the due backlog and its oldest item's age:\n%s", r.stdout)
	}
	wantExit(t, op(t, time.Minute, env, "status", "--queue", "deom"), 2, `unknown queue "deom"`)
	wantExit(t, op(t, time.Minute, env, "status", "--queue", "deom"), 2, `did you mean "demo"?`)
}

// TestStatusWatch runs status --watch with stdout a pipe: plain snapshots,
// each with the current backlog, until SIGINT, then exit 0.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "20"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	watch, out := startOp(t, env, true, "status", "--watch", "--interval", "100ms")
	await.Until(t, "a snapshot with the backlog", func() bool { return out.count("backlog: 20 unclaimed") > 0 }, await.Show(out.String))
	if _, err := pool.Exec(context.Background(), `DELETE FROM crdbwork_items`); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "a snapshot without it", func() bool { return out.count("backlog: 0 unclaimed") > 0 }, await.Show(out.String))
	watch.Process.Signal(syscall.SIGINT)
	if err := watch.Wait(); err != nil {
		t.Errorf("status --watch after SIGINT: %v", err)
	}
	if n := out.count("--- "); n < 2 {
		t.Errorf("%d snapshots, want at least 2:\n%s", n, out.String())
	}
}

// TestMetricsEndpoint scrapes `demo work --metrics-addr` while it works.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	const n = 400
	_, env, _ := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "400", "--parts", "4"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	cmd, log := startDemo(t, env, false, "work", "--metrics-addr", "127.0.0.1:0", "--name", "metrics-worker", "--task-time", "1ms")
	await.Until(t, "the start line", func() bool {
		return log.count(`metrics-worker working on queue "demo" (postgres, 4 parts, session `) == 1
	}, await.Show(log.String))
	var addr string
	for _, l := range log.snapshot() {
		if m := regexp.MustCompile(`serving metrics on (http://\S+/metrics)`).FindStringSubmatch(l); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no metrics address on stderr:\n%s", log.String())
	}

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
	var v map[string]float64
	// The database gauges come from a read that may time out on a busy
	// machine (crdbwork_database_up 0, no backlog series): wait for a
	// scrape whose read succeeded and shows the empty queue.
	await.Until(t, "every item acked, and the database gauges (cached for a few seconds) read and showing an empty queue", func() (bool, string) {
		v = scrape()
		backlog, series := 0.0, 0
		for p := range 4 {
			b, ok := v["crdbwork_backlog_items/"+strconv.Itoa(p)]
			if ok {
				series++
			}
			backlog += b
		}
		return v["crdbwork_items_acked_total"] == n && v["crdbwork_database_up"] == 1 && series == 4 && backlog == 0 && v["crdbwork_claimed_items"] == 0,
			fmt.Sprintf("acked_total %v of %d, database_up %v, backlog %v in %d series of 4, claimed %v",
				v["crdbwork_items_acked_total"], n, v["crdbwork_database_up"], backlog, series, v["crdbwork_claimed_items"])
	}, await.Show(log.String))
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

func TestOperatorBadInput(t *testing.T) {
	t.Parallel()
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
	r := op(t, time.Minute, nil, "status", "--database-url", "mysql://u:secret@host/db")
	wantExit(t, r, 2, `unsupported scheme "mysql"`)
	if strings.Contains(r.stderr, "secret") || !strings.Contains(r.stderr, "postgresql://") {
		t.Errorf("the message shows the password or does not list the accepted schemes: %s", r.stderr)
	}
	wantExit(t, op(t, time.Minute, nil, "status", "--database-url", other("no_such_db", u.User)), 2, `the database "no_such_db" does not exist`)
	wantExit(t, op(t, time.Minute, nil, "status", "--database-url", other(u.Database, "no_such_user")), 2, `refused user "no_such_user"`)
	// A busy metrics address.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	wantExit(t, demo(t, time.Minute, env, "work", "--metrics-addr", busy.Addr().String()), 2, "--metrics-addr "+busy.Addr().String())
	// A partly missing schema.
	if _, err := pool.Exec(context.Background(), `DROP TABLE crdbwork_dead_items`); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"status", "dead", "parts"} {
		wantExit(t, op(t, time.Minute, env, cmd), 2, `"crdbwork_dead_items" is missing`)
	}
	r = demo(t, time.Minute, nil, "--version")
	if r.code != 0 || !regexp.MustCompile(`^crdbwork demo \d+\.\d+\.\d+ \(.*go1\.\d+`).MatchString(r.stdout) {
		t.Errorf("--version: %d %q", r.code, r.stdout)
	}
}

type sessionJSON struct {
	Name     string  `json:"name"`
	Age      float64 `json:"age_seconds"`
	Acked    int64   `json:"acked"`
	InFlight int64   `json:"in_flight"`
	Claimed  int64   `json:"claimed"`
}

type statusJSON struct {
	Paused   bool          `json:"paused"`
	Sessions []sessionJSON `json:"sessions"`
	Queues   []struct {
		Unclaimed int64 `json:"unclaimed"`
		Claimed   int64 `json:"claimed"`
	} `json:"queues"`
	ItemsPerSecond float64 `json:"items_per_second"`
}

func statusOf(t *testing.T, env []string) statusJSON {
	t.Helper()
	var s statusJSON
	jsonOut(t, op(t, time.Minute, env, "status", "--json"), &s)
	return s
}

// TestPauseResume pauses a queue, checks that a running worker claims
// nothing, resumes it, and checks that the work is done and reported by the
// session's heartbeat counters and status --watch's throughput.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	const n = 300
	_, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "300"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	r := op(t, time.Minute, env, "pause")
	if r.code != 0 || !strings.Contains(r.stdout, `paused queue "demo"`) {
		t.Fatalf("pause: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var p struct {
		Paused    bool `json:"paused"`
		WasPaused bool `json:"was_paused"`
	}
	jsonOut(t, op(t, time.Minute, env, "pause", "--json"), &p)
	if !p.WasPaused {
		t.Errorf("a second pause does not say the queue was paused")
	}
	if s := statusOf(t, env); !s.Paused {
		t.Errorf("status does not show the pause")
	}
	if r := op(t, time.Minute, env, "status"); !strings.Contains(r.stdout, "PAUSED") {
		t.Errorf("status text does not show the pause:\n%s", r.stdout)
	}

	work, _ := startDemo(t, env, false, "work", "--name", "paused-worker", "--task-time", "2ms", "--heartbeat", "200ms", "--expiry", "2s")
	// The worker polls every 150 ms or so: after 2 s of its session, a
	// claim would have happened.
	await.Until(t, "the worker's session to be 2s old", func() (bool, string) {
		s := statusOf(t, env)
		return len(s.Sessions) == 1 && s.Sessions[0].Age >= 2, fmt.Sprintf("sessions %+v", s.Sessions)
	})
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL OR attempts > 0`); n != 0 {
		t.Fatalf("%d items claimed from a paused queue", n)
	}

	// Resume, and watch the throughput while the items go.
	watch, out := startOp(t, env, true, "status", "--watch", "--json", "--interval", "200ms")
	if r := op(t, time.Minute, env, "resume"); r.code != 0 || !strings.Contains(r.stdout, `resumed queue "demo"`) {
		t.Fatalf("resume: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sawRate := false
	await.Until(t, "the session's heartbeat to report every ack", func() bool {
		for _, l := range out.snapshot() {
			var s statusJSON
			if err := json.Unmarshal([]byte(l), &s); err != nil {
				t.Fatalf("status --watch --json line: %v\n%s", err, l)
			}
			if s.ItemsPerSecond > 0 {
				sawRate = true
			}
			if len(s.Sessions) == 1 && s.Sessions[0].Acked == n && s.Sessions[0].InFlight == 0 {
				return true
			}
		}
		return false
	}, await.Within(time.Minute), await.Show(out.String))
	watch.Process.Signal(syscall.SIGINT)
	watch.Wait()
	if !sawRate {
		t.Error("status --watch never showed a throughput above 0 while 300 items were acked")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Errorf("%d items left after resume", n)
	}
	work.Process.Signal(syscall.SIGTERM)
	if err := work.Wait(); err != nil {
		t.Errorf("work: %v", err)
	}
}

// TestMigrateUpgrade builds a version-1 database, checks that crdbwork and
// the demo refuse it with the versions named, and upgrades it with crdbwork
// migrate.
func TestMigrateUpgrade(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, s := range crsql.Migrations()[0].Statements(crsql.Tables{}) {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	for _, cmd := range []string{"status", "dead", "pause"} {
		wantExit(t, op(t, time.Minute, env, cmd), 2, fmt.Sprintf("at version 1, this binary needs %d: run `crdbwork migrate`", crsql.Version))
	}
	wantExit(t, demo(t, time.Minute, env, "work"), 2, fmt.Sprintf("at version 1, this binary needs %d: run `crdbwork migrate`", crsql.Version))
	r := op(t, time.Minute, env, "migrate")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("upgraded the crdbwork schema from version 1 to %d", crsql.Version)) {
		t.Fatalf("migrate: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var m struct {
		Version  int `json:"schema_version"`
		Previous int `json:"previous_version"`
	}
	jsonOut(t, op(t, time.Minute, env, "migrate", "--json"), &m)
	if m.Version != crsql.Version || m.Previous != crsql.Version {
		t.Errorf("second migrate: %+v, want version %d from %[2]d", m, crsql.Version)
	}
	if r := runProgram(t, crdbworkBin, time.Minute, env, "status"); r.code != 0 || !strings.Contains(r.stdout, "no queues") {
		t.Errorf("status (of every queue) after the upgrade: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A newer schema is refused.
	if _, err := pool.Exec(context.Background(), `UPDATE crdbwork_schema_version SET version = 99`); err != nil {
		t.Fatal(err)
	}
	wantExit(t, op(t, time.Minute, env, "migrate"), 2, "newer")
	wantExit(t, op(t, time.Minute, env, "status"), 2, "newer")
}

// TestStaleSession: a session that stopped heartbeating shows as stale
// before it expires, and the progress of the others is not hidden.
func TestStaleSession(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	ctx := context.Background()
	sctx, stop := context.WithCancel(ctx)
	sess, err := session.Start(sctx, pool, session.Options{Tuning: session.Tuning{Expiry: time.Minute, Heartbeat: time.Second}, Name: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	stop() // like a crash: no more heartbeats, the row stays until it expires
	await.Recv(t, "the session to end", sess.Done())
	// 30 s without a heartbeat (two heartbeats allowed by a 1 min expiry are 40 s: not stale yet).
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_sessions SET heartbeat_at = now() - interval '30 seconds' WHERE id = $1`, sess.ID()); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Sessions []struct {
			Name  string  `json:"name"`
			Stale bool    `json:"stale"`
			Since float64 `json:"since_heartbeat_seconds"`
		} `json:"sessions"`
	}
	// Stale: more than two heartbeats of the longest interval the expiry
	// allows (expiry / 3), by the time since the heartbeat that status
	// read itself (a loaded machine may take seconds to run status).
	const staleAfter = 40.0
	// Status of every queue (there is none): the sessions all the same.
	jsonOut(t, runProgram(t, crdbworkBin, time.Minute, env, "status", "--json"), &st)
	if len(st.Sessions) != 1 || st.Sessions[0].Since < 30 || st.Sessions[0].Stale != (st.Sessions[0].Since > staleAfter) {
		t.Fatalf("30s after the last heartbeat of a 1 min expiry: %+v, want stale only past %vs", st.Sessions, staleAfter)
	}
	if st.Sessions[0].Stale {
		t.Logf("status ran %.1fs after the last heartbeat (stale past %vs): the not-yet-stale case went unchecked", st.Sessions[0].Since, staleAfter)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_sessions SET heartbeat_at = now() - interval '45 seconds' WHERE id = $1`, sess.ID()); err != nil {
		t.Fatal(err)
	}
	jsonOut(t, runProgram(t, crdbworkBin, time.Minute, env, "status", "--json"), &st)
	if len(st.Sessions) != 1 || st.Sessions[0].Since < 45 || !st.Sessions[0].Stale {
		t.Fatalf("45s after the last heartbeat of a 1 min expiry: %+v, want stale", st.Sessions)
	}
	r := runProgram(t, crdbworkBin, time.Minute, env, "status")
	m := regexp.MustCompile(`silent .* (\d+)\.\d+s!`).FindStringSubmatch(r.stdout)
	if !strings.Contains(r.stdout, "1 STALE") || m == nil {
		t.Fatalf("status does not mark the stale session:\n%s", r.stdout)
	}
	if beat, _ := strconv.Atoi(m[1]); beat < 45 {
		t.Errorf("status shows the stale session's last heartbeat %ss ago, want at least 45s:\n%s", m[1], r.stdout)
	}
}

// lineLog collects the lines a process writes (it is the process's
// stdout or stderr; Wait returns once everything written is in).
type lineLog struct {
	mu      sync.Mutex
	lines   []string
	partial []byte
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
}

func (l *lineLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func (l *lineLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// startDemo starts the demo binary with args in the background and collects
// its stderr (its stdout, with fromStdout) line by line. The process is
// killed when the test ends, if it has not been waited for.
func startDemo(t *testing.T, env []string, fromStdout bool, args ...string) (*exec.Cmd, *lineLog) {
	t.Helper()
	return startProgram(t, demoBin, env, fromStdout, args...)
}

// startOp is startDemo for an operator command, run with crdbwork (see op).
func startOp(t *testing.T, env []string, fromStdout bool, args ...string) (*exec.Cmd, *lineLog) {
	t.Helper()
	env, args = opArgs(env, args)
	return startProgram(t, crdbworkBin, env, fromStdout, args...)
}

// startProgram starts bin with args in env and logs its stdout (or stderr)
// by line; the test's cleanup kills it.
func startProgram(t *testing.T, bin string, env []string, fromStdout bool, args ...string) (*exec.Cmd, *lineLog) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	log := &lineLog{}
	if fromStdout {
		cmd.Stdout = log
	} else {
		cmd.Stderr = log
	}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, log
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestOutageLogs cuts a worker off the database (a TCP proxy drops every
// connection and refuses new ones) and checks its stderr: warnings are
// sampled, the outage is said once, the recovery is logged once, and the
// worker finishes the queue afterwards.
func TestOutageLogs(t *testing.T) {
	t.Parallel()
	url, env, pool := migrated(t)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "3000"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	proxy, proxied, err := faultproxy.ForURL(url)
	if err != nil {
		t.Skip(err)
	}
	defer proxy.Close()
	ctx := context.Background()
	work, log := startDemo(t, demoEnv("DATABASE_URL="+proxied), false, "work", "--name", "cut-worker", "--task-time", "5ms", "--concurrency", "8")
	show := await.Show(log.String)
	await.Until(t, "the start line", func() bool { return log.count("cut-worker working on queue") == 1 }, show)
	await.Until(t, "some items to be done", func() bool {
		return countRows(t, pool, `SELECT count(*) FROM demo_results`) >= 300
	}, show)
	proxy.Cut()
	await.Until(t, "the outage line", func() bool { return log.count("the database is not answering") == 1 }, show)
	// Let the failures pile up for two seconds of claims, acks and
	// heartbeats: the fault's duration (the sampling it checks is per
	// 10 s, so it is not stretched).
	time.Sleep(2 * time.Second)
	proxy.Restore()
	await.Until(t, "the recovery line", func() bool { return log.count("database reachable again after") == 1 }, show)
	await.Until(t, "the queue to drain after the outage", func() (bool, string) {
		if countRows(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 {
			return true, ""
		}
		rows, _ := pool.Query(ctx, `SELECT claim IS NOT NULL, attempts, lease_until > now(), count(*) FROM crdbwork_items GROUP BY 1, 2, 3`)
		var left []string
		for rows.Next() {
			var claimed, leased *bool
			var attempts, n int64
			rows.Scan(&claimed, &attempts, &leased, &n)
			left = append(left, fmt.Sprintf("claimed=%v attempts=%d leased=%v: %d", fmtBool(claimed), attempts, fmtBool(leased), n))
		}
		rows.Close()
		return false, fmt.Sprintf("left: %v", left)
	}, await.Within(time.Minute), show)
	work.Process.Signal(syscall.SIGTERM)
	work.Wait()
	warns := log.count("\tWARN\t")
	t.Logf("%d WARN lines; stderr:\n%s", warns, log.String())
	if n := log.count("database reachable again after"); n != 1 {
		t.Errorf("%d recovery lines, want 1", n)
	}
	if n := log.count("the database is not answering"); n != 1 {
		t.Errorf("%d outage lines, want 1", n)
	}
	// Sampled: per message, the first 3 of each 10 s (then one in 100).
	// Unsampled, the claim loop alone warns every 150 ms or so.
	for _, msg := range []string{"claim failed", "heartbeat failed", "rebalance failed", "ack failed"} {
		if n := log.count("\tWARN\t" + msg); n > 3 {
			t.Errorf("%d %q lines for one outage of a few seconds, want at most 3 (sampled)", n, msg)
		}
	}
	if log.count("\tWARN\t") == 0 {
		t.Error("no warning at all during the outage")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM demo_results`); n < 3000 {
		t.Errorf("%d results after the outage, want 3000", n)
	}
}

func fmtBool(b *bool) string {
	if b == nil {
		return "null"
	}
	return strconv.FormatBool(*b)
}

// TestStoredPartsWin: a worker asked for 16 parts on a queue stored with 4
// works with 4, says so in its start line, and warns.
func TestStoredPartsWin(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	adoptDemoQueue(t, pool, "demo") // the demo works only on its own queues
	if r := op(t, time.Minute, env, "parts", "--set", "4", "--yes", "--create"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	work, log := startDemo(t, env, false, "work", "--name", "w16", "--parts", "16")
	await.Until(t, "the start line", func() bool { return log.count(`w16 working on queue "demo"`) == 1 }, await.Show(log.String))
	await.Until(t, "the warning", func() bool { return log.count("different stored number of parts") == 1 }, await.Show(log.String))
	if log.count("(postgres, 4 parts,") != 1 && log.count("(cockroach, 4 parts,") != 1 {
		t.Errorf("the start line does not say 4 parts:\n%s", log.String())
	}
	await.Until(t, "the worker to own parts 0-3", func() bool {
		var st struct {
			Sessions []struct {
				Parts string `json:"parts"`
			} `json:"sessions"`
			NumParts int `json:"num_parts"`
		}
		jsonOut(t, op(t, time.Minute, env, "status", "--json"), &st)
		return st.NumParts == 4 && len(st.Sessions) == 1 && st.Sessions[0].Parts == "0-3"
	}, await.Show(log.String))
	work.Process.Signal(syscall.SIGTERM)
	if err := work.Wait(); err != nil {
		t.Errorf("work: %v\n%s", err, log.String())
	}
}

// TestDestructiveFlagsNotFromEnvironment: a CRDBWORK_ALL, CRDBWORK_SET,
// CRDBWORK_YES, CRDBWORK_CREATE or DEMO_DROP_SCHEMA left in the environment
// turns nothing on.
func TestDestructiveFlagsNotFromEnvironment(t *testing.T) {
	t.Parallel()
	url, _, pool := migrated(t)
	makeDead(t, pool, "demo", 2)
	env := demoEnv("DATABASE_URL="+url, "CRDBWORK_ALL=true", "CRDBWORK_SET=9", "CRDBWORK_YES=true", "CRDBWORK_CREATE=true",
		"DEMO_DROP_SCHEMA=true")
	wantExit(t, op(t, time.Minute, env, "requeue"), 2, "or --all")
	wantExit(t, op(t, time.Minute, env, "requeue", "--tenant", ""), 2, "or --all")
	wantExit(t, op(t, time.Minute, env, "pause", "--queue", "never-made"), 2, `unknown queue "never-made"`)
	wantExit(t, op(t, time.Minute, env, "requeue", "--all"), 2, "--yes")
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != 2 {
		t.Errorf("CRDBWORK_ALL or CRDBWORK_YES requeued a dead item")
	}
	var p struct {
		Parts int `json:"parts"`
	}
	jsonOut(t, op(t, time.Minute, env, "parts", "--json"), &p)
	if p.Parts == 9 {
		t.Errorf("CRDBWORK_SET changed the parts")
	}
	if r := demo(t, time.Minute, env, "cleanup", "--queue", "other"); r.code != 0 {
		t.Fatalf("cleanup: %d %s", r.code, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'crdbwork_items'`); n != 1 {
		t.Errorf("DEMO_DROP_SCHEMA dropped the crdbwork tables")
	}
}
