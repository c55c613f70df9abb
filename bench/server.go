package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
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

// server is a throwaway PostgreSQL cluster in a temporary directory, started
// with initdb and pg_ctl (as the postgres user when this process is root:
// PostgreSQL refuses to run as root). It is tuned like the library's test
// server (no fsync, asynchronous commit), so every system measured here
// gets the same server.
type server struct {
	binDir, dir, dataDir string
	cred                 *syscall.Credential
	url                  string
	pid                  int // the postmaster's
}

// findPGBin returns the directory of initdb, pg_ctl and postgres.
func findPGBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasPG(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if hasPG(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if hasPG(d) {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl, postgres) on PATH or in /usr/lib/postgresql/*/bin: run ../scripts/setup-db, or pass --database-url")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func hasPG(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// startServer creates and starts the cluster on a free port of 127.0.0.1.
// With statements, pg_stat_statements is preloaded when it is installed.
func startServer(ctx context.Context, statements bool) (*server, error) {
	bin, err := findPGBin()
	if err != nil {
		return nil, err
	}
	s := &server{binDir: bin}
	var uid, gid int = -1, -1
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs a postgres user to run the server: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	if s.dir, err = os.MkdirTemp("/tmp", "crdbwork-bench-"); err != nil {
		return nil, err
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, uid, gid); err != nil {
			s.stop()
			return nil, err
		}
	}
	s.dataDir = filepath.Join(s.dir, "data")
	if err := s.run(ctx, "initdb", "-D", s.dataDir, "-U", "bench", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		s.stop()
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		s.stop()
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "+
		"-c full_page_writes=off -c max_connections=300 -c shared_buffers=256MB -c max_wal_size=2GB", port, s.dir)
	if statements {
		if fileExists(filepath.Join(filepath.Dir(bin), "lib", "pg_stat_statements.so")) {
			opts += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
		} else {
			fmt.Fprintln(os.Stderr, "bench: pg_stat_statements is not installed; --statements will show nothing")
		}
	}
	if err := s.run(ctx, "pg_ctl", "-D", s.dataDir, "-w", "-t", "60", "-l", filepath.Join(s.dir, "log"), "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		s.stop()
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	s.url = fmt.Sprintf("postgres://bench@127.0.0.1:%d/postgres?sslmode=disable", port)
	if b, err := os.ReadFile(filepath.Join(s.dataDir, "postmaster.pid")); err == nil {
		first, _, _ := strings.Cut(string(b), "\n")
		s.pid, _ = strconv.Atoi(strings.TrimSpace(first))
	}
	return s, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (s *server) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, name), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// stop stops the server (if it runs) and removes its directory.
func (s *server) stop() {
	if s.dataDir != "" && fileExists(filepath.Join(s.dataDir, "postmaster.pid")) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.run(ctx, "pg_ctl", "-D", s.dataDir, "-m", "immediate", "-w", "stop"); err != nil {
			fmt.Fprintln(os.Stderr, "bench: stopping the server:", err)
		}
		cancel()
	}
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
