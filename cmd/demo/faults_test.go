package main

// The processes' side of the fault suite (issue 9, "Proof"; the in-process
// cases are in worker/faults_test.go): real `demo work` processes, SIGKILLed,
// frozen with SIGSTOP and thawed, and under a database server restarted in
// place. Every case asserts that every item ends within the bound it states
// — acked with exactly one result row, or dead —, that no result was written
// by a session after its row was gone (sampled every 50 ms), and that no
// item stayed claimed by a live session past its lease.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// leaseSlack is how long past its lease an item may stay claimed by a live
// session before the case fails, on a quiet machine: the reaper's period,
// generously. Each case stretches it with the machine's load
// (faultDemo.leaseSlack).
const leaseSlack = 5 * time.Second

// faultDemo is one fault case over demo processes.
type faultDemo struct {
	t   *testing.T
	url string
	env []string
	// workEnv, if not nil, is the environment of the worker processes
	// (work) instead of env: another DATABASE_URL, through a proxy.
	workEnv []string
	db      *pgxpool.Pool
	items   int
	// leaseSlack is the package's leaseSlack stretched with the machine's
	// load (await.Stretch) when the case started.
	leaseSlack time.Duration

	mu sync.Mutex
	// lastSeen is, per session, the start (database clock) of the last
	// sample that found its row; goneBy, the database clock read by the
	// first sample that no longer found it, after that sample's snapshot:
	// the row's deletion committed within (lastSeen, goneBy].
	lastSeen, goneBy map[uuid.UUID]time.Time
	// sampled is the start of the last sample (database clock); gap, the
	// longest time between two samples' starts, and gapAt, when it ended.
	sampled, gapAt time.Time
	gap            time.Duration
	overdue        int
	firstBad       string
	stop           context.CancelFunc
	done           chan struct{}
}

// migrate runs `crdbwork migrate` on the database at dbURL (one that no
// template made: a server of the test's own).
func migrate(t *testing.T, dbURL string) {
	t.Helper()
	if r := op(t, time.Minute, demoEnv("DATABASE_URL="+dbURL), "migrate"); r.code != 0 {
		t.Fatalf("migrate: exit status %d\n%s", r.code, r.stderr)
	}
}

// sessionTiming returns a heartbeat of hb on a quiet machine, stretched
// with its load (await.Stretch), and an expiry of expiries of it: one
// reading of the load for both, so that the heartbeats keep up with the
// expiry (see internal/await).
func sessionTiming(hb time.Duration, expiries int) (heartbeat, expiry time.Duration) {
	heartbeat = await.Stretch(hb)
	return heartbeat, time.Duration(expiries) * heartbeat
}

// newFaultDemo enqueues items into the demo queue (8 parts) of the
// database at dbURL, which has the crdbwork schema (testschema.NewURL, or
// migrate), and starts watching sessions and claims.
func newFaultDemo(t *testing.T, dbURL string, items int) *faultDemo {
	t.Helper()
	env := demoEnv("DATABASE_URL=" + dbURL)
	if r := demo(t, time.Minute, env, "enqueue", "--count", fmt.Sprint(items), "--parts", "8"); r.code != 0 {
		t.Fatalf("enqueue: exit status %d\n%s", r.code, r.stderr)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	f := &faultDemo{t: t, url: dbURL, env: env, db: db, items: items, lastSeen: map[uuid.UUID]time.Time{}, goneBy: map[uuid.UUID]time.Time{},
		leaseSlack: await.Stretch(leaseSlack)}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop, f.done = cancel, make(chan struct{})
	go f.watch(ctx)
	t.Cleanup(f.stopWatching)
	return f
}

// watch samples the session rows and the overdue claims every 50 ms.
func (f *faultDemo) watch(ctx context.Context) {
	defer close(f.done)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		// One statement: its snapshot is taken before it runs, so
		// clock_timestamp() is read after the snapshot, and a row missing
		// from the snapshot was deleted (committed) before that reading.
		var ids []uuid.UUID
		var at, after time.Time
		err := f.db.QueryRow(qctx, `SELECT ARRAY(SELECT id FROM crdbwork_sessions), now(), clock_timestamp()`).Scan(&ids, &at, &after)
		if err == nil {
			f.mu.Lock()
			if !f.sampled.IsZero() && at.Sub(f.sampled) > f.gap {
				f.gap, f.gapAt = at.Sub(f.sampled), at
			}
			f.sampled = at
			for _, id := range ids {
				f.lastSeen[id] = at
			}
			for id := range f.lastSeen {
				if _, gone := f.goneBy[id]; !gone && !slices.Contains(ids, id) {
					f.goneBy[id] = after
				}
			}
			f.mu.Unlock()
		}
		var n int
		var id string
		err = f.db.QueryRow(qctx, `SELECT count(*), COALESCE(max(i.id::TEXT), '')
			FROM crdbwork_items AS i JOIN crdbwork_sessions AS s ON s.id = i.claim
			WHERE i.lease_until + $1::BIGINT * INTERVAL '1 microsecond' < now()`, f.leaseSlack.Microseconds()).Scan(&n, &id)
		cancel()
		if err == nil && n > 0 {
			f.mu.Lock()
			if n > f.overdue {
				f.overdue = n
			}
			if f.firstBad == "" {
				f.firstBad = fmt.Sprintf("item %s claimed by a live session past its lease at %s", id, time.Now().Format("15:04:05.000"))
			}
			f.mu.Unlock()
		}
	}
}

func (f *faultDemo) stopWatching() {
	f.stop()
	<-f.done
}

// proc is a `demo work` process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// work starts a `demo work` process with the given session timing.
func (f *faultDemo) work(name string, heartbeat, expiry time.Duration, extra ...string) *proc {
	f.t.Helper()
	args := append([]string{"work", "--name", name, "--task-time", "3ms", "--concurrency", "6",
		"--heartbeat", heartbeat.String(), "--expiry", expiry.String(), "--rebalance", "200ms"}, extra...)
	cmd := exec.Command(binFor(f.t, demoBin, args), args...)
	cmd.Env = f.env
	if f.workEnv != nil {
		cmd.Env = f.workEnv
	}
	p := &proc{name: name, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.exited) }()
	f.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// stopGracefully sends SIGTERM and waits for the process to exit.
func (p *proc) stopGracefully(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGTERM)
	await.Recv(t, p.name+" to stop after SIGTERM", p.exited, await.Show(p.stderr.String))
}

// sessionOf waits for the session of the named worker and returns its id.
func (f *faultDemo) sessionOf(name string) uuid.UUID {
	f.t.Helper()
	var id uuid.UUID
	await.Until(f.t, "the session of "+name, func() error {
		return f.db.QueryRow(context.Background(), `SELECT id FROM crdbwork_sessions WHERE name = $1`, name).Scan(&id)
	})
	return id
}

func (f *faultDemo) count(q string, args ...any) int {
	f.t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.db.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		return -1 // the database may be down: the caller waits on
	}
	return n
}

// waitProgress waits until at least n results exist.
func (f *faultDemo) waitProgress(n int) {
	f.t.Helper()
	await.Until(f.t, fmt.Sprintf("%d results", n), func() (bool, string) {
		got := f.count(`SELECT count(*) FROM demo_results`)
		return got >= n, fmt.Sprintf("%d results", got)
	}, await.Within(time.Minute))
}

// assertEnded waits until no item is left, at most bound (stretched with
// the machine's load, as every await budget) after since, and checks the
// contract; procs are stopped gracefully first. It returns how long after
// since the last item ended.
func (f *faultDemo) assertEnded(since time.Time, bound time.Duration, procs ...*proc) time.Duration {
	f.t.Helper()
	t := f.t
	atFault := f.count(`SELECT count(*) FROM crdbwork_items`)
	// The items claimed when the fault ended: the ones a fault can strand.
	// The time until the last of them ended is the recovery.
	var held []uuid.UUID
	if rows, err := f.db.Query(context.Background(), `SELECT id FROM crdbwork_items WHERE claim IS NOT NULL`); err == nil {
		held, _ = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	var recovered time.Duration
	await.Until(t, fmt.Sprintf("every item to end (bound %v after the fault)", bound), func() (bool, string) {
		if recovered == 0 && f.count(`SELECT count(*) FROM crdbwork_items WHERE id = ANY($1)`, held) == 0 {
			recovered = time.Since(since)
		}
		if f.count(`SELECT count(*) FROM crdbwork_items`) == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d items not ended (%d claimed by a live session)",
			f.count(`SELECT count(*) FROM crdbwork_items`),
			f.count(`SELECT count(*) FROM crdbwork_items WHERE claim IN (SELECT id FROM crdbwork_sessions)`))
	}, await.Within(bound), await.Show(func() string {
		var tails []string
		for _, p := range procs {
			tails = append(tails, p.name+":\n"+lastLines(p.stderr.String(), 10))
		}
		return f.describe() + strings.Join(tails, "\n")
	}))
	took := time.Since(since)
	for _, p := range procs {
		p.stopGracefully(t)
	}
	f.stopWatching()

	r := demo(t, time.Minute, f.env, "verify", "--json")
	v := lastJSON(t, r)
	acked, dead := num(t, v, "acked"), num(t, v, "dead")
	if num(t, v, "enqueued") != float64(f.items) || acked+dead != float64(f.items) || num(t, v, "lost") != 0 ||
		num(t, v, "duplicates") != 0 || num(t, v, "claimed") != 0 || r.code != 0 {
		t.Errorf("verify (exit status %d): %v; want all %d items acked or dead, none lost, duplicated or claimed", r.code, v, f.items)
	}

	f.checkFence()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.overdue != 0 {
		t.Errorf("up to %d items were claimed by a live session more than %v past their lease: %s", f.overdue, f.leaseSlack, f.firstBad)
	}
	t.Logf("every item ended %v after the fault (bound %v; %d items were left when the fault ended; the last of the %d claimed then ended after %v); acked %v, dead %v",
		took.Round(time.Millisecond), bound, atFault, len(held), recovered.Round(time.Millisecond), acked, dead)
	return took
}

// checkFence checks that no session's result committed after its row was
// deleted (invariants 1 and 6: deleting the row releases its claims, and an
// ack commits only while the claim still names its session). A result's
// done_at is its ack transaction's now(), the transaction's start: a
// result whose transaction started after goneBy — after a snapshot without
// the row — was written by a transaction whose own snapshot had no claim
// of that session, and must not have committed. Both times are the
// database's clock, compared without an allowance; a watcher slowed by a
// busy machine reads goneBy later, which makes the check weaker, never
// wrong. (It compared done_at with lastSeen + 500 ms before: a watcher that
// missed samples for longer, as around a database restart on a busy
// machine, reported acks that committed while the row still existed.)
// Results in the window between the last sample that saw the row and the
// first that did not are logged, not judged: the window says when the
// deletion committed only to within the watcher's sampling.
func (f *faultDemo) checkFence() {
	t := f.t
	t.Helper()
	rows, err := f.db.Query(context.Background(), `SELECT session_id, min(done_at), max(done_at), count(*) FROM demo_results GROUP BY session_id`)
	if err != nil {
		t.Fatal(err)
	}
	type sessionResults struct {
		sid         uuid.UUID
		first, last time.Time
		n           int
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (sessionResults, error) {
		var r sessionResults
		err := row.Scan(&r.sid, &r.first, &r.last, &r.n)
		return r, err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	goneBy, lastSeen := maps.Clone(f.goneBy), maps.Clone(f.lastSeen)
	t.Logf("the watcher's longest time between two samples of the sessions: %v, until %v", f.gap, f.gapAt.Format("15:04:05.000000"))
	f.mu.Unlock()
	for _, r := range all {
		gone, ok := goneBy[r.sid]
		if !ok {
			continue // alive when the watcher stopped, or never sampled
		}
		if r.last.After(gone) {
			n := f.count(`SELECT count(*) FROM demo_results WHERE session_id = $1 AND done_at > $2`, r.sid, gone)
			t.Errorf("session %s: %d results written by transactions that started after its row was gone (deleted by %v, last seen %v; the last result at %v): acks committed without their claims",
				r.sid, n, gone.Format("15:04:05.000000"), lastSeen[r.sid].Format("15:04:05.000000"), r.last.Format("15:04:05.000000"))
			continue
		}
		if seen := lastSeen[r.sid]; r.last.After(seen) {
			t.Logf("session %s: its last result at %v, %v after the last sample that saw its row (%v) and %v before the first that did not (%v)",
				r.sid, r.last.Format("15:04:05.000000"), r.last.Sub(seen), seen.Format("15:04:05.000000"), gone.Sub(r.last), gone.Format("15:04:05.000000"))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// TestFaultDemoDatabaseRestart restarts the database server (its own, not
// the shared one) under three `demo work` processes, with `pg_ctl restart -m
// fast` and with stop, 3 s down, start. The sessions' expiry (5 s on a
// quiet machine, stretched with its load: sessionTiming) outlives the
// restart. Bound: every item ends within 60 s of the server's return
// (stretched, as every wait).
func TestFaultDemoDatabaseRestart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		down time.Duration
	}{{"restart-fast", 0}, {"stop-3s-start", 3 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a server of its own
			srv, dbURL := testdb.NewServer(t)
			migrate(t, dbURL)
			const items = 1500
			f := newFaultDemo(t, dbURL, items)
			var procs []*proc
			hb, expiry := sessionTiming(500*time.Millisecond, 10)
			for i := range 3 {
				procs = append(procs, f.work(fmt.Sprintf("restart-worker-%d", i), hb, expiry))
			}
			f.waitProgress(items * 3 / 5)
			ctx := context.Background()
			if c.down == 0 {
				if err := srv.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := srv.RestartAfter(ctx, c.down); err != nil {
				t.Fatal(err)
			}
			f.assertEnded(time.Now(), time.Minute, procs...)
		})
	}
}

// TestFaultDemoSigkill kills one of three `demo work` processes with
// SIGKILL while it holds items. Bound: every item ends within 30 s of the
// kill (stretched, as every wait; its session expires after 1.5 s on a
// quiet machine; its claims go with it).
func TestFaultDemoSigkill(t *testing.T) {
	t.Parallel()
	const items = 1500
	f := newFaultDemo(t, testschema.NewURL(t), items)
	var procs []*proc
	hb, expiry := sessionTiming(250*time.Millisecond, 6)
	for i := range 3 {
		procs = append(procs, f.work(fmt.Sprintf("kill-worker-%d", i), hb, expiry))
	}
	victim := procs[0]
	sid := f.sessionOf(victim.name)
	await.Until(t, "the victim to hold items", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, sid) > 0
	}, await.Show(victim.stderr.String))
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.exited
	f.assertEnded(killed, 30*time.Second, procs[1:]...)
}

// TestFaultDemoSigstop freezes one of two `demo work` processes with SIGSTOP
// while it holds items, until its peer has deleted its expired session, then
// thaws it with SIGCONT. Whatever the thawed process had in flight must be
// refused: no result row of the frozen session is dated after its session
// row was gone. Once the thawed process has seen its session lost (it
// started a new one), it is stopped gracefully: its handlers take 300 ms,
// and a new session of it would take half the parts and work them at 20
// items a second — under load, with most items left, for longer than the
// bound (which a test of a faster worker's recovery should not measure).
// Bound: every item ends within 30 s of the thaw.
func TestFaultDemoSigstop(t *testing.T) {
	t.Parallel()
	const items = 1500
	f := newFaultDemo(t, testschema.NewURL(t), items)
	// Its handlers take 300 ms: frozen mid-work, they finish after the thaw
	// and try to ack items their session no longer holds.
	hb, expiry := sessionTiming(250*time.Millisecond, 6)
	frozen := f.work("frozen-worker", hb, expiry, "--task-time", "300ms")
	peer := f.work("peer-worker", hb, expiry)
	sid := f.sessionOf(frozen.name)
	await.Until(t, "the frozen worker to hold items", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, sid) > 0
	}, await.Show(frozen.stderr.String))
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	held := f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, sid)
	await.Until(t, "the frozen worker's session to be deleted by its peer", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, sid) == 0
	}, await.Show(peer.stderr.String))
	var gone time.Time
	if err := f.db.QueryRow(context.Background(), `SELECT now()`).Scan(&gone); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // frozen a while longer: the fault's duration
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	t.Logf("froze %s holding %d items; its session was gone at %v", frozen.name, held, gone.Format("15:04:05.000"))
	await.Until(t, "the thawed worker to start a new session", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_sessions WHERE name = $1 AND id <> $2`, frozen.name, sid) > 0
	}, await.Show(frozen.stderr.String))
	frozen.stopGracefully(t)
	f.assertEnded(thawed, 30*time.Second, frozen, peer)
	t.Logf("the thawed worker's last line: %s", strings.TrimSpace(lastLines(frozen.stderr.String(), 1)))
	if n := f.count(`SELECT count(*) FROM demo_results WHERE session_id = $1 AND done_at >= $2`, sid, gone); n != 0 {
		t.Errorf("%d results written by the frozen session after its session was gone", n)
	}
}

// TestVerifyReportsStuckClaims: verify --json reports the items still
// claimed, those past their lease, the dead ones and the oldest claim's age,
// and the text output shows them.
func TestVerifyReportsStuckClaims(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	if r := demo(t, time.Minute, env, "enqueue", "--count", "4"); r.code != 0 {
		t.Fatalf("enqueue: %s", r.stderr)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var sid uuid.UUID
	if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, name) VALUES (INTERVAL '1 hour', 'stuck') RETURNING id`).Scan(&sid); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(sid).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %d items, %v", len(got), err)
	}
	if out, err := q.Nack(ctx, got[0], claim.Permanent(fmt.Errorf("broken"))); err != nil || out != claim.Dead {
		t.Fatalf("nack: %v, %v", out, err)
	}
	// One claim is 90 s old and 30 s past its lease; one is fresh.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET claimed_at = now() - INTERVAL '90 seconds',
		lease_until = now() - INTERVAL '30 seconds' WHERE id = $1`, got[1].ID); err != nil {
		t.Fatal(err)
	}
	r := demo(t, time.Minute, env, "verify", "--json")
	v := lastJSON(t, r)
	for key, want := range map[string]float64{"enqueued": 4, "acked": 0, "dead": 1, "pending": 3, "claimed": 2, "claimed_past_lease": 1, "lost": 0} {
		if got := num(t, v, key); got != want {
			t.Errorf("%s = %v, want %v (%v)", key, got, want, v)
		}
	}
	if age := num(t, v, "oldest_claim_age_seconds"); age < 90 || age > 600 {
		t.Errorf("oldest_claim_age_seconds = %v, want about 90", age)
	}
	r = demo(t, time.Minute, env, "verify")
	if !strings.Contains(r.stdout, "claimed") || !strings.Contains(r.stdout, "1 past their lease") {
		t.Errorf("verify's text does not show the stuck claims:\n%s", r.stdout)
	}
}

// TestFaultDemoSoakSmall is the CI-sized version of the soak (see README,
// "Faults, and the soak"): demo run on its embedded server, worker processes
// SIGKILLed every 700 ms and the server restarted every 1.5 s; nothing
// lost, nothing duplicated, nothing left claimed, every worker process that
// exited was killed, and the workers' reports add up. It is also the suite's
// test of `demo run --kill-every` (TestRunKillEvery was the same run
// without the restarts).
func TestFaultDemoSoakSmall(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a database server")
	}
	const items = 3000
	r := demo(t, 3*time.Minute, demoEnv(), "run", "--items", fmt.Sprint(items), "--workers", "3", "--kill-every", "700ms",
		"--restart-db-every", "1500ms", "--task-time", "5ms", "--concurrency", "8", "--json", "--progress=false") // 8 handlers of 5 ms: a run long enough for kills and restarts
	s := checkSummary(t, r, items)
	if s["mode"] != "processes" {
		t.Errorf("mode = %v, want processes", s["mode"])
	}
	// The workers' reports: every worker had a session, every kill lost one.
	if started := num(t, s, "sessions_started"); started < 3 {
		t.Errorf("sessions_started = %v, want at least the 3 workers'", started)
	}
	if lost := num(t, s, "sessions_lost"); lost < 1 {
		t.Errorf("sessions_lost = %v with %v workers killed", lost, s["workers_killed"])
	}
	num(t, s, "claims_lost")
	if _, ok := s["retries"].(map[string]any); !ok {
		t.Errorf("no retries in the summary: %v", s)
	}
	if strings.Contains(r.stderr, "unexpectedly") || strings.Contains(r.stderr, "did not stop") {
		t.Errorf("a worker process misbehaved:\n%s", r.stderr)
	}
	if num(t, s, "db_restarts") < 1 {
		t.Errorf("db_restarts = %v, want at least 1\nstderr:\n%s", s["db_restarts"], r.stderr)
	}
	if num(t, s, "workers_killed") < 1 {
		t.Errorf("workers_killed = %v, want at least 1", s["workers_killed"])
	}
	if num(t, s, "claimed") != 0 || num(t, s, "pending") != 0 {
		t.Errorf("claimed %v, pending %v after the run; want 0", s["claimed"], s["pending"])
	}
	num(t, s, "oldest_claim_age_seconds")
	t.Logf("soak (small): %.0f items/s, %v kills, %v restarts", num(t, s, "items_per_second"), s["workers_killed"], s["db_restarts"])
}

// --restart-db-every needs the embedded server.
func TestRestartDBNeedsEmbedded(t *testing.T) {
	t.Parallel()
	r := demo(t, time.Minute, nil, "run", "--database-url", "postgres://127.0.0.1:1/x", "--restart-db-every", "5s")
	if r.code != 2 || !strings.Contains(r.stderr, "embedded") {
		t.Errorf("exit status %d, stderr %q; want 2 and a message about the embedded server", r.code, r.stderr)
	}
}

// describe shows the database's view of the case, for failure messages:
// the sessions, who owns which part, and the items left by part and
// claim.
func (f *faultDemo) describe() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	show := func(title, q string) {
		rows, err := f.db.Query(ctx, q)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", title, err)
			return
		}
		defer rows.Close()
		fmt.Fprintf(&b, "%s:\n", title)
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				fmt.Fprintf(&b, "  %v\n", err)
				return
			}
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	show("sessions", `SELECT concat_ws(' ', id, name, 'heartbeat', (now() - heartbeat_at)::TEXT, 'ago') FROM crdbwork_sessions ORDER BY name`)
	show("parts", `SELECT concat_ws(' ', queue, part, session_id) FROM crdbwork_session_parts ORDER BY queue, part`)
	show("items left by part and claim", `SELECT concat_ws(' ', queue, 'part', part, 'claim', COALESCE(claim::TEXT, '-'), count(*), 'items, attempts up to', max(attempts))
		FROM crdbwork_items GROUP BY queue, part, claim ORDER BY queue, part`)
	return b.String()
}

// TestStartupRetryableAfterRestart: a worker process that `demo run
// --restart-db-every` starts while the server restarts waits for it
// (--wait-db) whatever the server said as it went: the errors of its
// start-up checks on a connection that a fast shutdown terminated (57P01)
// are a restart's, not a reason to exit. (The small soak failed with "6
// worker processes exited unexpectedly; giving up" when they were not.)
func TestStartupRetryableAfterRestart(t *testing.T) {
	t.Parallel()
	for _, msg := range []string{
		"listing the queues: claim: listing the queues: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)",
		`checking the crdbwork table "crdbwork_items": FATAL: terminating connection due to administrator command (SQLSTATE 57P01)`,
		"looking for the demo tables: FATAL: the database system is shutting down (SQLSTATE 57P03)",
		"cannot reach the database at 127.0.0.1:5432: connection refused",
	} {
		if !startupRetryable(errors.New(msg)) {
			t.Errorf("not retried at start-up: %s", msg)
		}
	}
	for _, msg := range []string{
		`the crdbwork schema is not in this database: run "crdbwork migrate" first`,
		"password authentication failed for user \"crdbwork\" (SQLSTATE 28P01)",
	} {
		if startupRetryable(errors.New(msg)) {
			t.Errorf("retried at start-up, but no restart explains it: %s", msg)
		}
	}
}
