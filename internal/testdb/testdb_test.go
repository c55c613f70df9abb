package testdb

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/dbserver"
)

func TestMain(m *testing.M) { Main(m) }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func currentDatabase(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(ctxFor(t), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestIsolation(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	begin := time.Now()
	a := New(t)
	t.Logf("first New (may include server start) took %v", time.Since(begin))
	begin = time.Now()
	b := New(t)
	t.Logf("second New took %v", time.Since(begin))

	nameA, nameB := currentDatabase(t, a), currentDatabase(t, b)
	if nameA == nameB || !strings.HasPrefix(nameA, "crdbwork_test_") || nameA != strings.ToLower(nameA) {
		t.Fatalf("database names %q and %q", nameA, nameB)
	}
	if got := a.Config().MaxConns; got != DefaultMaxConns {
		t.Errorf("MaxConns = %d, want %d", got, DefaultMaxConns)
	}
	var n int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("fresh database has %d tables (err %v)", n, err)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE probe (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "INSERT INTO probe VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	err := b.QueryRow(ctx, "SELECT count(*) FROM probe").Scan(&n)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("table created in %s is visible in %s: err=%v", nameA, nameB, err)
	}
}

func TestNewURL(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	u := NewURL(t)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	if name != cfg.Database {
		t.Fatalf("connected to %q, URL names %q", name, cfg.Database)
	}
}

func TestKind(t *testing.T) {
	t.Parallel()
	k := Kind(t)
	if k != dbserver.Cockroach && k != dbserver.Postgres {
		t.Fatalf("Kind = %q", k)
	}
	var version string
	if err := New(t).QueryRow(ctxFor(t), "SELECT version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if got := strings.Contains(version, "CockroachDB"); got != (k == dbserver.Cockroach) {
		t.Fatalf("Kind = %q but version() = %q", k, version)
	}
	t.Logf("tests run on %s: %s", k, version)
}

func TestParallel(t *testing.T) {
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			pool := New(t)
			ctx := ctxFor(t)
			// The same table name in every database.
			if _, err := pool.Exec(ctx, "CREATE TABLE t (v INT)"); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO t VALUES ($1)", i); err != nil {
				t.Fatal(err)
			}
			var sum int
			if err := pool.QueryRow(ctx, "SELECT sum(v) FROM t").Scan(&sum); err != nil || sum != i {
				t.Fatalf("sum = %d (err %v), want %d", sum, err, i)
			}
		})
	}
}

func TestDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("user", func(t *testing.T) {
		pool := New(t)
		name = currentDatabase(t, pool)
		if _, err := pool.Exec(ctxFor(t), "CREATE TABLE keep_me_busy (id INT)"); err != nil {
			t.Fatal(err)
		}
	})
	// Dropped in the background once the test ended.
	pool := New(t)
	await.Until(t, "the database of the ended test to be dropped", func() (bool, string) {
		var n int
		err := pool.QueryRow(ctxFor(t), "SELECT count(*) FROM pg_catalog.pg_database WHERE datname = $1", name).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0, fmt.Sprintf("%s exists", name)
	})
}

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:p@h:26257/defaultdb?sslmode=disable", "postgres://u:p@h:26257/x_1?sslmode=disable"},
		{"postgresql://u@h", "postgresql://u@h/x_1"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname='x_1'"},
	} {
		got, err := withDatabase(tc.in, "x_1")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if cfg, err := pgx.ParseConfig(got); err != nil || cfg.Database != "x_1" {
			t.Errorf("%q parses to database %q (err %v)", got, cfg.Database, err)
		}
	}
}

// helperEnv makes TestHelperProcess act, in a child test binary.
const helperEnv = "TESTDB_TEST_HELPER"

// TestHelperProcess, run in a child test binary, makes a database, prints
// its URL, and then returns normally or panics as helperEnv says.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper for TestMainStopsServer")
	}
	fmt.Printf("URL %s\n", NewURL(t))
	if mode == "panic" {
		panic("simulated crash")
	}
}

// runHelper runs TestHelperProcess in a child test binary and returns the
// URL it printed and how it exited.
func runHelper(t *testing.T, mode string) (string, error) {
	t.Helper()
	if os.Getenv("TEST_DATABASE_URL") != "" {
		t.Skip("TEST_DATABASE_URL is set: tests do not own the server")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var u string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "URL "); ok {
			u = rest
		}
	}
	err = cmd.Wait()
	if u == "" {
		t.Fatalf("helper printed no URL (exit: %v)", err)
	}
	return u, err
}

func waitNotListening(t *testing.T, rawURL string, within time.Duration) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the server at "+u.Host+" to refuse connections once its test binary exited", func() bool {
		c, err := net.DialTimeout("tcp", u.Host, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, await.Within(within))
	ctx := ctxFor(t)
	if conn, err := pgx.Connect(ctx, rawURL); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a server that should be stopped")
	}
}

func TestMainStopsServer(t *testing.T) {
	t.Parallel()
	u, err := runHelper(t, "return")
	if err != nil {
		t.Fatalf("helper failed: %v", err)
	}
	// Main stops the server before the child exits: no waiting needed.
	waitNotListening(t, u, 0)
}

func TestPanickingTestDoesNotLeakServer(t *testing.T) {
	t.Parallel()
	u, err := runHelper(t, "panic")
	if err == nil {
		t.Fatal("helper did not fail")
	}
	// Main never ran its cleanup; dbserver's watchdog stops the server.
	waitNotListening(t, u, time.Minute)
}

const parallelHelperEnv = "TESTDB_TEST_PARALLEL_HELPER"

// TestParallelHelper, run in a child test binary, prints the parallel
// flag's value.
func TestParallelHelper(t *testing.T) {
	if os.Getenv(parallelHelperEnv) == "" {
		t.Skip("helper for TestMainSetsParallel")
	}
	fmt.Printf("PARALLEL %s\n", flag.Lookup("test.parallel").Value)
}

// Main runs DefaultParallel parallel tests at once unless -parallel is
// given (go test's default would be GOMAXPROCS).
func TestMainSetsParallel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, fmt.Sprint(DefaultParallel)},
		{[]string{"-test.parallel=3"}, "3"},
	} {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestParallelHelper$", "-test.count=1"}, c.args...)...)
		cmd.Env = append(os.Environ(), parallelHelperEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper %v: %v\n%s", c.args, err, out)
		}
		if !strings.Contains(string(out), "PARALLEL "+c.want+"\n") {
			t.Errorf("helper with %v printed %q, want PARALLEL %s", c.args, out, c.want)
		}
	}
}
