// Package dbserver starts a throwaway database server in a temporary
// directory: CockroachDB when a cockroach binary is available, otherwise
// PostgreSQL from server binaries installed on the machine. It backs the
// test helper (internal/testdb) and the demo's embedded default database.
//
// A started server belongs to the process that started it. Stop ends it and
// removes its directory; if the process dies without calling Stop (a panic,
// a test timeout, a signal), a small watchdog process notices and does the
// same, and the CockroachDB process additionally gets SIGKILL from the
// kernel (Pdeathsig).
package dbserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Kind names a database engine.
type Kind string

const (
	// Cockroach is CockroachDB, started with `cockroach start-single-node`.
	Cockroach Kind = "cockroach"
	// Postgres is PostgreSQL, started with initdb and pg_ctl.
	Postgres Kind = "postgres"
)

// ErrNoServer is returned (wrapped) by Start when no database server binary
// can be found. Its message lists the ways to give the program a database.
var ErrNoServer = errors.New("no database server available; give one in any of these ways: " +
	"set DATABASE_URL (or TEST_DATABASE_URL for tests) to a CockroachDB or PostgreSQL URL; " +
	"put a `cockroach` binary on PATH or set COCKROACH_BINARY to its path; " +
	"set CRDBWORK_DOWNLOAD_COCKROACH=1 to download CockroachDB (needs network); " +
	"or install PostgreSQL server binaries (e.g. `apt-get install postgresql`)")

// Options configures Start.
type Options struct {
	// Logf, if set, receives progress lines ("starting PostgreSQL 15 from
	// /usr/lib/postgresql/15/bin in /tmp/...").
	Logf func(format string, args ...any)
	// Prefer, if set, restricts the search to one kind.
	Prefer Kind
	// Download lets Start download CockroachDB (DownloadCockroach) when no
	// cockroach binary is found, instead of falling back to PostgreSQL.
	// Setting the environment variable CRDBWORK_DOWNLOAD_COCKROACH=1 does
	// the same. A failed download is an error.
	Download bool
	// Durable starts PostgreSQL with fsync, synchronous_commit and
	// full_page_writes on (its defaults: every commit waits for its WAL
	// to reach the disk) instead of off, for benchmarks of a durable
	// server. CockroachDB ignores it.
	Durable bool
	// MaxConnections is PostgreSQL's max_connections (0: 400). Fleets of
	// many worker processes need more: each opens worker.Connections.
	// CockroachDB ignores it.
	MaxConnections int
}

// defaultStartTimeout bounds Start when its context has no deadline.
const defaultStartTimeout = 3 * time.Minute

// stopTimeout bounds the work of Stop.
const stopTimeout = 90 * time.Second

// Server is a running throwaway database server. Its methods are safe for
// concurrent use.
type Server struct {
	kind      Kind
	dir       string  // temporary directory holding everything; removed by Stop
	base      url.URL // connection URL without a database
	defaultDB string
	logf      func(format string, args ...any)

	stop     func() error // kind-specific; stops the process and removes dir
	stopOnce sync.Once
	stopErr  error

	// Kind-specific restart support (see restart.go). halt stops the server
	// keeping its data; resume starts it again on the same port; restart
	// does both the engine's quickest way.
	halt, resume, restart func(ctx context.Context) error
	restartMu             sync.Mutex // one restart operation at a time
	stopped               bool       // under restartMu: Stop was called
}

// Start finds a database server binary and starts a fresh server in a new
// temporary directory, listening on 127.0.0.1 only. It looks for, in order:
// a cockroach binary (COCKROACH_BINARY, else `cockroach` on PATH, else one
// downloaded earlier into CacheDir), then — when Options.Download or
// CRDBWORK_DOWNLOAD_COCKROACH asks for it — downloads CockroachDB, then
// PostgreSQL server binaries (initdb, pg_ctl and postgres on PATH, else in
// /usr/lib/postgresql/*/bin, highest version first). When none exists it
// returns an error wrapping ErrNoServer. The caller must call Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	switch opts.Prefer {
	case "", Cockroach, Postgres:
	default:
		return nil, fmt.Errorf("dbserver: unknown kind %q (want %q or %q)", opts.Prefer, Cockroach, Postgres)
	}
	// The download, if any, is bounded by ctx alone: it may take minutes.
	startCtx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		startCtx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}

	var searched []string
	if opts.Prefer != Postgres {
		bin, err := findCockroach()
		if err != nil {
			return nil, err
		}
		if bin == "" && (opts.Download || downloadWanted()) {
			if bin, err = DownloadCockroach(ctx, logf); err != nil {
				return nil, err
			}
		}
		if bin != "" {
			return startCockroach(startCtx, bin, logf)
		}
		searched = append(searched, "COCKROACH_BINARY", "cockroach on PATH", "a downloaded cockroach in "+cacheDirShown())
	}
	if opts.Prefer != Cockroach {
		if binDir := findPostgres(); binDir != "" {
			return startPostgres(startCtx, binDir, logf, opts.Durable, opts.MaxConnections)
		}
		searched = append(searched, "initdb/pg_ctl/postgres on PATH")
		searched = append(searched, pgSearchGlobs...)
	}
	return nil, fmt.Errorf("dbserver: looked for %s: %w", strings.Join(searched, ", "), ErrNoServer)
}

// Kind reports which engine the server runs.
func (s *Server) Kind() Kind { return s.kind }

// URL returns a postgres:// URL for the named database on this server. The
// empty name means the server's default database: "defaultdb" on CockroachDB,
// "postgres" on PostgreSQL. The database need not exist yet.
func (s *Server) URL(database string) string {
	if database == "" {
		database = s.defaultDB
	}
	u := s.base
	u.Path = "/" + database
	u.RawPath = ""
	return u.String()
}

// CreateDatabase creates a database with the given name (used verbatim as a
// quoted identifier, so case and punctuation are kept) and returns its URL.
func (s *Server) CreateDatabase(ctx context.Context, name string) (url string, err error) {
	if name == "" {
		return "", errors.New("dbserver: CreateDatabase: empty database name")
	}
	conn, err := pgx.Connect(ctx, s.URL(""))
	if err != nil {
		return "", fmt.Errorf("dbserver: CreateDatabase %q: connect: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("dbserver: CreateDatabase %q: %w", name, err)
	}
	return s.URL(name), nil
}

// Stop stops the server process and its children and removes the server's
// temporary directory. When it returns without error the server no longer
// accepts connections. It is safe to call more than once; later calls
// return the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.restartMu.Lock()
		s.stopped = true
		s.restartMu.Unlock()
		s.stopErr = s.stop()
		if s.stopErr == nil {
			s.logf("stopped %s server in %s", s.kind, s.dir)
		}
	})
	return s.stopErr
}

// ping connects to rawURL and pings the server.
func ping(ctx context.Context, rawURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, rawURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// poll calls cond every interval until it reports done, returns an error, or
// ctx ends.
func poll(ctx context.Context, interval time.Duration, cond func() (done bool, err error)) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}

// waitPortClosed waits until nothing accepts TCP connections at hostport.
func waitPortClosed(ctx context.Context, hostport string) error {
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		c, err := net.DialTimeout("tcp", hostport, time.Second)
		if err != nil {
			return true, nil
		}
		c.Close()
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("server still accepts connections at %s: %w", hostport, err)
	}
	return nil
}

// tailFile returns at most the last maxLines lines of the file at path,
// starting no earlier than byte offset from.
func tailFile(path string, from int64, maxLines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if from > 0 && from <= int64(len(data)) {
		data = data[from:]
	}
	const maxBytes = 8 << 10
	if len(data) > maxBytes {
		data = data[len(data)-maxBytes:]
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}
