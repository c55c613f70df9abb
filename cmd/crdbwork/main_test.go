package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// bin is the crdbwork binary built by TestMain.
var bin string

func TestMain(m *testing.M) {
	bins, err := testdb.Build("crdbwork", map[string]string{".": "crdbwork"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = bins["."]
	testdb.Main(m)
}

// env is this process's environment without the variables crdbwork reads,
// plus extra.
func env(extra ...string) []string {
	return testdb.Environ([]string{"DATABASE_URL=", "CRDBWORK_"}, extra...)
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// run runs the binary with args in environment e (nil: env()).
func run(t *testing.T, e []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = e
	if cmd.Env == nil {
		cmd.Env = env()
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("crdbwork %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("crdbwork %s: did not finish\n%s", strings.Join(args, " "), r)
	}
	return r
}

// must runs args and fails the test unless it exits 0.
func must(t *testing.T, e []string, args ...string) result {
	t.Helper()
	r := run(t, e, args...)
	if r.code != 0 {
		t.Fatalf("crdbwork %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// want runs args and fails the test unless it exits code with stderr
// holding every one of texts.
func want(t *testing.T, e []string, code int, texts []string, args ...string) result {
	t.Helper()
	r := run(t, e, args...)
	if r.code != code {
		t.Errorf("crdbwork %s: exit status %d, want %d\n%s", strings.Join(args, " "), r.code, code, r)
	}
	for _, s := range texts {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("crdbwork %s: stderr does not say %q\n%s", strings.Join(args, " "), s, r)
		}
	}
	return r
}

// jsonOf decodes stdout's last line.
func jsonOf(t *testing.T, r result) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r)
	}
	return m
}

// db is a fresh database with the schema (a copy of the schema's template,
// internal/testschema; with other table names, applied by crdbwork migrate:
// TestMigrate checks the command on the default ones) and its URL's
// environment.
type db struct {
	url  string
	pool *pgxpool.Pool
	env  []string
}

func newDB(t *testing.T, tables crsql.Tables) *db {
	t.Helper()
	if tables == (crsql.Tables{}) {
		url := testschema.NewURL(t)
		d := &db{url: url, env: env("DATABASE_URL=" + url)}
		d.open(t)
		return d
	}
	url := testdb.NewURL(t)
	d := &db{url: url, env: env("DATABASE_URL=" + url)}
	args := []string{"migrate"}
	if tables.Schema != "" {
		args = append(args, "--schema", tables.Schema)
	}
	if tables.Prefix != "" {
		args = append(args, "--prefix", tables.Prefix)
	}
	must(t, d.env, args...)
	d.open(t)
	return d
}

// open opens d's pool, closed when the test ends.
func (d *db) open(t *testing.T) {
	t.Helper()
	url := d.url
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	d.pool = pool
}

func (d *db) queue(t *testing.T, name string, tables crsql.Tables) *claim.Queue {
	t.Helper()
	q, err := claim.New(d.pool, claim.Options{Queue: name, Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// enqueue puts n items (tenant t1 for the even ones) into queue.
func (d *db) enqueue(t *testing.T, queue string, n int) []uuid.UUID {
	t.Helper()
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
		if i%2 == 0 {
			items[i].Tenant = "t1"
		}
	}
	enq, err := d.queue(t, queue, crsql.Tables{}).Enqueue(context.Background(), items...)
	if err != nil {
		t.Fatal(err)
	}
	return enq.IDs
}

// kill inserts n deaths of queue: tenant a for the even ones, reason
// permanent for every third, "disk full" in every fourth's error.
func (d *db) kill(t *testing.T, queue string, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		var tenant *string
		if i%2 == 0 {
			a := "a"
			tenant = &a
		}
		reason, msg := "failed", fmt.Sprintf("attempt %d timed out", i)
		if i%3 == 0 {
			reason = "permanent"
		}
		if i%4 == 0 {
			msg = "disk full"
		}
		if _, err := d.pool.Exec(context.Background(), `INSERT INTO crdbwork_dead_items
			(id, queue, part, priority, attempts, max_attempts, payload, last_error, enqueued_at, died_at, tenant, reason)
			VALUES ($1, $2, 0, 0, 3, 3, '\x00'::BYTEA, $3, now(), now() - $4 * INTERVAL '1 second', $5, $6)`,
			ids[i], queue, msg, i, tenant, reason); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func (d *db) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := d.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// snapshot counts every crdbwork row of queue, to check that a command left
// it alone.
func (d *db) snapshot(t *testing.T, queue string) string {
	t.Helper()
	var b strings.Builder
	for _, tb := range []string{"items", "dead_items", "ended", "session_parts", "tenant_limits"} {
		fmt.Fprintf(&b, "%s=%d ", tb, d.count(t, `SELECT count(*) FROM crdbwork_`+tb+` WHERE queue = $1`, queue))
	}
	var row string
	err := d.pool.QueryRow(context.Background(), `SELECT concat_ws(',', num_parts, paused, fair, max_in_flight, rate_limit)
		FROM crdbwork_queues WHERE name = $1`, queue).Scan(&row)
	if err != nil {
		row = "none"
	}
	b.WriteString("queue=" + row)
	return b.String()
}

func TestHelpVersionAndBadInput(t *testing.T) {
	t.Parallel()
	r := must(t, nil, "-h")
	for _, s := range []string{"migrate", "status", "dead", "requeue", "cancel", "pause", "resume", "parts", "limit", "fair", "purge", "version",
		"Exit status", "0  success", "1  the operation failed", "2  bad input", "CRDBWORK_DATABASE_URL", "--yes"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("crdbwork -h does not mention %q:\n%s", s, r.stdout)
		}
	}
	if r := run(t, nil); r.code != 2 || !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("crdbwork without a command: %s", r)
	}
	want(t, nil, 2, []string{`unknown command "stauts"`, `did you mean "status"?`}, "stauts")
	for _, c := range commands {
		r := must(t, nil, c.name, "-h")
		if !strings.Contains(r.stdout, "Usage: crdbwork "+c.name) {
			t.Errorf("crdbwork %s -h:\n%s", c.name, r.stdout)
		}
		if c.name != "version" && (!strings.Contains(r.stdout, "--schema") || !strings.Contains(r.stdout, "CRDBWORK_PREFIX") ||
			!strings.Contains(r.stdout, "CRDBWORK_DATABASE_URL or DATABASE_URL")) {
			t.Errorf("crdbwork %s -h does not show the global flags and their variables:\n%s", c.name, r.stdout)
		}
	}
	r = must(t, nil, "version")
	if !strings.HasPrefix(r.stdout, "crdbwork 0.") {
		t.Errorf("version: %q", r.stdout)
	}
	if v := jsonOf(t, must(t, nil, "version", "--json")); v["schema_version"] != float64(crsql.Version) {
		t.Errorf("version --json: %v", v)
	}
	// Bad input, before any database is reached.
	for _, c := range []struct {
		args []string
		text string
	}{
		{[]string{"status"}, "no database given: pass --database-url or set CRDBWORK_DATABASE_URL or DATABASE_URL"},
		{[]string{"dead", "--limit", "0", "--database-url", "postgres://x/y"}, "--limit"},
		{[]string{"status", "--interval", "-1s"}, "must not be negative"},
		{[]string{"limit", "--rate", "fast"}, "not a number"},
		{[]string{"requeue", "not-a-uuid"}, "is not an item id"},
		{[]string{"requeue", "--all", "--reason", "bored"}, "--reason"},
		{[]string{"cancel"}, "give the ids"},
		{[]string{"purge", "--yes", "--dry-run"}, "exclude each other"},
		{[]string{"fair", "maybe"}, "say on or off"},
		{[]string{"pause", "--queue", "q"}, "no database given"},
		{[]string{"pause", "--frobnicate"}, "unknown flag --frobnicate"},
	} {
		want(t, nil, 2, []string{c.text}, c.args...)
	}
	// A variable with a bad value names itself.
	want(t, env("CRDBWORK_INTERVAL=soon"), 2, []string{"CRDBWORK_INTERVAL"}, "status")
	// An unreachable database is exit 2.
	want(t, nil, 2, []string{"cannot reach the database"}, "status", "--database-url", "postgres://nobody@127.0.0.1:1/x?sslmode=disable")
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	e := env("CRDBWORK_DATABASE_URL=" + url)
	r := must(t, e, "migrate", "--dry-run")
	if !strings.Contains(r.stdout, "create the schema") {
		t.Errorf("migrate --dry-run on an empty database:\n%s", r)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("after migrate --dry-run: %v, want no schema", err)
	}
	// Commands that need the schema say how to get it.
	want(t, e, 2, []string{"crdbwork migrate"}, "status")
	m := jsonOf(t, must(t, e, "migrate", "--json"))
	if m["migrated"] != true || m["previous_version"] != float64(0) || m["schema_version"] != float64(crsql.Version) {
		t.Errorf("migrate --json: %v", m)
	}
	if err := crsql.Check(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatalf("after migrate: %v", err)
	}
	var demo *string
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass('demo_results')::TEXT`).Scan(&demo); err != nil || demo != nil {
		t.Errorf("migrate created the demo's table demo_results (%v, %v)", demo, err)
	}
	if r := must(t, e, "migrate"); !strings.Contains(r.stdout, fmt.Sprintf("is at version %d", crsql.Version)) {
		t.Errorf("migrate again:\n%s", r)
	}
	if r := must(t, e, "migrate", "--dry-run"); !strings.Contains(r.stdout, "nothing") {
		t.Errorf("migrate --dry-run at the current version:\n%s", r)
	}
}

func TestStatusQueuesAndUnknownQueue(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	// An empty database: no queues, and the live sessions all the same.
	sess, err := session.Start(context.Background(), d.pool, session.Options{Name: "lonely"})
	if err != nil {
		t.Fatal(err)
	}
	if r := must(t, d.env, "status"); !strings.Contains(r.stdout, "no queues") || !strings.Contains(r.stdout, "1 live session") ||
		!strings.Contains(r.stdout, "lonely") {
		t.Errorf("status of an empty database:\n%s", r)
	}
	empty := jsonOf(t, must(t, d.env, "status", "--json"))
	if ss, _ := empty["sessions"].([]any); len(ss) != 1 || ss[0].(map[string]any)["name"] != "lonely" {
		t.Errorf("status --json of an empty database: %v", empty)
	}
	if err := sess.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.enqueue(t, "emails", 7)
	d.enqueue(t, "reports", 3)
	d.kill(t, "reports", 2)
	all := jsonOf(t, must(t, d.env, "status", "--json"))
	queues, _ := all["queues"].([]any)
	if len(queues) != 2 {
		t.Fatalf("status --json lists %d queues, want 2: %v", len(queues), all)
	}
	got := map[string]map[string]any{}
	for _, q := range queues {
		m := q.(map[string]any)
		got[m["queue"].(string)] = m
	}
	if got["emails"]["dead"] != float64(0) || got["reports"]["dead"] != float64(2) {
		t.Errorf("dead counts: %v, %v", got["emails"]["dead"], got["reports"]["dead"])
	}
	one := jsonOf(t, must(t, d.env, "status", "--queue", "emails", "--json"))
	var unclaimed float64
	for _, b := range one["backlog"].([]any) {
		unclaimed += b.(map[string]any)["unclaimed"].(float64)
	}
	tenants, _ := one["tenants"].([]any)
	if one["queue"] != "emails" || unclaimed != 7 || len(tenants) != 1 || tenants[0].(map[string]any)["unclaimed"] != float64(4) {
		t.Errorf("status --queue emails --json: backlog %v, tenants %v\n%v", unclaimed, tenants, one)
	}
	if _, ok := one["settings"].(map[string]any); !ok {
		t.Errorf("status --json has no settings: %v", one)
	}
	r := must(t, d.env, "status", "--queue", "emails")
	if !strings.Contains(r.stdout, `queue "emails"`) || !strings.Contains(r.stdout, "7 unclaimed") {
		t.Errorf("status --queue emails:\n%s", r.stdout)
	}
	// The queue from the environment.
	if m := jsonOf(t, must(t, append(d.env, "CRDBWORK_QUEUE=reports"), "status", "--json")); m["queue"] != "reports" {
		t.Errorf("status with CRDBWORK_QUEUE=reports: %v", m["queue"])
	}
	checkWatch(t, d)
	// A mistyped queue is refused by every command but migrate, with the
	// close name suggested, and changes nothing.
	before := d.snapshot(t, "emials") + d.snapshot(t, "emails")
	for _, args := range [][]string{
		{"status"}, {"dead"}, {"requeue", "--all", "--yes"}, {"cancel", uuid.NewString(), "--yes"}, {"pause"}, {"resume"},
		{"parts"}, {"limit", "--max-in-flight", "3"}, {"fair", "on"}, {"purge", "--yes"},
	} {
		want(t, d.env, 2, []string{`unknown queue "emials"`, `did you mean "emails"?`}, append(args, "--queue", "emials")...)
	}
	if after := d.snapshot(t, "emials") + d.snapshot(t, "emails"); after != before {
		t.Errorf("commands on an unknown queue changed rows: %s, was %s", after, before)
	}
	want(t, d.env, 2, []string{`unknown queue "zzzzzz"`, "queues: emails, reports"}, "pause", "--queue", "zzzzzz")
	// A command without --queue that needs one.
	want(t, d.env, 2, []string{"no queue given"}, "pause")
}

func TestDeadAndRequeue(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	d.kill(t, "emails", 10)
	d.kill(t, "reports", 4)
	reports := d.snapshot(t, "reports")
	// Pages of 3 through the 10 deaths, in order, no gaps, no repeats.
	var seen []string
	after := ""
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("more than 10 pages")
		}
		args := []string{"dead", "--queue", "emails", "--limit", "3", "--json"}
		if after != "" {
			args = append(args, "--after", after)
		}
		m := jsonOf(t, must(t, d.env, args...))
		if m["total"] != float64(10) {
			t.Errorf("total %v, want 10", m["total"])
		}
		for _, it := range m["items"].([]any) {
			seen = append(seen, it.(map[string]any)["id"].(string))
		}
		after, _ = m["next"].(string)
		if after == "" {
			break
		}
	}
	uniq := map[string]bool{}
	for _, id := range seen {
		uniq[id] = true
	}
	if len(seen) != 10 || len(uniq) != 10 {
		t.Errorf("paged through %d dead items (%d distinct), want 10", len(seen), len(uniq))
	}
	// The text output ends a page with the next cursor.
	if r := must(t, d.env, "dead", "--queue", "emails", "--limit", "3"); !strings.Contains(r.stdout, "more: --after ") {
		t.Errorf("dead --limit 3 does not print the next cursor:\n%s", r.stdout)
	}
	want(t, d.env, 2, []string{"is not a cursor"}, "dead", "--queue", "emails", "--after", "garbage")
	// Filters and counts.
	for _, c := range []struct {
		args []string
		n    string
	}{
		{nil, "10"},
		{[]string{"--tenant", "a"}, "5"},
		{[]string{"--reason", "permanent"}, "4"},
		{[]string{"--error", "disk full"}, "3"},
		{[]string{"--tenant", "a", "--reason", "permanent"}, "2"},
	} {
		r := must(t, d.env, append([]string{"dead", "--queue", "emails", "--count"}, c.args...)...)
		if strings.TrimSpace(r.stdout) != c.n {
			t.Errorf("dead --count %v = %q, want %s", c.args, r.stdout, c.n)
		}
	}

	// More than one item needs --yes; without it nothing moves.
	before := d.snapshot(t, "emails")
	want(t, d.env, 2, []string{"would requeue the 5 dead items", "--yes"}, "requeue", "--queue", "emails", "--tenant", "a")
	want(t, d.env, 2, []string{"would requeue all 10 dead items"}, "requeue", "--queue", "emails", "--all")
	if r := must(t, d.env, "requeue", "--queue", "emails", "--all", "--dry-run"); !strings.Contains(r.stdout, "would requeue all 10") {
		t.Errorf("requeue --all --dry-run:\n%s", r)
	}
	if after := d.snapshot(t, "emails"); after != before {
		t.Fatalf("a refused or dry requeue changed rows: %s, was %s", after, before)
	}
	m := jsonOf(t, must(t, d.env, "requeue", "--queue", "emails", "--tenant", "a", "--yes", "--json"))
	if m["requeued"] != float64(5) {
		t.Errorf("requeue --tenant a --yes: %v", m)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails' AND tenant = 'a'`); n != 5 {
		t.Errorf("%d items of tenant a in emails after the requeue, want 5", n)
	}
	// One id needs no --yes.
	var id string
	if err := d.pool.QueryRow(context.Background(), `SELECT id::TEXT FROM crdbwork_dead_items WHERE queue = 'emails' LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if r := must(t, d.env, "requeue", "--queue", "emails", id); !strings.Contains(r.stdout, "requeued item "+id) {
		t.Errorf("requeue ID:\n%s", r)
	}
	want(t, d.env, 1, []string{"is not a dead item"}, "requeue", "--queue", "emails", id)
	m = jsonOf(t, must(t, d.env, "requeue", "--queue", "emails", "--all", "--yes", "--json"))
	if m["requeued"] != float64(4) {
		t.Errorf("requeue --all --yes: %v", m)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'emails'`); n != 0 {
		t.Errorf("%d dead items left in emails", n)
	}
	if after := d.snapshot(t, "reports"); after != reports {
		t.Errorf("commands on emails changed reports: %s, was %s", after, reports)
	}
}

func TestCancelPauseFairLimitParts(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ids := d.enqueue(t, "emails", 5)
	d.enqueue(t, "reports", 2)
	reports := d.snapshot(t, "reports")
	emails := d.snapshot(t, "emails")

	// cancel: refused without --yes, shown with --dry-run.
	want(t, d.env, 2, []string{"would cancel 2 items", "--yes"}, "cancel", "--queue", "emails", ids[0].String(), ids[1].String())
	if r := must(t, d.env, "cancel", "--queue", "emails", "--dry-run", ids[0].String()); !strings.Contains(r.stdout, "would cancel 1 item ") {
		t.Errorf("cancel --dry-run:\n%s", r)
	}
	// parts --set: refused without --yes.
	want(t, d.env, 2, []string{"would change the parts of queue \"emails\" from 1 to 4"}, "parts", "--queue", "emails", "--set", "4")
	if r := must(t, d.env, "parts", "--queue", "emails", "--set", "4", "--dry-run"); !strings.Contains(r.stdout, "from 1 to 4") {
		t.Errorf("parts --set --dry-run:\n%s", r)
	}
	if after := d.snapshot(t, "emails"); after != emails {
		t.Fatalf("refused or dry commands changed emails: %s, was %s", after, emails)
	}
	m := jsonOf(t, must(t, d.env, "cancel", "--queue", "emails", "--yes", "--json", ids[0].String(), ids[1].String()))
	if c, _ := m["cancelled"].([]any); len(c) != 2 {
		t.Errorf("cancel --yes --json: %v", m)
	}
	want(t, d.env, 1, []string{"has no item " + ids[0].String()}, "cancel", "--queue", "emails", "--yes", ids[0].String())
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails'`); n != 3 {
		t.Errorf("%d items in emails after cancelling 2 of 5", n)
	}
	m = jsonOf(t, must(t, d.env, "parts", "--queue", "emails", "--set", "4", "--yes", "--json"))
	if m["parts"] != float64(4) || m["previous"] != float64(1) {
		t.Errorf("parts --set 4 --yes: %v", m)
	}

	// pause and resume.
	if m := jsonOf(t, must(t, d.env, "pause", "--queue", "emails", "--json")); m["paused"] != true || m["was_paused"] != false {
		t.Errorf("pause: %v", m)
	}
	if p, err := readPaused(d.queue(t, "emails", crsql.Tables{}).Settings(context.Background())); err != nil || !p {
		t.Errorf("after pause: paused %v, %v", p, err)
	}
	if r := must(t, d.env, "pause", "--queue", "emails"); !strings.Contains(r.stdout, "already paused") {
		t.Errorf("pause again:\n%s", r)
	}
	must(t, d.env, "resume", "--queue", "emails")
	if p, _ := readPaused(d.queue(t, "emails", crsql.Tables{}).Settings(context.Background())); p {
		t.Error("still paused after resume")
	}

	// fair.
	if m := jsonOf(t, must(t, d.env, "fair", "--queue", "emails", "on", "--json")); m["fair"] != true {
		t.Errorf("fair on: %v", m)
	}
	if r := must(t, d.env, "fair", "--queue", "emails"); !strings.Contains(r.stdout, "is fair") {
		t.Errorf("fair:\n%s", r)
	}
	must(t, d.env, "fair", "--queue", "emails", "off")

	// limit, with the flags of the old demo limit.
	m = jsonOf(t, must(t, d.env, "limit", "--queue", "emails", "--max-in-flight", "8", "--rate", "2.5", "--json"))
	if m["max_in_flight"] != float64(8) || m["rate"] != 2.5 {
		t.Errorf("limit: %v", m)
	}
	must(t, d.env, "limit", "--queue", "emails", "--each-tenant", "--max-in-flight", "2")
	must(t, d.env, "limit", "--queue", "emails", "--tenant", "t1", "--rate", "1")
	s, err := d.queue(t, "emails", crsql.Tables{}).Settings(context.Background())
	if err != nil || s.MaxInFlight != 8 || s.Rate != 2.5 || s.TenantMaxInFlight != 2 {
		t.Errorf("settings after limit: %+v, %v", s, err)
	}
	tl, err := readTenantLimits(d.queue(t, "emails", crsql.Tables{}).Settings(context.Background()))
	if err != nil || tl["t1"].Rate != 1 {
		t.Errorf("tenant limits: %v, %v", tl, err)
	}
	if r := must(t, d.env, "limit", "--queue", "emails"); !strings.Contains(r.stdout, `tenant "t1": at most 1/s`) {
		t.Errorf("limit (show):\n%s", r.stdout)
	}
	must(t, d.env, "limit", "--queue", "emails", "--tenant", "t1", "--remove")
	if tl, _ := readTenantLimits(d.queue(t, "emails", crsql.Tables{}).Settings(context.Background())); len(tl) != 0 {
		t.Errorf("tenant limits after --remove: %v", tl)
	}
	want(t, d.env, 2, []string{"--remove needs --tenant"}, "limit", "--queue", "emails", "--remove")

	// A new queue is set up before its first item with --create (and is
	// refused without it).
	want(t, d.env, 2, []string{`unknown queue "fresh"`}, "parts", "--queue", "fresh", "--set", "8", "--yes")
	must(t, d.env, "parts", "--queue", "fresh", "--set", "8", "--yes", "--create")
	must(t, d.env, "fair", "on", "--queue", "fresh", "--create")
	must(t, d.env, "limit", "--queue", "fresh2", "--max-in-flight", "3", "--create")
	must(t, d.env, "pause", "--queue", "fresh3", "--create")
	if got := d.snapshot(t, "fresh") + " " + d.snapshot(t, "fresh2") + " " + d.snapshot(t, "fresh3"); !strings.Contains(got, "queue=8,f,t,0,0") ||
		!strings.Contains(got, "queue=1,f,f,3,0") || !strings.Contains(got, "queue=1,t,f,0,0") {
		t.Errorf("queues set up with --create: %s", got)
	}
	want(t, d.env, 2, []string{"unknown flag --create"}, "resume", "--queue", "fresh9", "--create")
	want(t, d.env, 2, []string{"exclude each other"}, "limit", "--queue", "emails", "--tenant", "x", "--each-tenant", "--rate", "1")
	if after := d.snapshot(t, "reports"); after != reports {
		t.Errorf("commands on emails changed reports: %s, was %s", after, reports)
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	d.enqueue(t, "emails", 2500)
	d.kill(t, "emails", 3)
	d.enqueue(t, "reports", 4)
	d.kill(t, "reports", 1)
	q := d.queue(t, "emails", crsql.Tables{})
	if err := q.UpdateSettings(context.Background(), claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"t1": &claim.Limit{MaxInFlight: 1}}}); err != nil {
		t.Fatal(err)
	}
	reports := d.snapshot(t, "reports")
	emails := d.snapshot(t, "emails")
	want(t, d.env, 2, []string{"would delete from queue \"emails\": 2500 items, 3 dead items", "1 tenant limit", "--yes"}, "purge", "--queue", "emails")
	m := jsonOf(t, must(t, d.env, "purge", "--queue", "emails", "--dry-run", "--json"))
	if w, _ := m["would_delete"].(map[string]any); w["items"] != float64(2500) || w["dead_items"] != float64(3) {
		t.Errorf("purge --dry-run --json: %v", m)
	}
	if after := d.snapshot(t, "emails"); after != emails {
		t.Fatalf("a refused or dry purge changed emails: %s, was %s", after, emails)
	}
	m = jsonOf(t, must(t, d.env, "purge", "--queue", "emails", "--yes", "--json"))
	if del, _ := m["deleted"].(map[string]any); del["items"] != float64(2500) || del["dead_items"] != float64(3) || del["tenant_limits"] != float64(1) {
		t.Errorf("purge --yes --json: %v", m)
	}
	if after := d.snapshot(t, "emails"); after != "items=0 dead_items=0 ended=0 session_parts=0 tenant_limits=0 queue=none" {
		t.Errorf("after the purge, emails has %s", after)
	}
	if after := d.snapshot(t, "reports"); after != reports {
		t.Errorf("the purge of emails changed reports: %s, was %s", after, reports)
	}
	// The purged queue is gone: unknown now.
	want(t, d.env, 2, []string{`unknown queue "emails"`}, "status", "--queue", "emails")
}

// --schema and --prefix (and their variables) reach tables other than the
// defaults, and the default tables are not touched.
func TestSchemaAndPrefix(t *testing.T) {
	t.Parallel()
	tables := crsql.Tables{Schema: "ops", Prefix: "w_"}
	d := newDB(t, tables)
	if err := crsql.Check(context.Background(), d.pool, tables); err != nil {
		t.Fatalf("migrate --schema ops --prefix w_: %v", err)
	}
	if _, err := d.queue(t, "jobs", tables).Enqueue(context.Background(), claim.NewItem{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--schema", "ops", "--prefix", "w_"}
	m := jsonOf(t, must(t, d.env, append([]string{"status", "--queue", "jobs", "--json"}, flags...)...))
	if m["queue"] != "jobs" || len(m["backlog"].([]any)) != 1 {
		t.Errorf("status in ops.w_: %v", m)
	}
	e := append(append([]string{}, d.env...), "CRDBWORK_SCHEMA=ops", "CRDBWORK_PREFIX=w_")
	must(t, e, "pause", "--queue", "jobs")
	if p, err := readPaused(d.queue(t, "jobs", tables).Settings(context.Background())); err != nil || !p {
		t.Errorf("pause through CRDBWORK_SCHEMA and CRDBWORK_PREFIX: paused %v, %v", p, err)
	}
	// The default tables do not exist here.
	want(t, d.env, 2, []string{"crdbwork migrate"}, "status", "--queue", "jobs")
	want(t, d.env, 2, []string{"--schema or --prefix", "too long"}, "status", "--prefix", strings.Repeat("p", 60))
}

// checkWatch runs status --watch until it has printed two snapshots, then
// interrupts it: it exits 0.
func checkWatch(t *testing.T, d *db) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "status", "--watch", "--interval", "100ms")
	cmd.Env = d.env
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	snapshots, queues := 0, 0
	for snapshots < 3 && sc.Scan() {
		switch l := sc.Text(); {
		case strings.HasPrefix(l, "--- "):
			snapshots++
		case strings.HasPrefix(l, "emails ") || strings.HasPrefix(l, "reports "):
			queues++
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, out)
	err = cmd.Wait()
	if snapshots < 3 || queues < 4 || err != nil {
		t.Errorf("status --watch: %d snapshots with %d queue lines, then %v\n%s", snapshots, queues, err, stderr.String())
	}
}

// crdbwork deps shows what an item waits for and what waits for it, and
// status counts the waiting items.
func TestDepsCommand(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q, err := claim.New(d.pool, claim.Options{Queue: "pipeline"})
	if err != nil {
		t.Fatal(err)
	}
	root, dep := uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: root, Payload: []byte("r")}, claim.NewItem{ID: dep, Payload: []byte("d"), After: []uuid.UUID{root}}); err != nil {
		t.Fatal(err)
	}
	j := jsonOf(t, must(t, d.env, "deps", "--queue", "pipeline", "--json", dep.String()))
	prereqs, _ := j["prereqs"].([]any)
	if j["waiting"] != true || j["remaining"] != float64(1) || len(prereqs) != 1 ||
		prereqs[0].(map[string]any)["id"] != root.String() || prereqs[0].(map[string]any)["state"] != "queued" {
		t.Errorf("deps --json of the dependent: %v", j)
	}
	if ra, _ := j["run_after"].([]any); len(ra) != 0 {
		t.Errorf("deps --json of a dependent without RunAfter: run_after %v", ra)
	}
	// A dependent that runs anyway after a death or a cancel says so.
	anyway := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: anyway, Payload: []byte("a"), After: []uuid.UUID{root}, RunAfter: claim.PrereqDied | claim.PrereqCancelled}); err != nil {
		t.Fatal(err)
	}
	ja := jsonOf(t, must(t, d.env, "deps", "--queue", "pipeline", "--json", anyway.String()))
	if ra, _ := ja["run_after"].([]any); len(ra) != 2 || ra[0] != "died" || ra[1] != "cancelled" {
		t.Errorf("deps --json of a RunAfter dependent: run_after %v", ja["run_after"])
	}
	if r := must(t, d.env, "deps", "--queue", "pipeline", anyway.String()); !strings.Contains(r.stdout, "runs anyway after a prerequisite that died or was cancelled") {
		t.Errorf("deps of a RunAfter dependent:\n%s", r)
	}
	must(t, d.env, "cancel", "--queue", "pipeline", "--yes", anyway.String())
	r := must(t, d.env, "deps", "--queue", "pipeline", root.String())
	if !strings.Contains(r.stdout, "is not waiting") || !strings.Contains(r.stdout, "1 item waits for it") || !strings.Contains(r.stdout, dep.String()) {
		t.Errorf("deps of the root:\n%s", r)
	}
	s := jsonOf(t, must(t, d.env, "status", "--queue", "pipeline", "--json"))
	if s["waiting"] != float64(1) {
		t.Errorf("status --json: waiting = %v, want 1", s["waiting"])
	}
	if r := must(t, d.env, "status", "--queue", "pipeline"); !strings.Contains(r.stdout, "waiting: 1 item waits") {
		t.Errorf("status does not count the waiting item:\n%s", r)
	}
	// A waiting item is cancelled like any other.
	must(t, d.env, "cancel", "--queue", "pipeline", "--yes", dep.String())
	if n, err := waitingOf(q.Inspect(ctx)); err != nil || n != 0 {
		t.Errorf("after crdbwork cancel of the waiting item: %d waiting, %v", n, err)
	}
	// A cancelled prerequisite ends its dependents, visible in crdbwork dead.
	dep2 := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: dep2, Payload: []byte("d2"), After: []uuid.UUID{root}}); err != nil {
		t.Fatal(err)
	}
	must(t, d.env, "cancel", "--queue", "pipeline", "--yes", root.String())
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.DependencyDead != 1 {
		t.Fatalf("Reap: %+v, %v", st, err)
	}
	if r := must(t, d.env, "dead", "--queue", "pipeline"); !strings.Contains(r.stdout, dep2.String()) || !strings.Contains(r.stdout, "dependency died: "+root.String()) {
		t.Errorf("crdbwork dead does not show the dependent's death:\n%s", r)
	}
	want(t, d.env, 2, []string{"not an item id"}, "deps", "--queue", "pipeline", "nope")
	want(t, d.env, 2, []string{"give the id"}, "deps", "--queue", "pipeline")
}
