package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Node.js peers: graphile-worker and pg-boss, run by bench/peers/peer.js
// (its own package.json and package-lock.json, pinned versions; its
// node_modules is installed by ensurePeers and never committed). Only the
// table command runs them, so that nothing else in this module needs Node.

// peerSystem drains jobs with one of the Node.js peers in a child process
// against the same server.
type peerSystem struct {
	peer  string   // peer.js's first argument: graphile or pgboss
	label string   // the name in the output
	dir   string   // bench/peers
	args  []string // peer.js's flags beyond --url and --items
}

func (p peerSystem) name() string { return p.label }

// peerLine is one line peer.js writes on stdout.
type peerLine struct {
	Ready     bool    `json:"ready"`
	Peer      string  `json:"peer"`
	Version   string  `json:"version"`
	Done      bool    `json:"done"`
	ElapsedMS float64 `json:"elapsed_ms"`
	Handled   int64   `json:"handled"`
	CPUMicros int64   `json:"cpu_us"`
}

// peerVersions remembers the versions the peers reported, for the legend.
var peerVersions sync.Map // label → "graphile-worker 0.17.3"

func (p peerSystem) run(ctx context.Context, url string, d drain, m marks) (res result, err error) {
	if d.backlog > 0 {
		return result{}, errors.New("the Node.js peers drain every job: no backlog")
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute+runTimeout(d.items))
	defer cancel()
	args := append([]string{"peer.js", p.peer, "--url", url, "--items", strconv.Itoa(d.items)}, p.args...)
	cmd := exec.CommandContext(runCtx, "node", args...)
	cmd.Dir = p.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return result{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if err := cmd.Start(); err != nil {
		return result{}, fmt.Errorf("starting node %s: %w", strings.Join(args, " "), err)
	}
	exited := false
	defer func() {
		if !exited {
			stdin.Close()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if err != nil {
			err = fmt.Errorf("%w (peer.js: %s)", err, strings.TrimSpace(tail(stderr.String(), 2000)))
		}
	}()
	lines := make(chan peerLine)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l peerLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				readErr <- fmt.Errorf("peer.js wrote %q: %w", sc.Text(), err)
				return
			}
			select {
			case lines <- l:
			case <-runCtx.Done():
				return
			}
		}
		readErr <- fmt.Errorf("peer.js closed its output: %v", sc.Err())
	}()
	next := func(want string) (peerLine, error) {
		select {
		case l := <-lines:
			if (want == "ready" && !l.Ready) || (want == "done" && !l.Done) {
				return l, fmt.Errorf("peer.js: want %s, got %+v", want, l)
			}
			return l, nil
		case err := <-readErr:
			return peerLine{}, err
		case <-runCtx.Done():
			return peerLine{}, fmt.Errorf("waiting for peer.js to be %s: %w", want, runCtx.Err())
		}
	}
	ready, err := next("ready")
	if err != nil {
		return result{}, err
	}
	peerVersions.Store(p.label, ready.Peer+" "+ready.Version)
	mon, err := startConnMonitor(ctx, url)
	if err != nil {
		return result{}, err
	}
	m.start()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		mon.stop()
		return result{}, err
	}
	done, err := next("done")
	peak, monErr := mon.stop()
	if err != nil {
		return result{}, err
	}
	m.done()
	if _, err := io.WriteString(stdin, "stop\n"); err != nil {
		return result{}, err
	}
	exited = true
	if err := cmd.Wait(); err != nil {
		return result{}, fmt.Errorf("peer.js: %w", err)
	}
	if err := p.verify(ctx, url, d.items, done.Handled); err != nil {
		return result{}, err
	}
	return result{
		elapsed:   time.Duration(done.ElapsedMS * float64(time.Millisecond)),
		peakConns: peak,
		retries:   done.Handled - int64(d.items), // jobs run again
		childCPU:  time.Duration(done.CPUMicros) * time.Microsecond,
		noTrips:   true,
	}, monErr
}

// verify checks the database after a peer's drain: every job completed
// (graphile-worker deletes a completed job; pg-boss marks it completed) and,
// for pg-boss, one result row per job; handled, peer.js's handler calls, at
// least one per job.
func (p peerSystem) verify(ctx context.Context, url string, items int, handled int64) error {
	pool, err := newSetupPool(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if handled < int64(items) {
		return fmt.Errorf("%d handler calls for %d jobs", handled, items)
	}
	switch p.peer {
	case "graphile":
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM graphile_worker._private_jobs`).Scan(&left); err != nil {
			return fmt.Errorf("checking graphile-worker's jobs: %w", err)
		}
		if left != 0 {
			return fmt.Errorf("%d of %d graphile-worker jobs left after the drain", left, items)
		}
	case "pgboss":
		var completed, all, results int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), count(*), (SELECT count(*) FROM bench_pgboss_results)
FROM pgboss.job WHERE name = 'bench_noop'`).Scan(&completed, &all, &results); err != nil {
			return fmt.Errorf("checking pg-boss's jobs: %w", err)
		}
		if completed != items || all != items || results != items {
			return fmt.Errorf("pg-boss: %d of %d jobs completed (%d jobs in all), %d result rows", completed, items, all, results)
		}
	}
	return nil
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// ensurePeers checks that Node.js runs and installs the peers' pinned
// packages (npm ci, from package-lock.json) into dir when its node_modules
// is missing or older than the lock file.
func ensurePeers(ctx context.Context, dir string, out io.Writer) error {
	if _, err := os.Stat(filepath.Join(dir, "peer.js")); err != nil {
		return fmt.Errorf("the Node.js peers are not at %s (run from the bench directory: go -C bench run . table, or give --peers-dir): %w", dir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return fmt.Errorf("graphile-worker and pg-boss need Node.js 20 or later (node is not on PATH; or leave them out with --systems): %w", err)
	}
	v, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return fmt.Errorf("node --version: %w", err)
	}
	major, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(v)), "v"), ".")
	if n, err := strconv.Atoi(major); err != nil || n < 20 {
		return fmt.Errorf("node %s: the peers need Node.js 20 or later", strings.TrimSpace(string(v)))
	}
	// npm keeps a copy of the lock file it installed from in node_modules:
	// reinstall when the committed one is newer (the pins changed).
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return fmt.Errorf("the Node.js peers' lock file: %w", err)
	}
	if installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !installed.ModTime().Before(lock.ModTime()) {
		return nil
	}
	fmt.Fprintf(out, "installing the Node.js peers' pinned packages: npm ci in %s\n", dir)
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, tail(log.String(), 4000))
	}
	return nil
}
