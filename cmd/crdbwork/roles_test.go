package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/names"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// rolesSQL reads the grants of docs/operations.md ("Roles and grants"),
// with each role's name given a suffix (roles are the server's, shared by
// the tests' databases).
func rolesSQL(t *testing.T, suffix string) []string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Roles and grants.*?```sql\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal(`docs/operations.md has no sql block under "Roles and grants"`)
	}
	text := regexp.MustCompile(`(?m)^--.*$`).ReplaceAllString(string(m[1]), "")
	text = regexp.MustCompile(`\bcrdbwork_(worker|operator|reader)\b`).ReplaceAllString(text, "crdbwork_${1}_"+suffix)
	var stmts []string
	for _, s := range strings.Split(text, ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

// asRole returns the URL of d's database for role.
func asRole(t *testing.T, d *db, role string) string {
	t.Helper()
	u, err := url.Parse(d.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// The grants of docs/operations.md, created in the test's database: every
// command runs as each role. The reader's read commands work and its
// changes are refused in one line naming the table and the privileges, exit
// 2 (before: the server's raw error, exit 1); the operator's all work and
// are audited; a worker role works items and runs the commands, which warn
// that the audit list did not record them. migrate on an up-to-date schema
// writes nothing, so every role may run it.
func TestRolesRunEveryCommand(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	if testdb.Kind(t) != "postgres" {
		// CockroachDB: the same grants, but a LOGIN role needs a
		// certificate or a password, which the test server does not set up.
		t.Skip("the roles log in through the PostgreSQL test server's trust authentication")
	}
	ctx := context.Background()
	reader, operator, wrk := createRoles(t, d)

	// The worker role works a queue: enqueue, claim, ack, a permanent death.
	wpool, err := pgxpool.New(ctx, asRole(t, d, wrk))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wpool.Close)
	q, err := claim.New(wpool, claim.Options{Queue: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("ok")}, claim.NewItem{Payload: []byte("bad")}, claim.NewItem{Payload: []byte("ok 2")})
	if err != nil {
		t.Fatalf("enqueue as the worker role: %v", err)
	}
	hb := await.Stretch(300 * time.Millisecond)
	w, err := worker.New(q, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "bad" {
			return nil, claim.Permanent(errors.New("bad"))
		}
		return nil, nil
	}, worker.Options{Concurrency: 2, Poll: 50 * time.Millisecond, Session: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Until(t, "the worker role to work the three items", func() (bool, string) {
		items, dead := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails'`), d.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'emails'`)
		return items == 0 && dead == 1, fmt.Sprintf("%d items, %d dead", items, dead)
	})
	stop()
	if err := await.Recv(t, "the worker to stop", done); err != nil {
		t.Fatalf("the worker role's worker: %v", err)
	}
	dead := res.IDs[1]
	queued := d.enqueue(t, "emails", 3)

	reads := [][]string{
		{"migrate"}, {"status"}, {"status", "--queue", "emails"}, {"dead", "--queue", "emails"}, {"cancelled", "--queue", "emails"},
		{"deps", "--queue", "emails", queued[0].String()}, {"item", dead.String()}, {"audit"}, {"parts", "--queue", "emails"},
		{"limit", "--queue", "emails"}, {"fair", "--queue", "emails"}, {"retention", "--queue", "emails"}, {"sequence", "--queue", "emails"},
		{"requeue", "--queue", "emails", "--all", "--dry-run"}, {"purge", "--queue", "emails", "--dry-run"},
	}
	// Each change, and the table the reader is refused on.
	changes := []struct {
		args  []string
		table string
	}{
		{[]string{"pause", "--queue", "emails"}, "crdbwork_queues"},
		{[]string{"resume", "--queue", "emails"}, "crdbwork_queues"},
		{[]string{"limit", "--queue", "emails", "--max-in-flight", "5"}, "crdbwork_queues"},
		{[]string{"fair", "--queue", "emails", "on"}, "crdbwork_queues"},
		{[]string{"retention", "--queue", "emails", "--dead-max-count", "1000", "--yes"}, "crdbwork_queues"},
		{[]string{"sequence", "--queue", "emails", "off"}, "crdbwork_queues"},
		{[]string{"parts", "--queue", "emails", "--set", "2", "--yes"}, "crdbwork_queues"},
		{[]string{"cancel", "--queue", "emails", "--yes", queued[0].String()}, "crdbwork_"},
		{[]string{"requeue", "--queue", "emails", dead.String()}, "crdbwork_"},
		{[]string{"purge", "--queue", "emails", "--yes"}, "crdbwork_"},
	}
	run := func(role string, args []string) result {
		t.Helper()
		return run(t, env("DATABASE_URL="+asRole(t, d, role)), args...)
	}
	for _, role := range []string{reader, wrk, operator} {
		for _, args := range reads {
			if r := run(role, args); r.code != 0 || strings.Contains(r.stderr, "warning") {
				t.Errorf("as %s: crdbwork %s: %s", role, strings.Join(args, " "), r)
			}
		}
	}
	if r := run(reader, []string{"migrate"}); !strings.Contains(r.stdout, "nothing to do") {
		t.Errorf("migrate as the reader on an up-to-date schema:\n%s", r)
	}
	deny := regexp.MustCompile(`^crdbwork: permission denied for table (crdbwork_\w+): user "` + reader + `" lacks the (\w+)(, \w+)* privileges? on it \(SQLSTATE 42501\): grant it, or run the command as a role that has it \(docs/operations.md, "Roles and grants"\)\n$`)
	before := d.snapshot(t, "emails")
	for _, c := range changes {
		r := run(reader, c.args)
		m := deny.FindStringSubmatch(r.stderr)
		if r.code != 2 || m == nil || !strings.HasPrefix(m[1], c.table) || strings.Contains(m[0], "lacks the SELECT") {
			t.Errorf("as the reader: crdbwork %s: want exit 2 and one line naming %s… and the privileges it lacks:\n%s", strings.Join(c.args, " "), c.table, r)
		}
	}
	if after := d.snapshot(t, "emails"); after != before {
		t.Errorf("the reader's refused commands changed the queue: %s, then %s", before, after)
	}
	audited := d.count(t, `SELECT count(*) FROM crdbwork_audit`)
	for _, c := range changes[:len(changes)-1] {
		r := run(wrk, c.args)
		if r.code != 0 {
			t.Errorf("as the worker role: crdbwork %s: %s", strings.Join(c.args, " "), r)
		}
		if strings.Contains(r.stderr, "warning") && !strings.Contains(r.stderr, "not recorded in the audit list: permission denied for table crdbwork_audit: user \""+wrk+"\" lacks the INSERT") {
			t.Errorf("as the worker role: crdbwork %s: a warning that does not name the audit table and INSERT: %s", strings.Join(c.args, " "), r)
		}
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_audit`); n != audited {
		t.Errorf("the worker role's commands were audited: %d rows, then %d", audited, n)
	}
	must(t, d.env, "requeue", "--queue", "emails", "--all", "--yes") // dead again for the operator
	d.kill(t, "emails", 1)
	dead = uuid.MustParse(strings.Fields(regexp.MustCompile(`(?m)^[0-9a-f-]{36} `).FindString(must(t, d.env, "dead", "--queue", "emails").stdout))[0])
	queued = d.enqueue(t, "emails", 1)
	changes[7].args[len(changes[7].args)-1] = queued[0].String()
	changes[8].args[len(changes[8].args)-1] = dead.String()
	for _, c := range changes {
		if r := run(operator, c.args); r.code != 0 || strings.Contains(r.stderr, "warning") {
			t.Errorf("as the operator: crdbwork %s: %s", strings.Join(c.args, " "), r)
		}
	}
	for _, a := range []string{"pause", "resume", "parts", "cancel", "requeue", "purge"} {
		if n := d.count(t, `SELECT count(*) FROM crdbwork_audit WHERE action = $1`, a); n != 1 {
			t.Errorf("the operator's %s left %d audit rows, want 1", a, n)
		}
	}
}

// The worker role's grants of docs/operations.md ("Roles and grants") are
// store.WorkerGrants, the privileges every worker checks at start (plus
// SELECT on the audit list, which every role reads for the commands and the
// worker's own code does not): the block and the list cannot drift apart.
func TestWorkerGrantsMatchTheDocs(t *testing.T) {
	t.Parallel()
	grant := regexp.MustCompile(`(?s)^GRANT (.+?) ON (.+?) TO (.+)$`)
	doc := map[string]map[string]bool{} // table → privileges of the worker role
	for _, s := range rolesSQL(t, "x") {
		m := grant.FindStringSubmatch(s)
		if m == nil || !regexp.MustCompile(`\bcrdbwork_worker_x\b`).MatchString(m[3]) || strings.HasPrefix(m[2], "SCHEMA ") {
			continue
		}
		for _, table := range strings.Split(m[2], ",") {
			table = strings.TrimSpace(table)
			if doc[table] == nil {
				doc[table] = map[string]bool{}
			}
			for _, p := range strings.Split(m[1], ",") {
				doc[table][strings.TrimSpace(p)] = true
			}
		}
	}
	list := map[string]map[string]bool{"crdbwork_audit": {"SELECT": true}}
	for _, g := range store.WorkerGrants {
		if list[g.Table] == nil {
			list[g.Table] = map[string]bool{}
		}
		for _, p := range g.Privileges {
			list[g.Table][p] = true
		}
	}
	if len(doc) == 0 {
		t.Fatal("no GRANT to crdbwork_worker in docs/operations.md")
	}
	for table, ps := range doc {
		for p := range ps {
			if !list[table][p] {
				t.Errorf("docs/operations.md grants the worker role %s on %s, which store.WorkerGrants lacks", p, table)
			}
		}
	}
	for table, ps := range list {
		for p := range ps {
			if !doc[table][p] {
				t.Errorf("store.WorkerGrants has %s on %s, which docs/operations.md does not grant the worker role", p, table)
			}
		}
	}
	// Every table of the schema is in the list.
	for _, suffix := range names.Tables() {
		if list[names.DefaultPrefix+suffix] == nil {
			t.Errorf("store.WorkerGrants and the docs' worker grants do not name %s%s", names.DefaultPrefix, suffix)
		}
	}
}

// crdbwork grants, as each role of docs/operations.md: the worker role (and
// the tables' owner) has every privilege a worker needs, exit 0; the reader
// and the operator lack the worker's writes, exit 2 naming them; the worker
// role without INSERT on one table, exit 2 naming exactly that one.
func TestGrantsCommand(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	if testdb.Kind(t) != "postgres" {
		t.Skip("the roles log in through the PostgreSQL test server's trust authentication")
	}
	ctx := context.Background()
	reader, operator, wrk := createRoles(t, d)
	ok := "the database user has every privilege a worker needs on the crdbwork tables\n"
	if r := must(t, d.env, "grants"); r.stdout != ok {
		t.Errorf("crdbwork grants as the owner: %s", r)
	}
	if r := run(t, env("DATABASE_URL="+asRole(t, d, wrk)), "grants"); r.code != 0 || r.stdout != ok {
		t.Errorf("crdbwork grants as the worker role: %s", r)
	}
	r := run(t, env("DATABASE_URL="+asRole(t, d, reader)), "grants")
	if want := `crdbwork: the database user lacks privileges the worker needs: user "` + reader + `" lacks INSERT, UPDATE, DELETE on crdbwork_sessions, crdbwork_queues, `; r.code != 2 || !strings.HasPrefix(r.stderr, want) ||
		strings.Count(r.stderr, "\n") != 1 || strings.Contains(r.stderr, "SELECT") {
		t.Errorf("crdbwork grants as the reader: want exit 2 and one line starting %q, without SELECT:\n%s", want, r)
	}
	// The operator role writes items, not sessions: it is no worker role.
	r = run(t, env("DATABASE_URL="+asRole(t, d, operator)), "grants")
	if want := `crdbwork: the database user lacks privileges the worker needs: user "` + operator + `" lacks INSERT, UPDATE, DELETE on crdbwork_sessions, crdbwork_session_queues, crdbwork_reaps (docs/operations.md, "Roles and grants"): `; r.code != 2 || !strings.HasPrefix(r.stderr, want) {
		t.Errorf("crdbwork grants as the operator: want exit 2 and one line starting %q:\n%s", want, r)
	}
	if _, err := d.pool.Exec(ctx, `REVOKE INSERT ON crdbwork_waits_across FROM `+wrk); err != nil {
		t.Fatal(err)
	}
	r = run(t, env("DATABASE_URL="+asRole(t, d, wrk)), "grants", "--json")
	if want := `crdbwork: the database user lacks privileges the worker needs: user "` + wrk + `" lacks INSERT on crdbwork_waits_across (docs/operations.md, "Roles and grants"): GRANT INSERT ON crdbwork_waits_across TO ` + wrk + "\n"; r.code != 2 || r.stderr != want {
		t.Errorf("crdbwork grants as the worker role without INSERT on crdbwork_waits_across: want exit 2 and\n%s%s", want, r)
	}
}

// createRoles creates the reader, operator and worker roles of
// docs/operations.md (rolesSQL) in d's database, with a suffix of their
// own, and returns their names.
func createRoles(t *testing.T, d *db) (reader, operator, wrk string) {
	t.Helper()
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for _, s := range rolesSQL(t, suffix) {
		if _, err := d.pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return "crdbwork_reader_" + suffix, "crdbwork_operator_" + suffix, "crdbwork_worker_" + suffix
}
