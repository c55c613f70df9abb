package dbserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pgSearchGlobs are the directories searched for PostgreSQL server binaries
// when they are not on PATH. A variable so tests can replace it.
var pgSearchGlobs = []string{"/usr/lib/postgresql/*/bin"}

// pgUser is the database superuser created by initdb.
const pgUser = "crdbwork"

// maxPortAttempts bounds the retries when the chosen port is taken between
// choosing it and the server binding it.
const maxPortAttempts = 5

// findPostgres returns a directory holding initdb, pg_ctl and postgres, or "".
func findPostgres() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		// Prefer the real directory when initdb is a symlink into it
		// (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb).
		var dirs []string
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(p))
		for _, d := range dirs {
			if hasPGBinaries(d) {
				return d
			}
		}
	}
	var found []string
	for _, g := range pgSearchGlobs {
		m, _ := filepath.Glob(g)
		found = append(found, m...)
	}
	// Highest version first: .../17/bin before .../9.6/bin.
	sort.SliceStable(found, func(i, j int) bool {
		return versionKey(found[i]) > versionKey(found[j])
	})
	for _, d := range found {
		if hasPGBinaries(d) {
			return d
		}
	}
	return ""
}

// versionKey turns ".../15/bin" or ".../9.6/bin" into a sortable number.
func versionKey(binDir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	if err != nil {
		return -1
	}
	return v
}

func hasPGBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// pgVersion returns the major version reported by `postgres --version`
// ("15"), or "" if it cannot tell.
func pgVersion(ctx context.Context, binDir string) string {
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return ""
	}
	// "postgres (PostgreSQL) 15.6 (Debian 15.6-0+deb12u1)"
	f := strings.Fields(string(out))
	if len(f) < 3 {
		return ""
	}
	major, _, _ := strings.Cut(f[2], ".")
	return major
}

// runAs is the unprivileged account that runs the PostgreSQL programs when
// this process is root (initdb and postgres refuse to run as root).
type runAs struct {
	name     string
	uid, gid uint32
}

func (r *runAs) credential() *syscall.Credential {
	if r == nil {
		return nil
	}
	return &syscall.Credential{Uid: r.uid, Gid: r.gid}
}

// pgAccount returns nil when not root, else the postgres account, else nobody.
func pgAccount() (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &runAs{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root, and neither a postgres nor a nobody user exists to run initdb and postgres (they refuse to run as root)")
}

// pgTempDir creates the server's temporary directory, owned by as (when set)
// and reachable by it. It tries os.TempDir() and then /tmp, skipping a parent
// that as cannot traverse or whose path would make the Unix socket path too
// long.
func pgTempDir(as *runAs) (string, error) {
	parents := []string{os.TempDir()}
	if parents[0] != "/tmp" {
		parents = append(parents, "/tmp")
	}
	var reasons []string
	for _, parent := range parents {
		// The socket is <dir>/.s.PGSQL.<port>; sun_path holds 107 bytes.
		if len(parent)+len("/crdbwork-pg-0123456789/.s.PGSQL.65535") > 100 {
			reasons = append(reasons, parent+": path too long for a Unix socket")
			continue
		}
		if as != nil && !traversable(parent, as) {
			reasons = append(reasons, fmt.Sprintf("%s: not traversable by user %s", parent, as.name))
			continue
		}
		dir, err := os.MkdirTemp(parent, "crdbwork-pg-")
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		if as != nil {
			if err := os.Chown(dir, int(as.uid), int(as.gid)); err != nil {
				os.RemoveAll(dir)
				return "", fmt.Errorf("chown %s to %s: %w", dir, as.name, err)
			}
		}
		return dir, nil
	}
	return "", fmt.Errorf("no usable temp dir: %s", strings.Join(reasons, "; "))
}

// traversable reports whether as can search every directory from / to dir.
func traversable(dir string, as *runAs) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		var bit os.FileMode = 0o001
		switch {
		case st.Uid == as.uid:
			bit = 0o100
		case st.Gid == as.gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			return false
		}
		if p == "/" || p == filepath.Dir(p) {
			return true
		}
	}
}

// pgServer holds what is needed to run PostgreSQL programs on one cluster.
type pgServer struct {
	binDir  string
	dir     string
	dataDir string
	logPath string
	as      *runAs
	port    int    // 0 until pg_ctl start succeeded
	opts    string // the postgres options of the successful start (pg_ctl -o)
}

func (p *pgServer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, name), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if p.as != nil {
		cmd.Env = append(cmd.Env, "HOME="+p.dir, "USER="+p.as.name, "LOGNAME="+p.as.name)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.as.credential()}
	// pg_ctl's daemonized postmaster writes to the log file, not our pipes,
	// but never let a stray descendant holding them block Wait forever.
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

func (p *pgServer) run(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := p.command(ctx, name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// postmasterPID reads the postmaster's pid from postmaster.pid, or 0.
func (p *pgServer) postmasterPID() int {
	data, err := os.ReadFile(filepath.Join(p.dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// shellQuote quotes s for a POSIX shell (pg_ctl passes -o through one).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pickPort chooses the port for a new server; a variable so tests can force
// a clash.
var pickPort = freePort

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pgWatchdogScript stops the cluster and removes the directory. Arguments:
// $1 bin dir, $2 data dir, $3 temp dir.
const pgWatchdogScript = `pid=$(head -n 1 "$2/postmaster.pid" 2>/dev/null)
"$1/pg_ctl" -D "$2" -m immediate -w -t 60 stop >/dev/null 2>&1 || { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; }
rm -rf "$3"`

// startPostgres creates a cluster with initdb in a new temp dir and starts it
// with pg_ctl on a free port of 127.0.0.1.
func startPostgres(ctx context.Context, binDir string, logf func(string, ...any), durable bool, maxConns int) (*Server, error) {
	as, err := pgAccount()
	if err != nil {
		return nil, fmt.Errorf("dbserver: %w", err)
	}
	dir, err := pgTempDir(as)
	if err != nil {
		return nil, fmt.Errorf("dbserver: %w", err)
	}
	p := &pgServer{
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "log"),
		as:      as,
	}
	version := pgVersion(ctx, binDir)
	if as != nil {
		logf("starting PostgreSQL %s from %s in %s (as user %s)", version, binDir, dir, as.name)
	} else {
		logf("starting PostgreSQL %s from %s in %s", version, binDir, dir)
	}

	wd, err := startWatchdog(pgWatchdogScript, as.credential(), binDir, p.dataDir, dir)
	if err != nil {
		logf("dbserver: no cleanup watchdog (the server may outlive a crash of this process): %v", err)
	}

	s := &Server{kind: Postgres, dir: dir, defaultDB: "postgres", logf: logf}
	started := false
	s.stop = func() error {
		wd.cancel()
		var errs []error
		if started {
			if err := p.stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("dbserver: stop PostgreSQL in %s: %w", dir, err)
		}
		return nil
	}
	fail := func(err error) (*Server, error) {
		_ = s.Stop()
		return nil, fmt.Errorf("dbserver: start PostgreSQL %s from %s in %s: %w", version, binDir, dir, err)
	}

	if err := p.run(ctx, "initdb", "-D", p.dataDir, "-U", pgUser, "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fail(err)
	}

	var port int
	var opts string
	for attempt := 1; ; attempt++ {
		port, err = pickPort()
		if err != nil {
			return fail(fmt.Errorf("pick a free port: %w", err))
		}
		var logSize int64
		if fi, err := os.Stat(p.logPath); err == nil {
			logSize = fi.Size()
		}
		durability := "off"
		if durable {
			durability = "on"
		}
		if maxConns <= 0 {
			maxConns = 400
		}
		opts = fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=%s "+
			"-c synchronous_commit=%[3]s -c full_page_writes=%[3]s -c max_connections=%d -c shared_buffers=128MB",
			port, shellQuote(dir), durability, maxConns)
		started = true // from here on, Stop must stop a postmaster that may be running
		err = p.run(ctx, "pg_ctl", "-D", p.dataDir, "-w", "-t", "120", "-l", p.logPath, "-o", opts, "start")
		if err == nil {
			break
		}
		tail := tailFile(p.logPath, logSize, 30)
		if attempt < maxPortAttempts && ctx.Err() == nil &&
			(strings.Contains(tail, "Address already in use") || strings.Contains(tail, "could not create any TCP/IP sockets")) {
			logf("port %d was taken; trying another", port)
			continue
		}
		return fail(fmt.Errorf("%w\nserver log (last lines):\n%s", err, tail))
	}
	p.port, p.opts = port, opts
	s.halt, s.resume, s.restart = p.halt, p.resume, p.restartFast

	s.base = url.URL{
		Scheme:   "postgres",
		User:     url.User(pgUser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		RawQuery: "sslmode=disable",
	}
	// pg_ctl -w has already waited for "ready"; this only confirms it.
	var lastErr error
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		lastErr = ping(ctx, s.URL(""))
		return lastErr == nil, nil
	})
	if err != nil {
		return fail(fmt.Errorf("connect: %w (last attempt: %v)\nserver log (last lines):\n%s", err, lastErr, tailFile(p.logPath, 0, 30)))
	}
	logf("PostgreSQL ready at %s", s.URL(""))
	return s, nil
}

// stop stops the postmaster: `pg_ctl stop -m immediate`, falling back to
// SIGKILL, then waits until its port refuses connections.
func (p *pgServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	pid := p.postmasterPID()
	var errs []error
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
		if pid == 0 {
			// Never started (or already gone): nothing to kill.
			if _, statErr := os.Stat(filepath.Join(p.dataDir, "postmaster.pid")); statErr != nil {
				return nil
			}
			return err
		}
		// The postmaster leads its own session (pg_ctl calls setsid), so its
		// process group holds the whole server.
		if kerr := syscall.Kill(-pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
			if kerr := syscall.Kill(pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
				errs = append(errs, err, fmt.Errorf("kill postmaster %d: %w", pid, kerr))
			}
		}
	}
	if p.port != 0 {
		if err := waitPortClosed(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// halt stops the postmaster with `pg_ctl stop -m fast` (sessions are ended,
// the data is kept) and waits until its port refuses connections.
func (p *pgServer) halt(ctx context.Context) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-m", "fast", "-w", "-t", "60", "stop"); err != nil {
		return err
	}
	return waitPortClosed(ctx, p.hostPort())
}

// resume starts the postmaster again with the options and port of the first
// start and waits until it accepts connections.
func (p *pgServer) resume(ctx context.Context) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-w", "-t", "120", "-l", p.logPath, "-o", p.opts, "start"); err != nil {
		return fmt.Errorf("%w\nserver log (last lines):\n%s", err, tailFile(p.logPath, 0, 30))
	}
	return p.waitReady(ctx)
}

// restartFast runs `pg_ctl restart -m fast`: sessions are ended, the server
// shuts down cleanly and starts again at once on the same port.
func (p *pgServer) restartFast(ctx context.Context) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-m", "fast", "-w", "-t", "120", "-l", p.logPath, "-o", p.opts, "restart"); err != nil {
		return fmt.Errorf("%w\nserver log (last lines):\n%s", err, tailFile(p.logPath, 0, 30))
	}
	return p.waitReady(ctx)
}

// waitReady waits until the server answers a ping.
func (p *pgServer) waitReady(ctx context.Context) error {
	u := url.URL{Scheme: "postgres", User: url.User(pgUser), Host: p.hostPort(), Path: "/postgres", RawQuery: "sslmode=disable"}
	var lastErr error
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		lastErr = ping(ctx, u.String())
		return lastErr == nil, nil
	})
	if err != nil {
		return fmt.Errorf("connect after start: %w (last attempt: %v)", err, lastErr)
	}
	return nil
}

func (p *pgServer) hostPort() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }
