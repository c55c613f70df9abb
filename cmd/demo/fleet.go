package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/worker"
)

// workerGroup is the demo's set of workers: in-process sessions, or child
// processes (with --kill-every).
type workerGroup interface {
	// failed delivers an error when the group cannot go on.
	failed() <-chan error
	// stop stops every worker gracefully, waiting at most timeout.
	stop(timeout time.Duration)
	// killed is the number of workers killed on purpose.
	killed() int
	// counters adds what only in-process workers know to s.
	counters(s *summary)
	// settled is the number of items the workers say they took out of
	// the queue for good (acked, dead, dropped): a hint of when to count
	// the items left, not a count (a killed worker's last report lags).
	settled() int64
}

// inProcess runs the workers as goroutines of this process, each with its
// own session and connection pool.
type inProcess struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	fail   chan error
	pools  []*pgxpool.Pool
	stats  []func() worker.Stats
}

func startInProcess(ctx context.Context, c *runConfig, url string, log *zap.Logger, ms *metricsServer) (*inProcess, error) {
	// The workers stop when we say so (gracefully), not when a signal
	// cancels ctx.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g := &inProcess{cancel: cancel, fail: make(chan error, c.workers)}
	for i := 1; i <= c.workers; i++ {
		pool, err := cli.ConnectWith(ctx, url, c.poolSize(), c.configurePool)
		if err != nil {
			g.stop(time.Second)
			return nil, err
		}
		g.pools = append(g.pools, pool)
		cli.Warm(ctx, pool)
		w, err := c.newWorker(pool, c.queue, fmt.Sprintf("demo-worker-%d", i), log, ms)
		if err != nil {
			g.stop(time.Second)
			return nil, cli.Failf(2, "%v", err)
		}
		g.stats = append(g.stats, w.Stats)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := w.Run(wctx); err != nil {
				g.fail <- err
			}
		}()
	}
	return g, nil
}

func (g *inProcess) failed() <-chan error { return g.fail }
func (g *inProcess) killed() int          { return 0 }

func (g *inProcess) stop(timeout time.Duration) {
	g.cancel()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
	for _, p := range g.pools {
		p.Close()
	}
}

func (g *inProcess) settled() int64 {
	var n int64
	for _, f := range g.stats {
		st := f()
		n += st.Acked + st.Dead + st.Dropped
	}
	return n
}

func (g *inProcess) counters(s *summary) {
	var sessions, lost, claimsLost int64
	retries := map[string]int64{}
	for _, f := range g.stats {
		st := f()
		sessions, lost, claimsLost = sessions+st.Sessions, lost+st.SessionsLost, claimsLost+st.LostClaims
		for k, v := range st.Retries {
			retries[k] += v
		}
		retries["parts"] += st.Parts.Retries
	}
	s.SessionsStarted, s.SessionsLost, s.ClaimsLost, s.Retries = &sessions, &lost, &claimsLost, retries
}

// reportEvery is how often worker processes report their counters to the
// demo: a killed worker's last report is at most this old.
const reportEvery = 250 * time.Millisecond

// workerWaitDB is how long a worker process started by the fleet waits for
// a database that is restarting (--restart-db-every) before it gives up.
const workerWaitDB = time.Minute

// maxCrashes is how many unexpected worker exits the demo tolerates (each
// one is replaced) before it gives up.
const maxCrashes = 5

// fleet runs the workers as child processes (`demo work`), kills a random
// one every so often with SIGKILL and starts a replacement.
type fleet struct {
	exe     string
	args    []string // `work` and its flags, without --name
	env     []string
	out     *cli.Console
	verbose bool

	mu      sync.Mutex
	live    []*child
	all     []*child // every worker started, for the counters
	seq     int
	closing bool
	nKilled int
	crashes int

	wg       sync.WaitGroup
	fail     chan error
	stopKill chan struct{}
	killDone chan struct{}
}

// child is one worker process.
type child struct {
	name     string
	cmd      *exec.Cmd
	tail     *tailWriter
	killed   atomic.Bool // SIGKILLed by the kill loop
	stopping atomic.Bool // sent SIGTERM at the end
}

func startFleet(c *runConfig, url string, out *cli.Console) (*fleet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, cli.Failf(1, "finding this program to start worker processes: %v", err)
	}
	// The URL goes in the environment, not on the command line, where any
	// user of the machine could read its password.
	env := []string{"DATABASE_URL=" + url}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "DEMO_") {
			env = append(env, kv)
		}
	}
	f := &fleet{
		exe: exe, env: env, out: out, verbose: verbose(c.logLevel),
		args: []string{"work", "--queue", c.queue, "--parts", fmt.Sprint(c.parts), "--concurrency", fmt.Sprint(c.concurrency),
			"--ack-batch", fmt.Sprint(c.ackBatch),
			"--task-time", c.taskTime.String(), "--heartbeat", c.heartbeat.String(), "--expiry", c.expiry.String(),
			"--rebalance", c.rebalance.String(), "--log-level", c.logLevel, "--report-every", reportEvery.String(),
			"--wait-db", workerWaitDB.String(), "--wake", c.wake},
		fail: make(chan error, 1), stopKill: make(chan struct{}), killDone: make(chan struct{}),
	}
	if c.urgentLane {
		f.args = append(f.args, "--urgent-priority", fmt.Sprint(c.urgentPriority))
	}
	if c.shared {
		f.args = append(f.args, "--shared-database")
	}
	go f.killLoop(c.killEvery)
	for range c.workers {
		if err := f.spawn(); err != nil {
			f.stop(5 * time.Second)
			return nil, err
		}
	}
	return f, nil
}

// spawn starts one more worker process.
func (f *fleet) spawn() error {
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		return nil
	}
	f.seq++
	name := fmt.Sprintf("demo-worker-%d", f.seq)
	f.mu.Unlock()

	cmd := exec.Command(f.exe, append(append([]string(nil), f.args...), "--name", name)...)
	cmd.Env = f.env
	tail := &tailWriter{max: 20}
	if f.verbose {
		tail.forward = f.out.StderrWriter("[" + name + "] ")
	}
	cmd.Stderr = tail
	cmd.WaitDelay = 5 * time.Second
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return cli.Failf(1, "starting worker process %s: %v", name, err)
	}
	c := &child{name: name, cmd: cmd, tail: tail}
	f.mu.Lock()
	f.live = append(f.live, c)
	f.all = append(f.all, c)
	f.mu.Unlock()
	f.wg.Add(1)
	go f.watch(c)
	return nil
}

// watch waits for a child to exit and deals with an unexpected exit.
func (f *fleet) watch(c *child) {
	defer f.wg.Done()
	err := c.cmd.Wait()
	f.mu.Lock()
	for i, x := range f.live {
		if x == c {
			f.live = append(f.live[:i], f.live[i+1:]...)
			break
		}
	}
	f.mu.Unlock()
	switch {
	case c.killed.Load():
		return
	case c.stopping.Load():
		if err != nil && !terminatedBy(err, syscall.SIGTERM) {
			f.out.Errorf("demo: worker %s (pid %d) did not stop cleanly: %v%s", c.name, c.cmd.Process.Pid, err, c.tail.lines())
		}
		return
	}
	why := "exited by itself with status 0"
	if err != nil {
		why = "exited unexpectedly: " + err.Error()
	}
	f.out.Errorf("demo: worker %s (pid %d) %s%s", c.name, c.cmd.Process.Pid, why, c.tail.lines())
	f.mu.Lock()
	f.crashes++
	crashes, closing := f.crashes, f.closing
	f.mu.Unlock()
	if closing {
		return
	}
	if crashes > maxCrashes {
		f.sendFail(cli.Failf(1, "%d worker processes exited unexpectedly; giving up", crashes))
		return
	}
	if err := f.spawn(); err != nil {
		f.sendFail(err)
	}
}

// terminatedBy reports an exit caused by sig (a child that got our SIGTERM
// before it had installed its handler).
func terminatedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

func (f *fleet) sendFail(err error) {
	select {
	case f.fail <- err:
	default:
	}
}

// killLoop SIGKILLs a random worker every interval and starts a replacement.
func (f *fleet) killLoop(every time.Duration) {
	defer close(f.killDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-f.stopKill:
			return
		case <-t.C:
		}
		f.mu.Lock()
		var candidates []*child
		for _, c := range f.live {
			if !c.killed.Load() && !c.stopping.Load() {
				candidates = append(candidates, c)
			}
		}
		if f.closing || len(candidates) == 0 {
			f.mu.Unlock()
			continue
		}
		victim := candidates[rand.N(len(candidates))]
		victim.killed.Store(true)
		f.mu.Unlock()
		if err := victim.cmd.Process.Kill(); err != nil {
			// It had already exited: not our kill.
			victim.killed.Store(false)
			continue
		}
		f.mu.Lock()
		f.nKilled++
		f.mu.Unlock()
		if err := f.spawn(); err != nil {
			f.sendFail(err)
			return
		}
	}
}

func (f *fleet) failed() <-chan error { return f.fail }

func (f *fleet) killed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nKilled
}

// counters adds up the workers' last reports: a killed worker's is at most
// reportEvery old (a worker killed before its first report is not counted),
// and the session it had counts as lost.
func (f *fleet) counters(s *summary) {
	f.mu.Lock()
	all := append([]*child(nil), f.all...)
	f.mu.Unlock()
	var sessions, lost, claimsLost int64
	retries := map[string]int64{}
	for _, c := range all {
		c.tail.mu.Lock()
		st := c.tail.stats
		c.tail.mu.Unlock()
		if st == nil {
			continue // killed before its first report
		}
		if c.killed.Load() && st.Sessions > st.SessionsLost {
			lost++ // the session it had when it was killed
		}
		sessions, lost, claimsLost = sessions+st.Sessions, lost+st.SessionsLost, claimsLost+st.ClaimsLost
		for k, v := range st.Retries {
			retries[k] += v
		}
	}
	s.SessionsStarted, s.SessionsLost, s.ClaimsLost, s.Retries = &sessions, &lost, &claimsLost, retries
}

// settled adds up the items acked in the workers' last reports.
func (f *fleet) settled() int64 {
	f.mu.Lock()
	all := append([]*child(nil), f.all...)
	f.mu.Unlock()
	var n int64
	for _, c := range all {
		c.tail.mu.Lock()
		if st := c.tail.stats; st != nil {
			n += st.Acked
		}
		c.tail.mu.Unlock()
	}
	return n
}

// stop ends the kill loop, sends SIGTERM to every worker and waits for them
// (SIGKILL after timeout).
func (f *fleet) stop(timeout time.Duration) {
	f.mu.Lock()
	alreadyClosing := f.closing
	f.closing = true
	f.mu.Unlock()
	if !alreadyClosing {
		close(f.stopKill)
	}
	<-f.killDone
	f.mu.Lock()
	live := append([]*child(nil), f.live...)
	f.mu.Unlock()
	for _, c := range live {
		c.stopping.Store(true)
		if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			c.cmd.Process.Kill()
		}
	}
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(timeout):
	}
	f.mu.Lock()
	live = append([]*child(nil), f.live...)
	f.mu.Unlock()
	for _, c := range live {
		f.out.Errorf("demo: worker %s (pid %d) did not stop within %v; killing it", c.name, c.cmd.Process.Pid, timeout)
		c.cmd.Process.Kill()
	}
	<-done
}

// tailWriter keeps the last lines a child wrote on stderr, and forwards
// them when asked to.
type tailWriter struct {
	mu      sync.Mutex
	stats   *workStats // the last --report-every line
	statsN  int
	max     int
	buf     []string
	partial []byte
	forward interface{ Write([]byte) (int, error) }
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, p...)
	for {
		i := strings.IndexByte(string(t.partial), '\n')
		if i < 0 {
			break
		}
		line := string(t.partial[:i])
		t.partial = t.partial[i+1:]
		if rest, ok := strings.CutPrefix(line, statsPrefix); ok {
			var st workStats
			if json.Unmarshal([]byte(rest), &st) == nil {
				t.stats = &st
			}
			continue
		}
		if t.forward != nil {
			t.forward.Write([]byte(line + "\n"))
		}
		t.buf = append(t.buf, line)
		if len(t.buf) > t.max {
			t.buf = t.buf[len(t.buf)-t.max:]
		}
	}
	return len(p), nil
}

// lines returns the kept lines, formatted to follow a message.
func (t *tailWriter) lines() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := append([]string(nil), t.buf...)
	if len(t.partial) > 0 {
		lines = append(lines, string(t.partial))
	}
	if len(lines) == 0 || t.forward != nil {
		return ""
	}
	return "; its last lines on stderr:\n    " + strings.Join(lines, "\n    ")
}
