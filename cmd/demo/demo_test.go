package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// demoBin is the demo binary built by TestMain; crdbworkBin is the
// operator command (cmd/crdbwork), built beside it: the tests operate the
// demo's queues with it, as an operator would.
var demoBin, crdbworkBin string

func TestMain(m *testing.M) {
	bins, err := testdb.Build("demo", map[string]string{".": "demo", "../crdbwork": "crdbwork"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	demoBin, crdbworkBin = bins["."], bins["../crdbwork"]
	testdb.Main(m)
}

// demoEnv is the environment of the demo processes: this process's, without
// the variables the demo and crdbwork read, so that only the test's flags
// count — but for the fault model's (testdb.FaultEnviron: workers without
// LISTEN, as on CockroachDB), which extra can override.
func demoEnv(extra ...string) []string {
	return testdb.Environ([]string{"DATABASE_URL=", "DEMO_", "CRDBWORK_"}, append(testdb.FaultEnviron(), extra...)...)
}

type result struct {
	stdout, stderr string
	code           int
}

// demo runs the demo binary with args and waits for it (at most timeout).
func demo(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	return runProgram(t, demoBin, timeout, env, args...)
}

// op runs the operator command (crdbwork) with args in the demo's env, as
// the demo's operator commands ran before 0.4: on queue "demo" unless args
// or DEMO_QUEUE name another (DEMO_QUEUE is passed as CRDBWORK_QUEUE), and
// on the demo's default tables. migrate and status of all queues take no
// queue.
func op(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	env, args = opArgs(env, args)
	return runProgram(t, crdbworkBin, timeout, env, args...)
}

// opArgs translates a demo environment and an operator command's arguments
// for crdbwork (see op).
func opArgs(env, args []string) ([]string, []string) {
	if env == nil {
		env = demoEnv()
	}
	queue := "demo"
	var opEnv []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DEMO_QUEUE="); ok {
			queue = v
			continue
		}
		opEnv = append(opEnv, kv)
	}
	if len(args) > 0 && args[0] != "migrate" && !slices.Contains(args, "--queue") && !slices.Contains(args, "-h") {
		args = append(slices.Clone(args), "--queue", queue)
	}
	return opEnv, args
}

// runProgram runs bin with args in env (nil: demoEnv()) and waits for it
// (at most timeout, stretched with the machine's load: await.Stretch).
func runProgram(t *testing.T, bin string, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	timeout = await.Stretch(timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	if cmd.Env == nil {
		cmd.Env = demoEnv()
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("%s %s: %v\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), err, r.stderr)
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %s: did not finish within %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), timeout, r.stdout, r.stderr)
	}
	return r
}

// lastJSON decodes the last line of stdout as a JSON object.
func lastJSON(t *testing.T, r result) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	last := lines[len(lines)-1]
	var m map[string]any
	if err := json.Unmarshal([]byte(last), &m); err != nil {
		t.Fatalf("last line of stdout is not a JSON object: %v\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}
	return m
}

// num returns a JSON number field.
func num(t *testing.T, m map[string]any, key string) float64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("summary has no number %q: %v", key, m)
	}
	return v
}

func checkSummary(t *testing.T, r result, items int) map[string]any {
	t.Helper()
	s := lastJSON(t, r)
	for key, want := range map[string]float64{"enqueued": float64(items), "acked": float64(items), "duplicates": 0, "lost": 0} {
		if got := num(t, s, key); got != want {
			t.Errorf("%s = %v, want %v\nsummary: %v\nstderr:\n%s", key, got, want, s, r.stderr)
		}
	}
	for _, key := range []string{"elapsed_seconds", "items_per_second", "workers_killed", "workers", "parts", "dead"} {
		num(t, s, key)
	}
	if e, _ := s["engine"].(string); e != "postgres" && e != "cockroach" {
		t.Errorf("engine = %q, want postgres or cockroach", s["engine"])
	}
	if r.code != 0 {
		t.Errorf("exit status %d, want 0\nstderr:\n%s", r.code, r.stderr)
	}
	return s
}

func TestRun(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	r := demo(t, 2*time.Minute, nil, "run", "--database-url", url, "--items", "2000", "--workers", "3", "--json")
	s := checkSummary(t, r, 2000)
	if num(t, s, "workers") != 3 {
		t.Errorf("workers = %v, want 3", s["workers"])
	}
	if strings.Count(strings.TrimSpace(r.stdout), "\n") != 0 {
		t.Errorf("with --json, stdout should hold only the JSON line:\n%s", r.stdout)
	}
}

func TestRunEmbedded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a database server")
	}
	r := demo(t, 3*time.Minute, demoEnv(), "run", "--items", "500", "--json")
	if r.code == 2 && strings.Contains(r.stderr, "no database server available") {
		t.Skipf("no database server binaries on this machine: %s", r.stderr)
	}
	s := checkSummary(t, r, 500)
	if s["embedded"] != true {
		t.Errorf("embedded = %v, want true", s["embedded"])
	}
	if !strings.Contains(r.stderr, "started an embedded") {
		t.Errorf("stderr does not say which engine it started:\n%s", r.stderr)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	empty := testdb.NewURL(t)
	cases := []struct {
		name string
		args []string
		want string // in the message
	}{
		{"unknown flag", []string{"run", "--no-such-flag"}, "unknown flag --no-such-flag"},
		{"unknown flag, no command", []string{"--no-such-flag"}, "unknown flag"},
		{"negative count", []string{"run", "--items", "-5"}, "--items"},
		{"zero workers", []string{"run", "--workers", "0"}, "--workers"},
		{"bad duration", []string{"run", "--task-time", "banana"}, "--task-time"},
		{"malformed URL", []string{"run", "--database-url", "postgres://%zz"}, "invalid database URL"},
		{"unreachable", []string{"run", "--database-url", "postgres://127.0.0.1:1/x"}, "cannot reach the database"},
		{"schema missing", []string{"verify", "--database-url", empty}, "crdbwork migrate"},
		{"no URL", []string{"verify"}, "DATABASE_URL"},
		{"unknown command", []string{"frobnicate"}, "unknown command"},
		{"expiry too short", []string{"work", "--database-url", empty, "--heartbeat", "1s", "--expiry", "1s"}, "--expiry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := demo(t, time.Minute, nil, c.args...)
			if r.code != 2 {
				t.Errorf("exit status %d, want 2\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			msg := strings.TrimRight(r.stderr, "\n")
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "demo: ") {
				t.Errorf("want one line starting with \"demo: \" on stderr, got:\n%s", r.stderr)
			}
			if !strings.Contains(msg, c.want) {
				t.Errorf("message %q does not mention %q", msg, c.want)
			}
			for _, bad := range []string{"goroutine", "panic", "Usage"} {
				if strings.Contains(r.stderr, bad) {
					t.Errorf("stderr shows %q:\n%s", bad, r.stderr)
				}
			}
		})
	}
	t.Run("env value", func(t *testing.T) {
		r := demo(t, time.Minute, demoEnv("DEMO_ITEMS=many"), "run")
		if r.code != 2 || !strings.Contains(r.stderr, "DEMO_ITEMS") {
			t.Errorf("exit status %d, stderr %q; want 2 and a message naming DEMO_ITEMS", r.code, r.stderr)
		}
	})
	// The operator commands moved to crdbwork in 0.4; their old names stay
	// one version and say where they went, on one line, without echoing the
	// arguments (a URL may hold a password), and change nothing.
	t.Run("moved commands", func(t *testing.T) {
		for _, name := range movedCommands {
			r := demo(t, time.Minute, nil, name, "--database-url", "postgres://u:secret@127.0.0.1:1/x", "--queue", "demo")
			want := fmt.Sprintf("demo %s moved to the crdbwork command: crdbwork %s ... (see `crdbwork %s -h`)\n", name, name, name)
			if r.code != 2 || r.stderr != want || r.stdout != "" {
				t.Errorf("demo %s: exit status %d, stdout %q, stderr %q; want 2 and %q", name, r.code, r.stdout, r.stderr, want)
			}
		}
		if len(movedCommands) != 10 {
			t.Errorf("%d moved commands, want the 10 of 0.3: %v", len(movedCommands), movedCommands)
		}
		r := demo(t, time.Minute, nil, "-h")
		for _, name := range movedCommands {
			if strings.Contains(r.stdout, "\n  "+name+" ") {
				t.Errorf("demo -h still lists %s:\n%s", name, r.stdout)
			}
		}
	})
	t.Run("help", func(t *testing.T) {
		for _, args := range [][]string{{"-h"}, {"run", "-h"}, {"work", "--help"}, {"help", "verify"}} {
			r := demo(t, time.Minute, nil, args...)
			if r.code != 0 || !strings.Contains(r.stdout, "Usage: demo") {
				t.Errorf("demo %v: exit status %d, stdout:\n%s", args, r.code, r.stdout)
			}
		}
		r := demo(t, time.Minute, nil, "run", "-h")
		if !strings.Contains(r.stdout, "DEMO_ITEMS") || !strings.Contains(r.stdout, "DATABASE_URL") {
			t.Errorf("run -h does not document the environment variables:\n%s", r.stdout)
		}
	})
}

func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url) // the URL from the environment
	if r := op(t, time.Minute, env, "migrate"); r.code != 0 {
		t.Fatalf("migrate: exit status %d\n%s", r.code, r.stderr)
	}
	r := demo(t, time.Minute, env, "enqueue", "--count", "500", "--parts", "4", "--json")
	if r.code != 0 || num(t, lastJSON(t, r), "enqueued") != 500 {
		t.Fatalf("enqueue: exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	st := readStatusJSON(t, env)
	if n := len(st.Sessions); n != 0 {
		t.Errorf("%d sessions before any worker, want 0", n)
	}
	if got := backlogItems(st); got != 500 {
		t.Errorf("backlog %d items, want 500", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
	defer cancel()
	work := exec.CommandContext(ctx, demoBin, "work", "--name", "test-worker", "--task-time", "1ms")
	work.Env = env
	var workErr syncBuffer
	work.Stderr = &workErr
	if err := work.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { work.Process.Kill() })

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	await.Until(t, "the worker to work off every item", func() (bool, string) {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM crdbwork_items").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0, fmt.Sprintf("%d items left", n)
	}, await.Show(workErr.String))

	st = readStatusJSON(t, env)
	if len(st.Sessions) != 1 || st.Sessions[0].Name != "test-worker" || st.Sessions[0].Parts != "0-3" {
		t.Errorf("sessions = %+v, want the one worker owning parts 0-3", st.Sessions)
	}
	if got := backlogItems(st); got != 0 {
		t.Errorf("backlog %d items after the work, want 0", got)
	}
	if r := op(t, time.Minute, env, "status"); r.code != 0 || !strings.Contains(r.stdout, "test-worker") {
		t.Errorf("status: exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	if err := work.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := work.Wait(); err != nil {
		t.Fatalf("work after SIGTERM: %v\nstderr:\n%s", err, workErr.String())
	}
	if !strings.Contains(workErr.String(), "acked 500") {
		t.Errorf("work's final line does not report 500 acks:\n%s", workErr.String())
	}
	if st := readStatusJSON(t, env); len(st.Sessions) != 0 {
		t.Errorf("%d sessions after a graceful stop, want 0", len(st.Sessions))
	}

	r = demo(t, time.Minute, env, "verify", "--json")
	if r.code != 0 {
		t.Fatalf("verify: exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	v := lastJSON(t, r)
	if num(t, v, "enqueued") != 500 || num(t, v, "acked") != 500 || num(t, v, "lost") != 0 || num(t, v, "duplicates") != 0 {
		t.Errorf("verify = %v", v)
	}

	// A duplicated result makes verify fail.
	if _, err := conn.Exec(ctx, `INSERT INTO demo_results (item_id, session_id, part, attempt)
		SELECT item_id, session_id, part, attempt FROM demo_results LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	r = demo(t, time.Minute, env, "verify")
	if r.code != 1 || !strings.Contains(r.stdout, "duplicates  1") {
		t.Errorf("verify with a duplicate: exit status %d, want 1\nstdout:\n%s", r.code, r.stdout)
	}
}

type statusOut struct {
	Sessions []struct {
		Name  string `json:"name"`
		Parts string `json:"parts"`
	} `json:"sessions"`
	Backlog []struct {
		Unclaimed int `json:"unclaimed"`
		Claimed   int `json:"claimed"`
	} `json:"backlog"`
	NumParts int `json:"num_parts"`
}

func readStatusJSON(t *testing.T, env []string) statusOut {
	t.Helper()
	r := op(t, time.Minute, env, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status: exit status %d\nstderr:\n%s", r.code, r.stderr)
	}
	var st statusOut
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	if st.NumParts != 4 {
		t.Errorf("num_parts = %d, want 4", st.NumParts)
	}
	return st
}

func backlogItems(st statusOut) int {
	n := 0
	for _, b := range st.Backlog {
		n += b.Unclaimed + b.Claimed
	}
	return n
}

func TestFlagsFromEnvironment(t *testing.T) {
	parse := func(args ...string) runConfig {
		t.Helper()
		var c runConfig
		f := prog.NewFlagSet("run", "")
		c.common.register(f, "")
		f.IntVar(&c.items, "items", 10, 1, 100, "")
		c.workerSettings.register(f, "")
		if err := f.Parse(args, io.Discard); err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Setenv("DEMO_ITEMS", "7")
	t.Setenv("DEMO_TASK_TIME", "3ms")
	t.Setenv("DATABASE_URL", "postgres://env/db")
	c := parse()
	if c.items != 7 || c.taskTime != 3*time.Millisecond || c.databaseURL != "postgres://env/db" {
		t.Errorf("from the environment: items %d, task time %v, URL %q", c.items, c.taskTime, c.databaseURL)
	}
	c = parse("--items", "9", "--database-url", "postgres://flag/db")
	if c.items != 9 || c.databaseURL != "postgres://flag/db" || c.taskTime != 3*time.Millisecond {
		t.Errorf("a flag must win over its variable: items %d, URL %q, task time %v", c.items, c.databaseURL, c.taskTime)
	}
}
