package dbserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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

// startCockroach runs `cockroach start-single-node --insecure` on 127.0.0.1
// with ports chosen by the kernel, and waits until it accepts SQL
// connections.
func startCockroach(ctx context.Context, bin string, logf func(string, ...any)) (*Server, error) {
	dir, err := os.MkdirTemp("", "crdbwork-cockroach-")
	if err != nil {
		return nil, fmt.Errorf("dbserver: create temp dir: %w", err)
	}
	logf("starting CockroachDB from %s in %s", bin, dir)
	urlFile := filepath.Join(dir, "url")
	logPath := filepath.Join(dir, "cockroach.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("dbserver: create cockroach log: %w", err)
	}
	cmd := exec.Command(bin,
		"start-single-node",
		"--insecure",
		"--listen-addr=127.0.0.1:0",
		"--http-addr=127.0.0.1:0",
		"--store=path="+filepath.Join(dir, "store"),
		"--listening-url-file="+urlFile,
	)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = groupWithDeathSignal()

	// Pdeathsig fires when the starting OS thread exits, not the process, so
	// start and wait from a goroutine that keeps its thread locked for the
	// child's whole life (the Go runtime never retires a locked thread whose
	// goroutine is still running).
	started := make(chan error, 1)
	exited := make(chan struct{})
	var waitErr error
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waitErr = cmd.Wait()
		close(exited)
	}()
	err = <-started
	logFile.Close() // the child has its own descriptor
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("dbserver: start %s: %w", bin, err)
	}
	pid := cmd.Process.Pid

	wd, err := startWatchdog(`kill -KILL -- "-$1" 2>/dev/null; rm -rf "$2"`, nil, strconv.Itoa(pid), dir)
	if err != nil {
		logf("dbserver: no cleanup watchdog (the server may outlive a crash of this process): %v", err)
	}

	s := &Server{kind: Cockroach, dir: dir, defaultDB: "defaultdb", logf: logf}
	s.stop = func() error {
		wd.cancel()
		var errs []error
		select {
		case <-exited:
		default:
			if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("kill cockroach process group %d: %w", pid, err))
			}
			select {
			case <-exited:
			case <-time.After(stopTimeout):
				errs = append(errs, fmt.Errorf("cockroach (pid %d) did not exit after SIGKILL", pid))
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("dbserver: stop cockroach in %s: %w", dir, err)
		}
		return nil
	}
	fail := func(err error) (*Server, error) {
		tail := tailFile(logPath, 0, 30)
		_ = s.Stop()
		return nil, fmt.Errorf("dbserver: start cockroach in %s: %w\ncockroach output (last lines):\n%s", dir, err, tail)
	}

	// Wait for the URL file, then for a successful connection. The file is
	// read again on every try: it may have been caught half written.
	var lastErr error
	err = poll(ctx, 100*time.Millisecond, func() (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("cockroach exited: %v", waitErr)
		default:
		}
		data, err := os.ReadFile(urlFile)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && len(strings.TrimSpace(string(data))) == 0) {
			lastErr = fmt.Errorf("no URL in %s yet", urlFile)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		u, err := url.Parse(strings.TrimSpace(string(data)))
		if err != nil || u.Host == "" {
			lastErr = fmt.Errorf("bad URL in %s: %q", urlFile, data)
			return false, nil
		}
		q := u.Query()
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
		u.Path, u.RawPath = "", ""
		s.base = *u
		if err := ping(ctx, s.URL("")); err != nil {
			lastErr = err
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if lastErr != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (last attempt: %v)", err, lastErr)
		}
		return fail(err)
	}
	logf("CockroachDB ready at %s", s.URL(""))
	return s, nil
}
