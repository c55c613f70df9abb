package main

// Rolling upgrades (issue 16, item 5) with a real binary of the previous
// release: the demo of the last commit whose schema was Version-1 is built
// from this repository's git history, and its processes work beside the
// current ones on a database at the current schema, and through an upgrade
// of the database under them. Every item must end acked exactly once, and
// no process of either version may exit while its sessions are deleted or
// it is killed and restarted.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// previousRelease is the demo binary of the previous schema version, built
// once per test binary (by the first test that needs it).
var previousRelease struct {
	once   sync.Once
	bin    string // the demo binary's path
	ops    string // its operator command (cmd/crdbwork), or bin if it had none
	commit string // the commit it was built from
	skip   string // why it cannot be built here (no git history)
	err    error
}

// previousDemo returns the path of the previous release's demo binary,
// building it on first use, or skips the test when this checkout has no
// history to build it from.
func previousDemo(t *testing.T) string {
	t.Helper()
	p := &previousRelease
	p.once.Do(func() { p.bin, p.ops, p.commit, p.skip, p.err = buildPreviousDemo() })
	if p.skip != "" {
		t.Skip(p.skip)
	}
	if p.err != nil {
		t.Fatalf("building the previous release's demo: %v", p.err)
	}
	return p.bin
}

// git runs git in dir ("": this package's directory) and returns its
// trimmed stdout.
func git(dir string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// schemaVersionLine is how sql/schema.go declares the schema version v.
func schemaVersionLine(v int) string { return fmt.Sprintf("\nconst Version = %d\n", v) }

// findPreviousRelease returns the last commit of HEAD's history whose
// sql/schema.go declares schema version v: the parent of the commit that
// raised it to v+1 (5d8df18 for version 3, the demo's release 0.3.0, when
// this test was written). It returns "" if the history holds no such commit.
func findPreviousRelease(top string, v int) (string, error) {
	// The commits whose diff of sql/schema.go adds or removes a
	// "const Version = " line, newest first, with their parents.
	log, err := git(top, "log", "--format=%H %P", "-G", "const Version = ", "--", "sql/schema.go")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(log, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue // a root commit has no parent to be the previous release
		}
		after, err := git(top, "show", fields[0]+":sql/schema.go")
		if err != nil || !strings.Contains(after, schemaVersionLine(v+1)) {
			continue
		}
		for _, parent := range fields[1:] {
			before, err := git(top, "show", parent+":sql/schema.go")
			if err == nil && strings.Contains(before, schemaVersionLine(v)) {
				return parent, nil
			}
		}
	}
	return "", nil
}

// insideGitCheckout reports whether this directory or a parent has a .git
// entry (a directory, or a file in a worktree).
func insideGitCheckout() bool {
	dir, err := os.Getwd()
	if err != nil {
		return false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
			return true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return false
		}
		dir = parent
	}
}

// buildPreviousDemo extracts the previous release's tree from git into a
// temporary directory and builds its cmd/demo next to the current demo
// binary (the build takes modules from the module cache or proxy, like any
// build), with the demotest tag where that release had it, and its operator
// command (cmd/crdbwork, from release 0.4 on; before it, the demo was the
// operator command too: ops is then bin). It returns a reason to skip, not
// an error, only when this checkout has no history to build from.

// previousOps returns the previous release's operator command: its
// crdbwork binary, or its demo if it had none.
func previousOps(t *testing.T) string {
	t.Helper()
	previousDemo(t)
	return previousRelease.ops
}

// opsArgs adapts an operator command line to the previous release's
// operator command: crdbwork asks for --yes before it changes parts or
// requeues or cancels, where the old demo did not.
func opsArgs(args ...string) []string {
	if previousRelease.ops == previousRelease.bin {
		return args
	}
	switch args[0] {
	case "parts":
		return append(args, "--yes", "--create")
	case "limit":
		return append(args, "--create")
	case "requeue", "cancel":
		return append(args, "--yes")
	}
	return args
}

func buildPreviousDemo() (bin, ops, commit, skip string, err error) {
	prev := crsql.Version - 1
	if _, err := exec.LookPath("git"); err != nil {
		return "", "", "", fmt.Sprintf("git is not installed, so the previous release (schema version %d) cannot be built from history: %v", prev, err), nil
	}
	top, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		if !insideGitCheckout() {
			return "", "", "", fmt.Sprintf("not in a git checkout, so the previous release (schema version %d) cannot be built from history: %v", prev, err), nil
		}
		// A checkout that git cannot read (an unsafe owner, a broken
		// repository) must not pass for one without history.
		return "", "", "", "", err
	}
	commit, err = findPreviousRelease(top, prev)
	if err != nil {
		return "", "", "", "", err
	}
	if commit == "" {
		if shallow, _ := git(top, "rev-parse", "--is-shallow-repository"); shallow == "true" {
			return "", "", "", fmt.Sprintf("this clone is shallow and does not hold the last commit at schema version %d: fetch the full history (git fetch --unshallow) to run the rolling-upgrade tests", prev), nil
		}
		return "", "", "", "", fmt.Errorf("no commit in HEAD's history raises sql/schema.go from `const Version = %d` to %d", prev, prev+1)
	}
	src, err := os.MkdirTemp("", "crdbwork-previous-release-")
	if err != nil {
		return "", "", "", "", err
	}
	defer os.RemoveAll(src)
	// git archive <commit> | tar -x -C src
	archive := exec.Command("git", "archive", "--format=tar", commit)
	archive.Dir = top // from a subdirectory, git archive takes only its subtree
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", "", "", "", err
	}
	untar.Stdin = pipe
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", "", "", "", fmt.Errorf("tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return "", "", "", "", fmt.Errorf("git archive %s: %w: %s", commit, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return "", "", "", "", fmt.Errorf("tar -x: %w: %s", err, untarErr.String())
	}
	bin = filepath.Join(filepath.Dir(demoBin), fmt.Sprintf("demo-schema-v%d", prev))
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	build := exec.Command("go", "build", "-buildvcs=false", "-tags", "demotest", "-o", bin, "./cmd/demo")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", "", "", fmt.Errorf("go build ./cmd/demo of %s: %w\n%s", commit, err, out)
	}
	ops = bin
	if _, err := os.Stat(filepath.Join(src, "cmd", "crdbwork")); err == nil {
		ops = filepath.Join(filepath.Dir(demoBin), fmt.Sprintf("crdbwork-schema-v%d", prev))
		if runtime.GOOS == "windows" {
			ops += ".exe"
		}
		build := exec.Command("go", "build", "-buildvcs=false", "-o", ops, "./cmd/crdbwork")
		build.Dir = src
		build.Env = append(os.Environ(), "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			return "", "", "", "", fmt.Errorf("go build ./cmd/crdbwork of %s: %w\n%s", commit, err, out)
		}
	}
	return bin, ops, commit, "", nil
}

// runBin runs a demo binary (bin) with args and waits for it.
func runBin(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	timeout := await.Stretch(2 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s %s: did not finish within %v\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), timeout, r.stderr)
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return r
}

// demoTables creates the demo's tables in a database with this code's
// schema (testschema.NewURL: what crdbwork migrate makes): the previous
// release's demo processes need them made before them (its migrate made
// both).
func (f *mixedFleet) demoTables() {
	f.t.Helper()
	if err := createDemoTables(context.Background(), f.pool); err != nil {
		f.t.Fatal(err)
	}
}

// mustRun runs bin with args and fails the test unless it exits 0.
func mustRun(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	r := runBin(t, bin, env, args...)
	if r.code != 0 {
		t.Fatalf("%s %s: exit status %d\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// upgradeQueue is the queue the fleets of these tests work.
const upgradeQueue = "upgrade"

// previousServes is the oldest code version that the previous release's
// schema (version crsql.Version-1) serves.
const previousServes = 3

// mixedFleet is a set of `demo work` processes of both versions on one queue.
type mixedFleet struct {
	t    *testing.T
	env  []string
	pool *pgxpool.Pool

	mu      sync.Mutex
	workers map[string]*fleetWorker
	items   int // items enqueued into the queue so far
}

// fleetWorker is one `demo work` process.
type fleetWorker struct {
	name     string
	bin      string
	cmd      *exec.Cmd
	stderr   *syncBuffer
	exited   chan struct{}
	expected bool // the test stopped or killed it
}

func newFleet(t *testing.T, url string) *mixedFleet {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// The queue is the demo's, made by the previous release's demo, which
	// recorded no demo queues: recorded here, as this code's demo would
	// have, so that this code's demo works on it.
	adoptDemoQueue(t, pool, upgradeQueue)
	return &mixedFleet{t: t, env: demoEnv("DATABASE_URL=" + url), pool: pool, workers: map[string]*fleetWorker{}}
}

// start starts a `demo work` process of bin named name (a name already used
// is taken over: its earlier process must be gone), with the workers' flags
// and extra.
func (f *mixedFleet) start(bin, name string, extra ...string) {
	f.t.Helper()
	args := append([]string{"work", "--queue", upgradeQueue, "--name", name, "--task-time", "10ms", "--concurrency", "4",
		"--heartbeat", "250ms", "--expiry", "2s", "--rebalance", "200ms", "--json"}, extra...)
	cmd := exec.Command(binFor(f.t, bin, args), args...)
	cmd.Env = f.env
	w := &fleetWorker{name: name, bin: bin, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(w.exited) }()
	f.t.Cleanup(func() {
		cmd.Process.Kill()
		<-w.exited
	})
	f.mu.Lock()
	f.workers[name] = w
	f.mu.Unlock()
}

// checkAlive fails the test if a worker exited that the test did not stop.
func (f *mixedFleet) checkAlive() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.workers {
		select {
		case <-w.exited:
			if !w.expected {
				f.t.Fatalf("worker %s (%s) exited (status %d) while the test ran it; stderr:\n%s",
					w.name, filepath.Base(w.bin), w.cmd.ProcessState.ExitCode(), lastLines(w.stderr.String(), 20))
			}
		default:
		}
	}
}

// waitFor waits until cond holds (await.Until), failing the test as soon
// as a worker exits unexpectedly.
func (f *mixedFleet) waitFor(what string, cond func() bool) {
	f.t.Helper()
	await.Until(f.t, what, func() bool {
		f.checkAlive()
		return cond()
	}, await.Show(f.describe))
}

// heartbeats counts rounds of heartbeats of the named workers' sessions
// (their newest): a round ends when each of them has heartbeated once more
// (its heartbeat_at moved), seen by a poll of the sessions every 20 ms
// until the test ends. The old workers' loops cannot be hooked (they are
// another release's processes); their heartbeats, which they write, pace
// the rounds that await.Never watches through.
func (f *mixedFleet) heartbeats(names ...string) *await.Rounds {
	r := await.NewRounds(fmt.Sprintf("heartbeats of each of %v", names))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	f.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		// mark: the newest heartbeat when the last round ended; the next
		// ends when the oldest is newer.
		var mark time.Time
		for {
			var oldest, newest *time.Time
			err := f.pool.QueryRow(ctx, `SELECT min(h), max(h) FROM (
    SELECT (SELECT heartbeat_at FROM crdbwork_sessions WHERE name = n ORDER BY created_at DESC LIMIT 1) AS h
    FROM unnest($1::TEXT[]) AS v (n)) AS s`, names).Scan(&oldest, &newest)
			if err == nil && oldest != nil && newest != nil && oldest.After(mark) {
				if !mark.IsZero() {
					r.Tick()
				}
				mark = *newest
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return r
}

// describe shows the sessions, their parts and the workers' last lines,
// for failure messages.
func (f *mixedFleet) describe() string {
	var b strings.Builder
	rows, err := f.pool.Query(context.Background(), `SELECT s.name, s.id::TEXT,
    (SELECT count(*) FROM crdbwork_session_parts AS p WHERE p.session_id = s.id AND p.queue = $1)
FROM crdbwork_sessions AS s ORDER BY s.name`, upgradeQueue)
	if err == nil {
		for rows.Next() {
			var name, id string
			var parts int
			if rows.Scan(&name, &id, &parts) == nil {
				fmt.Fprintf(&b, "session %s %s: %d parts of %q\n", name, id, parts, upgradeQueue)
			}
		}
		rows.Close()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.workers {
		fmt.Fprintf(&b, "%s (%s):\n%s\n", w.name, filepath.Base(w.bin), lastLines(w.stderr.String(), 5))
	}
	return b.String()
}

// count runs a count query (-1 if it fails: the caller waits on).
func (f *mixedFleet) count(q string, args ...any) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := f.pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}

// session returns the id of the named worker's newest session (uuid.Nil
// if it has none).
func (f *mixedFleet) session(name string) uuid.UUID {
	var id uuid.UUID
	err := f.pool.QueryRow(context.Background(),
		`SELECT id FROM crdbwork_sessions WHERE name = $1 ORDER BY created_at DESC LIMIT 1`, name).Scan(&id)
	if err != nil {
		return uuid.Nil
	}
	return id
}

// settled waits until the named workers, and no other session, are live,
// each session holding at least one part of the queue, and returns their
// sessions by name. Sessions in not are not accepted (ones the test
// deleted, or of a killed process).
func (f *mixedFleet) settled(names, holders []string, not map[uuid.UUID]bool) map[string]uuid.UUID {
	f.t.Helper()
	got := map[string]uuid.UUID{}
	f.waitFor(fmt.Sprintf("sessions of %v, with %v each holding a part of %q", names, holders, upgradeQueue), func() bool {
		if f.count(`SELECT count(*) FROM crdbwork_sessions`) != len(names) {
			return false
		}
		for _, n := range names {
			id := f.session(n)
			if id == uuid.Nil || not[id] {
				return false
			}
			if slices.Contains(holders, n) &&
				f.count(`SELECT count(*) FROM crdbwork_session_parts WHERE session_id = $1 AND queue = $2`, id, upgradeQueue) < 1 {
				return false
			}
			got[n] = id
		}
		return true
	})
	return got
}

// enqueue enqueues n items into the queue with bin's `demo enqueue`. This
// code's enqueue gives them kinds (claim.NewItem.Kind), which the previous
// release's workers, which know nothing of kinds, run as any item.
func (f *mixedFleet) enqueue(bin string, n int) {
	f.t.Helper()
	args := []string{"enqueue", "--queue", upgradeQueue, "--count", strconv.Itoa(n)}
	if bin == demoBin {
		args = append(args, "--kinds", "3")
	}
	mustRun(f.t, bin, f.env, args...)
	f.items += n
}

// drained waits until no item of the queue is left.
func (f *mixedFleet) drained() {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("every item of %q to end", upgradeQueue), func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE queue = $1`, upgradeQueue) == 0
	})
}

// round enqueues a batch with each binary once the named workers have
// settled (each with a live session, the holders each with a part),
// waits until it is done, and checks that every holder acked some of it.
//
// Not every old worker is a holder: a previous-release worker that starts
// a new session while this code's workers hold the queue's parts takes
// parts only as they come free. This code leaves such a session exactly
// the parts it holds (it cannot know which queue a session that owns
// nothing works, and a part left to a session that never takes it would
// have no owner), so it may wait, idle but running, until the new workers
// stop (the last round of TestRollingUpgradeMixedFleet).
func (f *mixedFleet) round(what string, bins, names, holders []string, not map[uuid.UUID]bool) map[string]uuid.UUID {
	f.t.Helper()
	sessions := f.settled(names, holders, not)
	for _, bin := range bins {
		f.enqueue(bin, 200)
	}
	f.drained()
	for _, n := range holders {
		if got := f.count(`SELECT count(*) FROM demo_results WHERE session_id = $1`, sessions[n]); got < 1 {
			f.t.Fatalf("%s: worker %s (session %s) acked none of the batch\n%s", what, n, sessions[n], f.describe())
		}
	}
	f.t.Logf("%s: every worker of %v acked items of the batch", what, holders)
	return sessions
}

// loseSessions deletes the named workers' session rows, as a peer does
// with an expired session, and returns the deleted ids.
func (f *mixedFleet) loseSessions(names ...string) map[uuid.UUID]bool {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `DELETE FROM crdbwork_sessions WHERE name = ANY($1) RETURNING id`, names)
	if err != nil {
		f.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) != len(names) {
		f.t.Fatalf("deleted sessions %v of %v: %v", ids, names, err)
	}
	gone := map[uuid.UUID]bool{}
	for _, id := range ids {
		gone[id] = true
	}
	return gone
}

// kill SIGKILLs the named worker and waits for it to exit; its session
// row stays until its peers find it expired.
func (f *mixedFleet) kill(name string) uuid.UUID {
	f.t.Helper()
	f.mu.Lock()
	w := f.workers[name]
	w.expected = true
	f.mu.Unlock()
	id := f.session(name)
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		f.t.Fatal(err)
	}
	<-w.exited
	return id
}

// terminate stops the named worker with SIGTERM (a graceful stop, which
// deletes its session) and waits for it to exit.
func (f *mixedFleet) terminate(name string) {
	f.t.Helper()
	f.mu.Lock()
	w := f.workers[name]
	w.expected = true
	f.mu.Unlock()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		f.t.Fatal(err)
	}
	<-w.exited
}

// workerReport is the last line `demo work --json` writes on stderr.
type workerReport struct {
	Sessions     int64            `json:"sessions"`
	SessionsLost int64            `json:"sessions_lost"`
	Acked        int64            `json:"acked"`
	Retries      map[string]int64 `json:"retries"`
	Error        string           `json:"error"`
}

// stop stops every running worker with SIGTERM and returns their reports.
func (f *mixedFleet) stop() map[string]workerReport {
	f.t.Helper()
	f.checkAlive()
	f.mu.Lock()
	var running []*fleetWorker
	for _, w := range f.workers {
		if !w.expected {
			w.expected = true
			running = append(running, w)
		}
	}
	f.mu.Unlock()
	for _, w := range running {
		w.cmd.Process.Signal(syscall.SIGTERM)
	}
	reports := map[string]workerReport{}
	for _, w := range running {
		await.Recv(f.t, w.name+" to stop after SIGTERM", w.exited, await.Show(func() string { return lastLines(w.stderr.String(), 10) }))
		if code := w.cmd.ProcessState.ExitCode(); code != 0 {
			f.t.Errorf("%s (%s) exited with status %d\n%s", w.name, filepath.Base(w.bin), code, lastLines(w.stderr.String(), 10))
		}
		lines := strings.Split(strings.TrimSpace(w.stderr.String()), "\n")
		var r workerReport
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			f.t.Fatalf("%s: the last line of stderr is not its JSON report: %v\n%s", w.name, err, lastLines(w.stderr.String(), 10))
		}
		if r.Error != "" {
			f.t.Errorf("%s (%s) ended with an error: %s", w.name, filepath.Base(w.bin), r.Error)
		}
		reports[w.name] = r
	}
	return reports
}

// exactlyOnce checks that every item enqueued into the queue was acked
// exactly once (one row in demo_results), none is left and none died, and
// that both versions' `demo verify` agree.
func (f *mixedFleet) exactlyOnce(bins ...string) {
	f.t.Helper()
	t := f.t
	if n := f.count(`SELECT count(*) FROM demo_enqueued`); n != f.items {
		t.Errorf("demo_enqueued holds %d ids, want the %d enqueued", n, f.items)
	}
	if n := f.count(`SELECT count(*) FROM demo_results`); n != f.items {
		t.Errorf("demo_results holds %d rows, want one for each of the %d items", n, f.items)
	}
	if n := f.count(`SELECT count(*) FROM (SELECT item_id FROM demo_results GROUP BY item_id HAVING count(*) > 1) AS d`); n != 0 {
		t.Errorf("%d items were acked more than once", n)
	}
	if n := f.count(`SELECT count(*) FROM demo_enqueued AS e WHERE NOT EXISTS (SELECT 1 FROM demo_results AS r WHERE r.item_id = e.item_id)`); n != 0 {
		t.Errorf("%d items have no result", n)
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_items`) + f.count(`SELECT count(*) FROM crdbwork_dead_items`); n != 0 {
		t.Errorf("%d items left or dead, want 0", n)
	}
	for _, bin := range bins {
		v := lastJSON(t, mustRun(t, bin, f.env, "verify", "--json"))
		if num(t, v, "enqueued") != float64(f.items) || num(t, v, "acked") != float64(f.items) ||
			num(t, v, "duplicates") != 0 || num(t, v, "lost") != 0 {
			t.Errorf("%s verify: %v; want all %d items acked once", filepath.Base(bin), v, f.items)
		}
	}
}

// wantSchema checks the version row: the schema's version and the oldest
// code version it serves.
func wantSchema(t *testing.T, pool *pgxpool.Pool, version, serves int64) {
	t.Helper()
	v, s, err := crsql.Installed(context.Background(), pool, crsql.Tables{})
	if err != nil || v != version || s != serves {
		t.Fatalf("schema version %d serving %d (%v), want %d serving %d", v, s, err, version, serves)
	}
}

// TestRollingUpgradeMixedFleet: on a database at the current schema,
// workers of the previous release and of this code work one queue side by
// side, fed by both versions' `demo enqueue` (this code's gives its items
// kinds, which the old workers run as any item; in the last rounds they
// work alone). The old workers lose their
// sessions (their rows deleted, twice, once with items in their hands) and
// one is SIGKILLed and restarted: each time they start a new session and
// work on, none exits, and every item is acked exactly once.
func TestRollingUpgradeMixedFleet(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	url := testschema.NewURL(t)
	f := newFleet(t, url)
	f.demoTables()
	wantSchema(t, f.pool, crsql.Version, crsql.Serves)
	mustRun(t, previousOps(t), f.env, opsArgs("parts", "--queue", upgradeQueue, "--set", "8")...)
	bins := []string{old, demoBin}
	names := []string{"old-1", "old-2", "new-1", "new-2"}
	oldNames, newNames := names[:2], names[2:]

	// The old workers hold the queue first, as in a real rollout; this
	// code's workers then take the parts the old ones give up.
	f.start(old, "old-1")
	f.start(old, "old-2")
	f.settled(oldNames, oldNames, nil)
	f.start(demoBin, "new-1")
	f.start(demoBin, "new-2")
	f.round("old and new workers together", bins, names, names, nil)

	// Session loss: the old workers' rows are deleted; each starts a new
	// session (which must accept the newer schema) and works on.
	gone := f.loseSessions("old-1", "old-2")
	f.round("after the old workers lost their sessions", bins, names, newNames, gone)

	// SIGKILL and restart of an old worker: the new process's session
	// starts on the newer schema; the dead one's row expires.
	killed := f.kill("old-2")
	f.start(old, "old-2")
	f.round("after an old worker was killed and restarted", bins, names, newNames, map[uuid.UUID]bool{killed: true})

	// The new workers stop: the old ones, each on a session started after
	// the upgrade, take every part and work the queue alone.
	for _, n := range newNames {
		f.terminate(n)
	}
	f.round("old workers alone after the new ones stopped", bins, oldNames, oldNames, nil)

	// Session loss with items in an old worker's hands: its acks of them
	// are refused, others take them over, none is acked twice.
	f.enqueue(old, 2000)
	id := f.session("old-1")
	f.waitFor("old-1 to hold claims", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, id) > 0
	})
	gone = f.loseSessions("old-1")
	f.drained()
	f.round("after old-1 lost its session with items claimed", bins, oldNames, oldNames, gone)

	reports := f.stop()
	for n, r := range reports {
		t.Logf("%s: %+v", n, r)
	}
	if r := reports["old-1"]; r.Sessions < 3 || r.SessionsLost < 2 {
		t.Errorf("old-1 reports %d sessions, %d lost; want at least 3 and 2 (its rows were deleted twice)", r.Sessions, r.SessionsLost)
	}
	f.exactlyOnce(bins...)
	wantSchema(t, f.pool, crsql.Version, crsql.Serves)
}

// TestUpgradeUnderPreviousReleaseWorkers: a database created by the
// previous release's `demo migrate` is upgraded by this code's while that
// release's workers run and hold claims; they work on through session
// losses and a restart, beside a worker of this code, and every item is
// acked exactly once. The previous release's migrate run again on
// the upgraded database changes nothing.
func TestUpgradeUnderPreviousReleaseWorkers(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	url := testdb.NewURL(t)
	f := newFleet(t, url)
	mustRun(t, previousOps(t), f.env, opsArgs("migrate")...)
	wantSchema(t, f.pool, crsql.Version-1, previousServes)
	mustRun(t, previousOps(t), f.env, opsArgs("parts", "--queue", upgradeQueue, "--set", "8")...)
	oldNames := []string{"old-1", "old-2"}
	f.start(old, "old-1")
	f.start(old, "old-2")
	f.round("old workers on the old schema", []string{old}, oldNames, oldNames, nil)

	// The upgrade, with claims held.
	f.enqueue(old, 2000)
	f.waitFor("the old workers to hold claims", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`) > 0
	})
	r := mustRun(t, crdbworkBin, f.env, "migrate")
	for _, want := range []string{fmt.Sprintf("from version %d to %d", crsql.Version-1, crsql.Version),
		fmt.Sprintf("serves code of version %d and newer", crsql.Serves)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("migrate does not say %q:\n%s", want, r.stdout)
		}
	}
	wantSchema(t, f.pool, crsql.Version, crsql.Serves)
	var m struct {
		Version int64 `json:"schema_version"`
		Serves  int64 `json:"serves"`
	}
	jsonOut(t, runBin(t, crdbworkBin, f.env, "migrate", "--json"), &m)
	if m.Version != crsql.Version || m.Serves != crsql.Serves {
		t.Errorf("migrate --json: version %d serving %d, want %d serving %d", m.Version, m.Serves, crsql.Version, crsql.Serves)
	}
	f.drained()

	// Session losses on the upgraded schema, and a restart.
	gone := f.loseSessions("old-1", "old-2")
	f.round("old workers after losing their sessions on the upgraded schema", []string{old, demoBin}, oldNames, oldNames, gone)
	killed := f.kill("old-1")
	f.start(old, "old-1")
	f.start(demoBin, "new-1")
	all := []string{"old-1", "old-2", "new-1"}
	f.round("a restarted old worker beside an old and a new one", []string{old, demoBin}, all, []string{"old-2", "new-1"}, map[uuid.UUID]bool{killed: true})

	// The previous release's migrate on the upgraded schema: it finds the
	// version it knows and applies its own file again, which must leave
	// the newer schema and its version row as they are.
	mustRun(t, previousOps(t), f.env, opsArgs("migrate")...)
	wantSchema(t, f.pool, crsql.Version, crsql.Serves)
	if err := crsql.Check(context.Background(), f.pool, crsql.Tables{}); err != nil {
		t.Fatalf("after the old migrate: %v", err)
	}
	f.round("after the old migrate ran again", []string{old, demoBin}, all, []string{"old-2", "new-1"}, map[uuid.UUID]bool{killed: true})

	reports := f.stop()
	for n, r := range reports {
		t.Logf("%s: %+v", n, r)
	}
	if r := reports["old-2"]; r.Sessions < 2 || r.SessionsLost < 1 {
		t.Errorf("old-2 reports %d sessions, %d lost; want at least 2 and 1", r.Sessions, r.SessionsLost)
	}
	f.exactlyOnce(old, demoBin)
}

// TestPreviousReleaseOperatorCommands: the previous release's operator
// commands on the current schema. Its reaper dead-letters expired items
// into the dead items keyed per death; its `dead`, `status` and `cancel`
// work; its `requeue` requeues an id that died once and refuses, without
// losing anything, one that died twice (a state only this code creates),
// and so does its `requeue --all`, which stops there.
func TestPreviousReleaseOperatorCommands(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	url := testschema.NewURL(t)
	f := newFleet(t, url)
	f.demoTables()
	ctx := context.Background()

	// Items that expire at once, dead-lettered by an old worker's reaper.
	const n = 20
	mustRun(t, old, f.env, "enqueue", "--queue", upgradeQueue, "--count", strconv.Itoa(n), "--ttl", "1ms", "--parts", "4")
	f.start(old, "old-reaper")
	f.waitFor("the old worker to dead-letter the expired items", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1 AND reason = 'expired'`, upgradeQueue) == n
	})
	f.stop()
	rows, err := f.pool.Query(ctx, `SELECT id FROM crdbwork_dead_items WHERE queue = $1 ORDER BY id`, upgradeQueue)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil || len(ids) != n {
		t.Fatalf("%d dead ids (%v), want %d", len(ids), err, n)
	}
	twice, once := ids[0], ids[1]
	// A second death of the same id, as this code records when an id
	// enqueued again dies again; the newest death, listed first.
	if _, err := f.pool.Exec(ctx, `INSERT INTO crdbwork_dead_items
    (id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, last_error, enqueued_at, claim_token, tenant, reason)
SELECT id, queue, part, item_key, priority, attempts, max_attempts, payload, metadata, 'died again', enqueued_at, claim_token, tenant, 'permanent'
FROM crdbwork_dead_items WHERE id = $1`, twice); err != nil {
		t.Fatal(err)
	}
	// Nothing is lost: every id is in the items or the dead items.
	twiceDeaths := 2 // the deaths of twice still in the dead items
	accounted := func(what string) {
		t.Helper()
		q := `SELECT count(*) FROM unnest($1::UUID[]) AS v (id)
WHERE NOT EXISTS (SELECT 1 FROM crdbwork_items AS i WHERE i.id = v.id)
  AND NOT EXISTS (SELECT 1 FROM crdbwork_dead_items AS d WHERE d.id = v.id)`
		if lost := f.count(q, ids); lost != 0 {
			t.Fatalf("after %s: %d items are neither queued nor dead", what, lost)
		}
		if d := f.count(`SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, twice); d != twiceDeaths {
			t.Fatalf("after %s: the id that died twice has %d deaths, want %d", what, d, twiceDeaths)
		}
	}
	accounted("the second death")

	var dead struct {
		Total int `json:"total"`
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	jsonOut(t, runBin(t, previousOps(t), f.env, opsArgs("dead", "--queue", upgradeQueue, "--json", "--limit", "100")...), &dead)
	if dead.Total != n+1 || len(dead.Items) != n+1 {
		t.Errorf("old dead: total %d, %d listed; want every death, %d", dead.Total, len(dead.Items), n+1)
	}
	var st struct {
		Queue string `json:"queue"`
	}
	jsonOut(t, runBin(t, previousOps(t), f.env, opsArgs("status", "--queue", upgradeQueue, "--json")...), &st)
	if st.Queue != upgradeQueue {
		t.Errorf("old status --json names queue %q, want %q", st.Queue, upgradeQueue)
	}

	// An id that died once is requeued.
	r := runBin(t, previousOps(t), f.env, opsArgs("requeue", once.String(), "--queue", upgradeQueue)...)
	if r.code != 0 || f.count(`SELECT count(*) FROM crdbwork_items WHERE id = $1`, once) != 1 ||
		f.count(`SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, once) != 0 {
		t.Fatalf("old requeue of an id that died once: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	accounted("requeueing an id that died once")

	if previousRelease.ops == old {
		// A release before 0.4 (operator commands in the demo, deaths not
		// yet told apart by its requeue). An id that died twice: both
		// deaths would become one item; refused.
		wantExit(t, runBin(t, old, f.env, "requeue", twice.String(), "--queue", upgradeQueue), 1, "duplicate key")
		if f.count(`SELECT count(*) FROM crdbwork_items WHERE id = $1`, twice) != 0 {
			t.Errorf("the refused requeue left the id that died twice in the items")
		}
		accounted("requeueing the id that died twice")
		// --all stops at it (the newest death, first), nothing lost.
		wantExit(t, runBin(t, old, f.env, "requeue", "--all", "--queue", upgradeQueue), 1, "requeued 0 items, then")
		accounted("requeue --all")
	} else {
		// Release 0.4 and later requeue an id's newest death and keep the
		// older one among the dead items.
		mustRun(t, previousOps(t), f.env, opsArgs("requeue", twice.String(), "--queue", upgradeQueue)...)
		if f.count(`SELECT count(*) FROM crdbwork_items WHERE id = $1`, twice) != 1 {
			t.Errorf("the requeue of the id that died twice did not put it back")
		}
		twiceDeaths = 1
		accounted("requeueing the id that died twice")
		r := runBin(t, previousOps(t), f.env, opsArgs("requeue", "--all", "--queue", upgradeQueue)...)
		t.Logf("requeue --all: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		accounted("requeue --all")
		// Every id that died once is back in the items; only twice's
		// older death may remain dead (its id is live again).
		if left := f.count(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1 AND id <> $2`, upgradeQueue, twice); left != 0 {
			t.Errorf("requeue --all left %d deaths of ids that died once", left)
		}
	}

	// Cancel of the requeued item.
	mustRun(t, previousOps(t), f.env, opsArgs("cancel", once.String(), "--queue", upgradeQueue)...)
	if f.count(`SELECT count(*) FROM crdbwork_items WHERE id = $1`, once) != 0 {
		t.Errorf("old cancel left the item")
	}
	wantSchema(t, f.pool, crsql.Version, crsql.Serves)
}

// TestMixedFleetLimit: a queue's fleet-wide limit (at most 5 in flight)
// holds across a fleet of two workers of the previous release and two of
// this code, 8 handlers each, recording every handler run's start and end
// (database clock), while an old worker is SIGKILLed and restarted (a
// killed process's unfinished runs end at its kill). Every worker's share
// counts: the sessions of one version must not take the whole limit among
// themselves beside those of the other.
func TestMixedFleetLimit(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	const items, limit = 600, 5
	f := newFleet(t, testschema.NewURL(t))
	f.demoTables()
	mustRun(t, previousOps(t), f.env, opsArgs("parts", "--queue", upgradeQueue, "--set", "8")...)
	mustRun(t, previousOps(t), f.env, opsArgs("limit", "--queue", upgradeQueue, "--max-in-flight", strconv.Itoa(limit))...)
	extra := []string{"--concurrency", "8", "--task-time", "20ms", "--record-runs"}
	names := []string{"old-1", "old-2", "new-1", "new-2"}
	// The old workers first: this code's workers leave a previous-release
	// session exactly the parts it holds (see round), so old workers that
	// start after the new ones hold every part may wait idle.
	for _, n := range names {
		bin := demoBin
		if strings.HasPrefix(n, "old") {
			bin = old
		}
		f.start(bin, n, extra...)
		if n == "old-2" {
			f.settled(names[:2], names[:2], nil)
		}
	}
	f.settled(names, names, nil)
	f.enqueue(old, items/2)
	f.enqueue(demoBin, items/2)
	f.waitFor("a third of the results", func() bool {
		return f.count(`SELECT count(*) FROM demo_results`) >= items/3
	})
	f.mu.Lock()
	pid := f.workers["old-1"].cmd.Process.Pid
	f.mu.Unlock()
	f.kill("old-1")
	var killedAt time.Time
	if err := f.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&killedAt); err != nil {
		t.Fatal(err)
	}
	f.start(old, "old-1", extra...)
	f.drained()
	f.stop()
	f.exactlyOnce(old, demoBin)

	rows, err := f.pool.Query(context.Background(), `SELECT pid, started_at, COALESCE(ended_at, $1) FROM demo_runs`, killedAt)
	if err != nil {
		t.Fatal(err)
	}
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	for rows.Next() {
		var p int64
		var start, end time.Time
		if err := rows.Scan(&p, &start, &end); err != nil {
			t.Fatal(err)
		}
		if end.Equal(killedAt) && p != int64(pid) {
			t.Fatalf("a run of process %d has no end, and only process %d was killed", p, pid)
		}
		events = append(events, event{start, 1}, event{end, -1})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Ends sort before starts at the same instant.
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	for _, e := range events {
		cur += e.delta
		most = max(most, cur)
	}
	t.Logf("%d handler runs, at most %d at once (limit %d)", len(events)/2, most, limit)
	if len(events)/2 < items {
		t.Errorf("%d runs recorded for %d items", len(events)/2, items)
	}
	if most > limit {
		t.Errorf("%d handler runs at once across the old and new workers; the limit is %d", most, limit)
	}
}

// TestPreviousReleaseBuilds: the previous release's demo is built from
// history and runs; its version is logged, so that a failure of the other
// tests names what ran.
func TestPreviousReleaseBuilds(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	r := mustRun(t, old, demoEnv(), "--version")
	t.Logf("previous release: commit %s, %s", previousRelease.commit, strings.TrimSpace(r.stdout))
	if !strings.Contains(r.stdout, "crdbwork demo") {
		t.Errorf("--version of the previous release: %q", r.stdout)
	}
}
