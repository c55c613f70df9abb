package dbserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/await"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	opts.Logf = t.Logf
	begin := time.Now()
	s, err := Start(testCtx(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %v", time.Since(begin))
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}

func connect(t *testing.T, rawURL string) *pgx.Conn {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		t.Fatalf("connect %s: %v", rawURL, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// hostPort returns the host:port of a postgres URL.
func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// waitRefused waits until nothing listens at hostport.
func waitRefused(t *testing.T, hostport string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(within))
	defer cancel()
	if err := waitPortClosed(ctx, hostport); err != nil {
		t.Fatal(err)
	}
}

func waitGone(t *testing.T, path string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(within))
	defer cancel()
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		_, err := os.Stat(path)
		return errors.Is(err, fs.ErrNotExist), nil
	})
	if err != nil {
		t.Fatalf("%s still exists: %v", path, err)
	}
}

func TestStartCreateIsolateStop(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testCtx(t)
	if s.Kind() != Cockroach && s.Kind() != Postgres {
		t.Fatalf("Kind() = %q", s.Kind())
	}
	if !strings.Contains(s.URL(""), "sslmode=disable") {
		t.Errorf("URL(\"\") = %s, want sslmode=disable", s.URL(""))
	}

	begin := time.Now()
	urlA, err := s.CreateDatabase(ctx, "iso_a")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CreateDatabase took %v", time.Since(begin))
	// A name that needs quoting and URL escaping.
	const oddName = `Odd Name-"x"/y`
	urlB, err := s.CreateDatabase(ctx, oddName)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateDatabase(ctx, "iso_a"); err == nil {
		t.Error("creating an existing database succeeded")
	}

	a, b := connect(t, urlA), connect(t, urlB)
	var name string
	if err := b.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil || name != oddName {
		t.Fatalf("current_database() = %q, %v; want %q", name, err, oddName)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE probe (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "INSERT INTO probe VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	var n int
	err = b.QueryRow(ctx, "SELECT count(*) FROM probe").Scan(&n)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("table from database A visible in B: err=%v", err)
	}
	a.Close(ctx)
	b.Close(ctx)

	addr := hostPort(t, s.URL(""))
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if conn, err := pgx.Connect(ctx, s.URL("")); err == nil {
		conn.Close(ctx)
		t.Fatal("connection succeeded after Stop")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts TCP connections after Stop", addr)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temp dir %s not removed: %v", s.dir, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// Not parallel: it replaces pickPort, which every Start calls (parallel
// tests run after the sequential ones).
func TestPortClashRetried(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	calls := 0
	pickPort = func() (int, error) {
		calls++
		if calls == 1 {
			return busy.Addr().(*net.TCPAddr).Port, nil
		}
		return freePort()
	}
	t.Cleanup(func() { pickPort = freePort })
	s := startServer(t, Options{Prefer: Postgres})
	if calls != 2 {
		t.Fatalf("picked a port %d times, want 2", calls)
	}
	if hostPort(t, s.URL("")) == busy.Addr().String() {
		t.Fatal("server URL names the busy port")
	}
}

func TestNoServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("COCKROACH_BINARY", "")
	t.Setenv(CacheDirEnv, t.TempDir())
	t.Setenv(DownloadEnv, "")
	old := pgSearchGlobs
	pgSearchGlobs = []string{filepath.Join(t.TempDir(), "*", "bin")}
	t.Cleanup(func() { pgSearchGlobs = old })

	for _, prefer := range []Kind{"", Cockroach, Postgres} {
		_, err := Start(testCtx(t), Options{Prefer: prefer})
		if !errors.Is(err, ErrNoServer) {
			t.Fatalf("Prefer %q: err = %v, want ErrNoServer", prefer, err)
		}
		for _, want := range []string{"DATABASE_URL", "TEST_DATABASE_URL", "COCKROACH_BINARY", "PATH", DownloadEnv, "apt-get install postgresql"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	}
	if _, err := Start(testCtx(t), Options{Prefer: "mysql"}); err == nil || errors.Is(err, ErrNoServer) {
		t.Errorf("unknown kind: err = %v", err)
	}
	t.Setenv("COCKROACH_BINARY", filepath.Join(t.TempDir(), "missing"))
	if _, err := Start(testCtx(t), Options{}); err == nil || errors.Is(err, ErrNoServer) {
		t.Errorf("bad COCKROACH_BINARY: err = %v, want an error naming it", err)
	}
}

func TestFindPostgresOrder(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "10", "17"} {
		dir := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if v == "17" {
			continue // incomplete install: must be skipped
		}
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("PATH", t.TempDir())
	old := pgSearchGlobs
	pgSearchGlobs = []string{filepath.Join(root, "*", "bin")}
	t.Cleanup(func() { pgSearchGlobs = old })
	if got, want := findPostgres(), filepath.Join(root, "10", "bin"); got != want {
		t.Fatalf("findPostgres() = %q, want %q", got, want)
	}
}

// fakeCockroach writes a stand-in cockroach binary that records its
// arguments and pid, publishes backendURL (with "defaultdb") in the
// --listening-url-file, and then sleeps. It lets the cockroach code path run
// where no cockroach binary exists.
func fakeCockroach(t *testing.T, backend *Server) (bin, recordFile string) {
	t.Helper()
	ctx := testCtx(t)
	if _, err := backend.CreateDatabase(ctx, "defaultdb"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(backend.URL("defaultdb"))
	if err != nil {
		t.Fatal(err)
	}
	u.RawQuery = "" // the code under test must add sslmode=disable
	dir := t.TempDir()
	bin = filepath.Join(dir, "cockroach")
	recordFile = filepath.Join(dir, "record")
	script := `#!/bin/sh
{ echo "$$"; printf '%s\n' "$@"; } > ` + shellQuote(recordFile) + `
for a; do case "$a" in --listening-url-file=*) f="${a#--listening-url-file=}";; esac; done
printf 'postgresql://' > "$f"   # half written first: the reader must retry
sleep 0.3
printf '%s\n' ` + shellQuote(u.String()) + ` > "$f"
exec sleep 600
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, recordFile
}

func readRecord(t *testing.T, recordFile string) (pid int, args []string) {
	t.Helper()
	data, err := os.ReadFile(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	pid, err = strconv.Atoi(lines[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid, lines[1:]
}

func processGone(pid int) bool {
	err := syscall.Kill(pid, 0)
	if errors.Is(err, syscall.ESRCH) {
		return true
	}
	// A zombie (exited, not yet reaped by an init that does not reap) is gone too.
	data, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if rerr != nil {
		return errors.Is(rerr, fs.ErrNotExist)
	}
	if i := strings.LastIndexByte(string(data), ')'); i >= 0 && i+2 < len(data) {
		return data[i+2] == 'Z'
	}
	return false
}

func waitProcessGone(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(within))
	defer cancel()
	if err := poll(ctx, 50*time.Millisecond, func() (bool, error) { return processGone(pid), nil }); err != nil {
		t.Fatalf("process %d still running: %v", pid, err)
	}
}

func TestCockroachPath(t *testing.T) {
	backend := startServer(t, Options{Prefer: Postgres})
	bin, record := fakeCockroach(t, backend)
	t.Setenv("COCKROACH_BINARY", bin)

	s := startServer(t, Options{})
	if s.Kind() != Cockroach {
		t.Fatalf("Kind() = %q, want cockroach", s.Kind())
	}
	pid, args := readRecord(t, record)
	want := []string{
		"start-single-node",
		"--insecure",
		"--listen-addr=127.0.0.1:0",
		"--http-addr=127.0.0.1:0",
		"--store=path=" + filepath.Join(s.dir, "store"),
		"--listening-url-file=" + filepath.Join(s.dir, "url"),
	}
	if strings.Join(args, " ") != strings.Join(want, " ") {
		t.Errorf("cockroach args = %q, want %q", args, want)
	}
	u, err := url.Parse(s.URL("somedb"))
	if err != nil {
		t.Fatal(err)
	}
	if u.Path != "/somedb" || u.Query().Get("sslmode") != "disable" {
		t.Errorf("URL(somedb) = %s", u)
	}
	if got := s.URL(""); !strings.Contains(got, "/defaultdb?") {
		t.Errorf("URL(\"\") = %s, want database defaultdb", got)
	}
	if _, err := s.CreateDatabase(testCtx(t), "via_fake"); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if !processGone(pid) {
		t.Fatalf("fake cockroach %d still running after Stop", pid)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("temp dir %s not removed: %v", s.dir, err)
	}
}

func TestCockroachExitsEarly(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cockroach")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'ERROR: cannot start: simulated' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COCKROACH_BINARY", bin)
	_, err := Start(testCtx(t), Options{})
	if err == nil || !strings.Contains(err.Error(), "simulated") {
		t.Fatalf("err = %v, want the cockroach output in it", err)
	}
}

// The helper process starts a server, prints where it is, and panics
// without calling Stop, like a test binary that crashes.
const helperEnv = "DBSERVER_TEST_CRASH_HELPER"

func TestCrashHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper for TestServerDoesNotOutliveCrash")
	}
	s, err := Start(context.Background(), Options{})
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("SERVER %s %s\n", s.dir, s.URL(""))
	panic("simulated crash without Stop")
}

func TestServerDoesNotOutliveCrash(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, env ...string) (dir, rawURL string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
		cmd.Env = append(append(os.Environ(), helperEnv+"=1"), env...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 3 && f[0] == "SERVER" {
				dir, rawURL = f[1], f[2]
			}
		}
		err = cmd.Wait()
		if dir == "" {
			t.Fatalf("helper printed no server (exit: %v)", err)
		}
		if err == nil {
			t.Fatal("helper did not crash")
		}
		return dir, rawURL
	}

	t.Run("postgres", func(t *testing.T) {
		dir, rawURL := run(t, "COCKROACH_BINARY=", "PATH=/usr/bin:/bin")
		waitRefused(t, hostPort(t, rawURL), time.Minute)
		waitGone(t, dir, time.Minute)
	})
	t.Run("cockroach", func(t *testing.T) {
		backend := startServer(t, Options{Prefer: Postgres})
		bin, record := fakeCockroach(t, backend)
		dir, _ := run(t, "COCKROACH_BINARY="+bin)
		pid, _ := readRecord(t, record)
		waitProcessGone(t, pid, time.Minute)
		waitGone(t, dir, time.Minute)
	})
}
