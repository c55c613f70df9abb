package dbserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// findCockroach returns the cockroach binary named by COCKROACH_BINARY, else
// the one on PATH, else the newest one downloaded into CacheDir, else "". A
// COCKROACH_BINARY that is not an executable file is an error rather than a
// reason to fall back to PostgreSQL.
func findCockroach() (string, error) {
	if bin := os.Getenv("COCKROACH_BINARY"); bin != "" {
		path, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("dbserver: COCKROACH_BINARY=%q: %w", bin, err)
		}
		return path, nil
	}
	path, err := exec.LookPath("cockroach")
	if err != nil {
		return cachedCockroach(), nil
	}
	return path, nil
}

// crdbNode is a single-node CockroachDB server: its binary, its store, and
// the process running it now (a restart replaces the process, keeping the
// store and the SQL port).
type crdbNode struct {
	bin, dir, logPath, urlFile string
	logf                       func(string, ...any)

	mu     sync.Mutex
	proc   *crdbProc // nil while halted
	wd     *watchdog
	listen string // "127.0.0.1:0" until the first start chose a port
}

// crdbProc is one cockroach process.
type crdbProc struct {
	pid     int
	exited  chan struct{}
	waitErr error // set before exited is closed
}

// launch starts a cockroach process on the node's store, listening on
// n.listen, and a watchdog that kills it if this process dies.
func (n *crdbNode) launch() (*crdbProc, error) {
	// A stale URL file would be taken for the new process's.
	if err := os.Remove(n.urlFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove %s: %w", n.urlFile, err)
	}
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open cockroach log: %w", err)
	}
	cmd := exec.Command(n.bin,
		"start-single-node",
		"--insecure",
		"--listen-addr="+n.listen,
		"--http-addr=127.0.0.1:0",
		"--store=path="+filepath.Join(n.dir, "store"),
		"--listening-url-file="+n.urlFile,
	)
	cmd.Dir = n.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = groupWithDeathSignal()

	// Pdeathsig fires when the starting OS thread exits, not the process, so
	// start and wait from a goroutine that keeps its thread locked for the
	// child's whole life (the Go runtime never retires a locked thread whose
	// goroutine is still running).
	p := &crdbProc{exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	err = <-started
	logFile.Close() // the child has its own descriptor
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", n.bin, err)
	}
	p.pid = cmd.Process.Pid
	wd, err := startWatchdog(`kill -KILL -- "-$1" 2>/dev/null; rm -rf "$2"`, nil, strconv.Itoa(p.pid), n.dir)
	if err != nil {
		n.logf("dbserver: no cleanup watchdog (the server may outlive a crash of this process): %v", err)
	}
	n.proc, n.wd = p, wd
	return p, nil
}

// waitReady waits until p has written its URL file and accepts SQL
// connections, and returns the connection URL without a database.
func (n *crdbNode) waitReady(ctx context.Context, p *crdbProc) (url.URL, error) {
	var base url.URL
	var lastErr error
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case <-p.exited:
			return false, fmt.Errorf("cockroach exited: %v", p.waitErr)
		default:
		}
		data, err := os.ReadFile(n.urlFile)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && len(strings.TrimSpace(string(data))) == 0) {
			lastErr = fmt.Errorf("no URL in %s yet", n.urlFile)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		u, err := url.Parse(strings.TrimSpace(string(data)))
		if err != nil || u.Host == "" {
			// Read again on the next try: it may have been caught half written.
			lastErr = fmt.Errorf("bad URL in %s: %q", n.urlFile, data)
			return false, nil
		}
		q := u.Query()
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
		u.Path, u.RawPath = "", ""
		probe := *u
		probe.Path = "/defaultdb"
		if err := ping(ctx, probe.String()); err != nil {
			lastErr = err
			return false, nil
		}
		base = *u
		return true, nil
	})
	if err != nil {
		if lastErr != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (last attempt: %v)", err, lastErr)
		}
		return url.URL{}, err
	}
	return base, nil
}

// kill ends the running process (SIGTERM, then SIGKILL after grace) and its
// watchdog, keeping the store. It does nothing while halted.
func (n *crdbNode) kill(grace time.Duration) error {
	p := n.proc
	if p == nil {
		return nil
	}
	n.wd.cancel()
	n.proc, n.wd = nil, nil
	select {
	case <-p.exited:
		return nil
	default:
	}
	if grace > 0 {
		if err := syscall.Kill(-p.pid, syscall.SIGTERM); err == nil {
			select {
			case <-p.exited:
				return nil
			case <-time.After(grace):
			}
		}
	}
	if err := syscall.Kill(-p.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill cockroach process group %d: %w", p.pid, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("cockroach (pid %d) did not exit after SIGKILL", p.pid)
	}
}

// crdbRestartGrace is how long a restart lets cockroach shut down on SIGTERM
// before it is killed.
const crdbRestartGrace = 10 * time.Second

// startCockroach runs `cockroach start-single-node --insecure` on 127.0.0.1
// with ports chosen by the kernel, and waits until it accepts SQL
// connections.
func startCockroach(ctx context.Context, bin string, logf func(string, ...any)) (*Server, error) {
	dir, err := os.MkdirTemp("", "crdbwork-cockroach-")
	if err != nil {
		return nil, fmt.Errorf("dbserver: create temp dir: %w", err)
	}
	logf("starting CockroachDB from %s in %s", bin, dir)
	n := &crdbNode{bin: bin, dir: dir, logPath: filepath.Join(dir, "cockroach.log"),
		urlFile: filepath.Join(dir, "url"), logf: logf, listen: "127.0.0.1:0"}
	p, err := n.launch()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("dbserver: %w", err)
	}

	s := &Server{kind: Cockroach, dir: dir, defaultDB: "defaultdb", logf: logf}
	s.stop = func() error {
		n.mu.Lock()
		defer n.mu.Unlock()
		var errs []error
		if err := n.kill(0); err != nil {
			errs = append(errs, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("dbserver: stop cockroach in %s: %w", dir, err)
		}
		return nil
	}
	s.halt = func(ctx context.Context) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		if err := n.kill(crdbRestartGrace); err != nil {
			return err
		}
		return waitPortClosed(ctx, n.listen)
	}
	s.resume = func(ctx context.Context) error {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.proc != nil {
			return nil
		}
		p, err := n.launch()
		if err != nil {
			return err
		}
		base, err := n.waitReady(ctx, p)
		if err != nil {
			return fmt.Errorf("%w\ncockroach output (last lines):\n%s", err, tailFile(n.logPath, 0, 30))
		}
		if base.Host != s.base.Host {
			return fmt.Errorf("cockroach came back at %s, not %s", base.Host, s.base.Host)
		}
		return nil
	}
	s.restart = func(ctx context.Context) error {
		if err := s.halt(ctx); err != nil {
			return err
		}
		return s.resume(ctx)
	}

	base, err := n.waitReady(ctx, p)
	if err != nil {
		tail := tailFile(n.logPath, 0, 30)
		_ = s.Stop()
		return nil, fmt.Errorf("dbserver: start cockroach in %s: %w\ncockroach output (last lines):\n%s", dir, err, tail)
	}
	s.base = base
	// Restarts listen on the port the kernel chose now.
	n.mu.Lock()
	n.listen = net.JoinHostPort(base.Hostname(), base.Port())
	n.mu.Unlock()
	logf("CockroachDB ready at %s", s.URL(""))
	return s, nil
}
