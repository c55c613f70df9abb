package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// workerRole creates, in the database at dbURL, a login role with the worker
// role's grants of docs/operations.md ("Roles and grants"), then runs
// revoke (its "%s" is the role), and returns the role's name and the
// database's URL for it. Roles are the server's: each test's has a name of
// its own.
func workerRole(t *testing.T, pool *pgxpool.Pool, dbURL, revoke string) (role, roleURL string) {
	t.Helper()
	if testdb.Kind(t) != "postgres" {
		// CockroachDB: the same grants, but a LOGIN role needs a
		// certificate or a password, which the test server does not set up.
		t.Skip("the role logs in through the PostgreSQL test server's trust authentication")
	}
	raw, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Roles and grants.*?```sql\n(.*?)```").FindSubmatch(raw)
	if m == nil {
		t.Fatal(`docs/operations.md has no sql block under "Roles and grants"`)
	}
	role = "crdbwork_worker_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	text := regexp.MustCompile(`(?m)^--.*$`).ReplaceAllString(string(m[1]), "")
	ctx := context.Background()
	for _, s := range strings.Split(text, ";") {
		s = strings.TrimSpace(s)
		if !regexp.MustCompile(`\bcrdbwork_worker\b`).MatchString(s) {
			continue // the other roles'
		}
		// The worker role alone, under the test's name.
		s = regexp.MustCompile(`\bcrdbwork_(operator|reader)\b,?\s*`).ReplaceAllString(s, "")
		s = strings.TrimRight(strings.TrimSpace(regexp.MustCompile(`\bcrdbwork_worker\b`).ReplaceAllString(s, role)), ",")
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if revoke != "" {
		if _, err := pool.Exec(ctx, fmt.Sprintf(revoke, role)); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return role, u.String()
}

// A worker whose role lacks the grants on one table fails at start with
// ErrPrivileges, naming the user, exactly that table and those privileges,
// and the roles' docs, before it wrote anything (no session, no queue
// row); with every grant it starts and works. Before the check, such a
// worker started, and its reap turns and failure paths were refused over
// and over.
func TestWorkerWithoutItsGrantsFailsAtStart(t *testing.T) {
	t.Parallel()
	dbURL, admin := ownerPool(t)
	ctx := context.Background()
	h := func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }
	run := func(t *testing.T, roleURL string) error {
		t.Helper()
		pool, err := pgxpool.New(ctx, roleURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		q, err := claim.New(pool, claim.Options{Queue: "grants"})
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(q, h, worker.Options{Parts: 2, Session: fastSession()})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		return await.Recv(t, "Run to return", done)
	}

	t.Run("lacking", func(t *testing.T) {
		role, roleURL := workerRole(t, admin, dbURL, `REVOKE INSERT, UPDATE, DELETE ON crdbwork_reaps FROM %s`)
		err := run(t, roleURL)
		if !errors.Is(err, worker.ErrPrivileges) {
			t.Fatalf("Run as a role without its grants on crdbwork_reaps: %v, want ErrPrivileges", err)
		}
		want := fmt.Sprintf(`worker: the database user lacks privileges the worker needs: user %q lacks INSERT, UPDATE, DELETE on crdbwork_reaps `+
			`(docs/operations.md, "Roles and grants"): GRANT INSERT, UPDATE, DELETE ON crdbwork_reaps TO %s`, role, role)
		if err.Error() != want {
			t.Fatalf("Run's error:\n%s\nwant:\n%s", err, want)
		}
		for _, table := range []string{"crdbwork_sessions", "crdbwork_queues"} {
			if n := count(t, admin, `SELECT count(*) FROM `+table); n != 0 {
				t.Errorf("the refused worker wrote %d rows to %s", n, table)
			}
		}
	})
	t.Run("granted", func(t *testing.T) {
		_, roleURL := workerRole(t, admin, dbURL, "")
		pool, err := pgxpool.New(ctx, roleURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		q, err := claim.New(pool, claim.Options{Queue: "granted"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(q, h, worker.Options{Parts: 2, Poll: 20 * time.Millisecond, Session: fastSession()})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		await.Until(t, "the worker with its grants to ack the item", func() (bool, string) {
			n := count(t, admin, `SELECT count(*) FROM crdbwork_items WHERE queue = 'granted'`)
			return n == 0, fmt.Sprintf("%d items", n)
		})
		cancel()
		if err := await.Recv(t, "Run to return", done); err != nil {
			t.Fatalf("Run as a role with every grant: %v", err)
		}
	})
}

// A group (OpenGroup) whose role lacks one privilege on one table fails at
// start the same way, naming that one.
func TestGroupWithoutItsGrantsFailsAtStart(t *testing.T) {
	t.Parallel()
	dbURL, admin := ownerPool(t)
	ctx := context.Background()
	role, roleURL := workerRole(t, admin, dbURL, `REVOKE INSERT ON crdbwork_attempt_errors FROM %s`)
	h := func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }
	g, err := worker.OpenGroup(ctx, roleURL, []worker.QueueConfig{
		{Claim: claim.Options{Queue: "a"}, Handler: h},
		{Claim: claim.Options{Queue: "b"}, Handler: h, Options: worker.Options{Parts: 2}},
	}, worker.GroupOptions{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	err = await.Recv(t, "the group's Run to return", done)
	if !errors.Is(err, worker.ErrPrivileges) {
		t.Fatalf("Run of a group whose role lacks INSERT on crdbwork_attempt_errors: %v, want ErrPrivileges", err)
	}
	if want := fmt.Sprintf(`user %q lacks INSERT on crdbwork_attempt_errors (docs/operations.md, "Roles and grants"): GRANT INSERT ON crdbwork_attempt_errors TO %s`, role, role); !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("Run's error:\n%s\nwant it to end with:\n%s", err, want)
	}
	if n := count(t, admin, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Errorf("the refused group started %d sessions", n)
	}
}

// Grants revoked while a worker runs: its queue's reap turn is refused
// (42501), and the log line names the user, the table and the privileges it
// lacks (an error wrapping ErrPrivileges); the refused turn backs off,
// doubling from a heartbeat up to a minute, rather than coming every few
// heartbeats; once the grant is back, a turn succeeds again. Before, the
// line held the server's error alone ("permission denied for table
// crdbwork_reaps") and the turn was tried every five heartbeats forever.
func TestRefusedReapTurnsBackOff(t *testing.T) {
	t.Parallel()
	dbURL, admin := ownerPool(t)
	ctx := context.Background()
	role, roleURL := workerRole(t, admin, dbURL, "")
	pool, err := pgxpool.New(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q, err := claim.New(pool, claim.Options{Queue: "refused"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refusedAt, sessionsRefusedAt []time.Time
	var lastErr error
	turns := await.NewRounds("successful reap turns of the queue")
	core, logs := observer.New(zap.WarnLevel)
	// Short heartbeats (the turns' waits count in them); nobody leaves, so
	// a long expiry costs nothing.
	hb := await.Stretch(50 * time.Millisecond)
	sess := session.Tuning{Heartbeat: hb, Expiry: 50 * hb}
	opts := worker.Options{Poll: 50 * time.Millisecond, Session: sess, Logger: zap.New(core)}
	opts.Testing.AfterReapTurn = func(name string, took bool, err error) {
		if name == "" && err != nil {
			// The turn to reap expired sessions (the same table).
			mu.Lock()
			sessionsRefusedAt = append(sessionsRefusedAt, time.Now())
			mu.Unlock()
		}
		if name != "refused" {
			return
		}
		if err == nil {
			turns.Tick()
			return
		}
		mu.Lock()
		refusedAt, lastErr = append(refusedAt, time.Now()), err
		mu.Unlock()
	}
	w, err := worker.New(q, func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }, opts)
	if err != nil {
		t.Fatal(err)
	}
	// A peer session (of the admin, which reaps nothing), so that the
	// worker is not alone in its database: a session alone takes no turn
	// to reap expired sessions (there can be none).
	peer, err := session.Start(ctx, admin, session.Options{Tuning: session.Tuning{Heartbeat: time.Minute, Expiry: time.Hour, ReapEvery: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(context.Background()) })
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	turns.Wait(t, 1)
	if _, err := admin.Exec(ctx, `REVOKE INSERT, UPDATE, DELETE ON crdbwork_reaps FROM `+role); err != nil {
		t.Fatal(err)
	}
	const refusals = 6
	await.Until(t, "the queue's reap turn and the sessions' to be refused 6 times", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(refusedAt) >= refusals && len(sessionsRefusedAt) >= refusals,
			fmt.Sprintf("%d and %d refused, the last: %v", len(refusedAt), len(sessionsRefusedAt), lastErr)
	})
	mu.Lock()
	gap := refusedAt[refusals-1].Sub(refusedAt[refusals-2])
	sessionsGap := sessionsRefusedAt[refusals-1].Sub(sessionsRefusedAt[refusals-2])
	for i := 1; i < len(refusedAt); i++ {
		t.Logf("refused turn %d: %v after the one before (heartbeat %v)", i+1, refusedAt[i].Sub(refusedAt[i-1]).Round(time.Millisecond), sess.Heartbeat)
	}
	mu.Unlock()
	// The 6th try comes after the 5th refusal's wait: 16 heartbeats,
	// jittered from half of it (8). Without the backoff: 2.5 to 7.5
	// heartbeats. (A busy machine only makes the gap longer.)
	if min := 8 * sess.Heartbeat; gap < min {
		t.Errorf("the 6th refused turn came %v after the 5th, want at least %v (8 heartbeats of %v): the refused turn does not back off", gap, min, sess.Heartbeat)
	}
	if min := 8 * sess.Heartbeat; sessionsGap < min {
		t.Errorf("the 6th refused turn to reap expired sessions came %v after the 5th, want at least %v (8 heartbeats of %v): it does not back off", sessionsGap, min, sess.Heartbeat)
	}
	want := fmt.Sprintf(`user %q lacks INSERT, UPDATE, DELETE on crdbwork_reaps`, role)
	var named bool
	for _, e := range logs.FilterMessage("taking the queue's reap turn failed; reaping anyway").All() {
		if err, ok := e.ContextMap()["error"].(string); ok && e.Level == zap.ErrorLevel && strings.Contains(err, want) &&
			strings.Contains(err, worker.ErrPrivileges.Error()) && strings.Contains(err, "docs/operations.md") {
			named = true
		}
	}
	if !named {
		var lines []string
		for _, e := range logs.All() {
			lines = append(lines, fmt.Sprintf("%s %s %v", e.Level, e.Message, e.ContextMap()))
		}
		t.Errorf("no error line of the refused turn names %q:\n%s", want, strings.Join(lines, "\n"))
	}
	// The grant back: a turn succeeds again (within the wait of the
	// refusals so far).
	if _, err := admin.Exec(ctx, `GRANT INSERT, UPDATE, DELETE ON crdbwork_reaps TO `+role); err != nil {
		t.Fatal(err)
	}
	regranted := time.Now()
	turns.Wait(t, 1)
	t.Logf("a turn succeeded %v after the grant", time.Since(regranted).Round(time.Millisecond))
	cancel()
	if err := await.Recv(t, "Run to return", done); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A nack refused for lack of a privilege (INSERT on the attempts' errors
// revoked while the worker runs) is logged naming the table and the
// privilege; once the grant is back, the item's lease releases it and it
// ends (acked at its next attempt): nothing is lost.
func TestRefusedNackNamesTheGrant(t *testing.T) {
	t.Parallel()
	dbURL, admin := ownerPool(t)
	ctx := context.Background()
	role, roleURL := workerRole(t, admin, dbURL, `REVOKE INSERT ON crdbwork_attempt_errors FROM %s`)
	pool, err := pgxpool.New(ctx, roleURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q, err := claim.New(pool, claim.Options{Queue: "nacks", Lease: await.Stretch(2 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	var mu sync.Mutex
	attempts := 0
	h := func(context.Context, claim.Item) (worker.Record, error) {
		mu.Lock()
		defer mu.Unlock()
		if attempts++; attempts == 1 {
			return nil, errors.New("the first attempt fails")
		}
		return nil, nil
	}
	w, err := worker.New(q, h, worker.Options{Poll: 20 * time.Millisecond, Session: fastSession(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	// The worker starts with every grant; then one is revoked.
	if _, err := admin.Exec(ctx, `GRANT INSERT ON crdbwork_attempt_errors TO `+role); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	await.Until(t, "the worker to start a session", func() bool { return w.Stats().Sessions > 0 })
	if _, err := admin.Exec(ctx, `REVOKE INSERT ON crdbwork_attempt_errors FROM `+role); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`user %q lacks INSERT on crdbwork_attempt_errors`, role)
	await.Until(t, "a log line of the refused nack naming the table and the privilege", func() (bool, string) {
		var seen []string
		for _, e := range logs.All() {
			msg, _ := e.ContextMap()["error"].(string)
			if strings.HasPrefix(e.Message, "nack failed") && strings.Contains(msg, want) && strings.Contains(msg, worker.ErrPrivileges.Error()) {
				return true, ""
			}
			seen = append(seen, e.Message+": "+msg)
		}
		return false, strings.Join(seen, "\n")
	})
	if _, err := admin.Exec(ctx, `GRANT INSERT ON crdbwork_attempt_errors TO `+role); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the item to end once the grant is back", func() (bool, string) {
		n := count(t, admin, `SELECT count(*) FROM crdbwork_items WHERE queue = 'nacks'`)
		return n == 0, fmt.Sprintf("%d items", n)
	})
	cancel()
	if err := await.Recv(t, "Run to return", done); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// A role without USAGE on the tables' schema fails at start with
// ErrPrivileges naming the schema (its tables cannot even be named).
func TestWorkerWithoutTheSchemaFailsAtStart(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("the role logs in through the PostgreSQL test server's trust authentication")
	}
	dbURL := testdb.NewURL(t)
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	tables := crsql.Tables{Schema: "work"}
	if err := crsql.Apply(ctx, admin, tables); err != nil {
		t.Fatal(err)
	}
	role := "crdbwork_noschema_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := admin.Exec(ctx, `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q, err := claim.New(pool, claim.Options{Queue: "q", Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(q, func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }, worker.Options{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	err = await.Recv(t, "Run to return", done)
	if !errors.Is(err, worker.ErrPrivileges) || !strings.Contains(err.Error(), "the database refused schema work (docs/operations.md") {
		t.Fatalf("Run as a role without USAGE on the schema: %v, want ErrPrivileges naming the schema", err)
	}
}

// ownerPool returns the URL of a fresh database with the default tables
// and a pool on it as their owner (the test's superuser), which creates
// the roles of the test and grants or revokes their privileges.
func ownerPool(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dbURL := testschema.NewURL(t)
	admin, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return dbURL, admin
}
