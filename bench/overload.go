package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// overloadQueue is the queue of the overload command.
const overloadQueue = "bench-overload"

// overloadConfig are the settings of an overload run, shared by the
// command and its worker processes (passed on as flags).
type overloadConfig struct {
	processes   int
	items       int
	concurrency int
	parts       int
	ackBatch    int
	heartbeat   time.Duration
	expiry      time.Duration
	taskTime    time.Duration
	timeout     time.Duration
	maxConns    int
	json        bool
}

// workerArgs are the flags of one worker process.
func (c *overloadConfig) workerArgs(url string, i int) []string {
	return []string{"overload-worker", "--database-url", url, "--name", fmt.Sprintf("overload-%d", i),
		"--concurrency", strconv.Itoa(c.concurrency), "--parts", strconv.Itoa(c.parts), "--ack-batch", strconv.Itoa(c.ackBatch),
		"--heartbeat", c.heartbeat.String(), "--expiry", c.expiry.String(), "--task-time", c.taskTime.String()}
}

// options are the worker options of every process: the demo's shape
// (parts, 256 handlers), results recorded in the ack transaction.
func (c *overloadConfig) options(name string) worker.Options {
	return worker.Options{
		Name:        name,
		Concurrency: c.concurrency,
		Parts:       c.parts,
		MaxAckBatch: c.ackBatch,
		Session:     session.Tuning{Heartbeat: c.heartbeat, Expiry: c.expiry},
		BatchStatement: func(acked []claim.AckRequest) (string, []any) {
			ids := make([][16]byte, len(acked))
			for i, r := range acked {
				ids[i] = r.Value.([16]byte)
			}
			return insertResults, []any{ids}
		},
		// A worker process's first session may start late on a
		// saturated server: that is not what is measured.
		StartTimeout: 10 * time.Minute,
	}
}

// workerReport is one line a worker process prints on stdout, every second
// and once more when it stops: its counters so far and the round trips of
// the heartbeats since its previous line.
type workerReport struct {
	Sessions     int64   `json:"sessions"`
	SessionsLost int64   `json:"sessions_lost"`
	Acked        int64   `json:"acked"`
	HeartbeatsUS []int64 `json:"heartbeats_us"`
	HBFailed     int64   `json:"heartbeats_failed"`
	Final        bool    `json:"final"`
}

// OverloadReport is the result of an overload run (--json prints it).
type OverloadReport struct {
	Processes        int     `json:"processes"`
	Concurrency      int     `json:"concurrency"`
	Parts            int     `json:"parts"`
	Items            int     `json:"items"`
	Seconds          float64 `json:"seconds"`
	ItemsPerSecond   float64 `json:"items_per_second"`
	SessionsStarted  int64   `json:"sessions_started"`
	SessionsLost     int64   `json:"sessions_lost"`
	ProcessesExited  int     `json:"processes_exited_early"`
	Heartbeats       int     `json:"heartbeats"`
	HeartbeatsFailed int64   `json:"heartbeats_failed"`
	HeartbeatP50MS   float64 `json:"heartbeat_p50_ms"`
	HeartbeatP90MS   float64 `json:"heartbeat_p90_ms"`
	HeartbeatP99MS   float64 `json:"heartbeat_p99_ms"`
	HeartbeatMaxMS   float64 `json:"heartbeat_max_ms"`
	LoadStart        string  `json:"load_start"`
	LoadPeak         float64 `json:"load_peak_1m"`
	LoadEnd          string  `json:"load_end"`
	Results          int64   `json:"results"`
	Remaining        int64   `json:"remaining"`
}

// overloadCmd is the overload command: --processes worker processes (this
// program again, with the hidden overload-worker command) drain a backlog
// of --items items from one queue on one server, and the run reports how
// many sessions were lost while their process was alive, the items per
// second, the heartbeats' round trips and the machine's load.
func overloadCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("overload", out)
	var c overloadConfig
	url := fs.String("database-url", "", "PostgreSQL server to use (its crdbwork tables are created and its queue "+overloadQueue+" emptied); default: start a throwaway server")
	fs.IntVar(&c.processes, "processes", 128, "worker processes (separate OS processes, one worker each)")
	fs.IntVar(&c.items, "items", 200_000, "items of the backlog, enqueued before the workers start")
	fs.IntVar(&c.concurrency, "concurrency", 256, "handlers per worker process")
	fs.IntVar(&c.parts, "parts", 16, "parts of the queue (0: no parts mode)")
	fs.IntVar(&c.ackBatch, "ack-batch", 0, "worker.Options.MaxAckBatch (0: its default)")
	fs.DurationVar(&c.heartbeat, "heartbeat", session.DefaultHeartbeat, "session heartbeat")
	fs.DurationVar(&c.expiry, "expiry", session.DefaultExpiry, "session expiry")
	fs.DurationVar(&c.taskTime, "task-time", 2*time.Millisecond, "time each handler spends on its item")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "give up if the backlog is not drained by then")
	fs.IntVar(&c.maxConns, "max-connections", 0, "max_connections of the throwaway server (0: enough for every process's worker.Connections)")
	fs.BoolVar(&c.json, "json", false, "print the report as one JSON line")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.processes < 1 || c.items < 1 || c.concurrency < 1 || c.parts < 0 || c.ackBatch < 0:
		return errors.New("--processes, --items and --concurrency must be at least 1, --parts and --ack-batch at least 0")
	}
	if c.maxConns == 0 {
		c.maxConns = c.processes*(worker.Connections(c.options(""))+1) + 50
	}
	dbURL := *url
	if dbURL == "" {
		s, err := dbserver.Start(ctx, dbserver.Options{Prefer: dbserver.Postgres, MaxConnections: c.maxConns})
		if err != nil {
			return fmt.Errorf("starting PostgreSQL: %w", err)
		}
		defer func() {
			if err := s.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
		}()
		dbURL = s.URL("")
		fmt.Fprintf(out, "throwaway PostgreSQL (internal/dbserver, fsync off, max_connections %d) at %s\n", c.maxConns, dbURL)
	}
	setup, err := newSetupPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer setup.Close()
	if err := setupCrdbwork(ctx, setup); err != nil {
		return err
	}
	if err := prepareOverload(ctx, setup, &c); err != nil {
		return err
	}
	rep, err := runOverload(ctx, dbURL, setup, &c, out)
	if err != nil {
		return err
	}
	if c.json {
		return printJSON(out, rep)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "processes\t%d × %d handlers, %d parts, heartbeat %v, expiry %v, task %v\n", rep.Processes, rep.Concurrency, rep.Parts, c.heartbeat, c.expiry, c.taskTime)
	fmt.Fprintf(tw, "drained\t%d items in %.1f s: %.0f items/s (results %d, left %d)\n", rep.Items, rep.Seconds, rep.ItemsPerSecond, rep.Results, rep.Remaining)
	fmt.Fprintf(tw, "sessions\t%d started, %d lost while their process was alive; %d processes exited early\n", rep.SessionsStarted, rep.SessionsLost, rep.ProcessesExited)
	fmt.Fprintf(tw, "heartbeats\t%d, %d failed; round trip p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n", rep.Heartbeats, rep.HeartbeatsFailed,
		rep.HeartbeatP50MS, rep.HeartbeatP90MS, rep.HeartbeatP99MS, rep.HeartbeatMaxMS)
	fmt.Fprintf(tw, "load\tstart %s, peak %.1f, end %s (loadavg)\n", rep.LoadStart, rep.LoadPeak, rep.LoadEnd)
	return tw.Flush()
}

// prepareOverload empties the queue and the results, stores the queue's
// parts and enqueues the backlog.
func prepareOverload(ctx context.Context, setup *pgxpool.Pool, c *overloadConfig) error {
	if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, overloadQueue); err != nil {
		return err
	}
	if _, err := setup.Exec(ctx, `TRUNCATE bench_cw_results`); err != nil {
		return err
	}
	if c.parts > 0 {
		if _, err := partition.EnsureParts(ctx, setup, crsql.Tables{}, overloadQueue, c.parts); err != nil {
			return err
		}
	}
	q, err := claim.New(setup, claim.Options{Queue: overloadQueue})
	if err != nil {
		return err
	}
	items := make([]claim.NewItem, c.items)
	for i := range items {
		items[i] = claim.NewItem{Key: "k" + strconv.Itoa(i%1000), Payload: []byte{}}
	}
	return enqueueChunks(ctx, q, items)
}

// overloadProcess is one worker process of a run.
type overloadProcess struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	mu     sync.Mutex
	last   workerReport
	rtts   []int64
	failed int64
	done   chan struct{} // closed when its stdout ended
}

func runOverload(ctx context.Context, url string, setup *pgxpool.Pool, c *overloadConfig, out io.Writer) (*OverloadReport, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rep := &OverloadReport{Processes: c.processes, Concurrency: c.concurrency, Parts: c.parts, Items: c.items, LoadStart: loadavg()}
	procs := make([]*overloadProcess, c.processes)
	defer func() {
		for _, p := range procs {
			if p != nil && p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	}()
	start := time.Now()
	for i := range procs {
		cmd := exec.Command(exe, c.workerArgs(url, i)...)
		cmd.Env = append(os.Environ(), overloadEnv+"=1")
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("starting worker process %d: %w", i, err)
		}
		p := &overloadProcess{cmd: cmd, in: in, done: make(chan struct{})}
		procs[i] = p
		go func() {
			defer close(p.done)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			for sc.Scan() {
				var r workerReport
				if json.Unmarshal(sc.Bytes(), &r) != nil {
					continue
				}
				p.mu.Lock()
				p.last = r
				p.rtts = append(p.rtts, r.HeartbeatsUS...)
				p.failed += r.HBFailed
				p.mu.Unlock()
			}
		}()
	}
	fmt.Fprintf(out, "%d worker processes started; load %s\n", c.processes, loadavg())
	deadline := time.Now().Add(c.timeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var remaining int64
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		if l := load1(); l > rep.LoadPeak {
			rep.LoadPeak = l
		}
		if err := setup.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = $1`, overloadQueue).Scan(&remaining); err != nil {
			return nil, err
		}
		if remaining == 0 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.LoadEnd = loadavg()
	// Who is still alive before the stop: a process that exited before is
	// one whose lost sessions are not "lost while alive".
	for _, p := range procs {
		select {
		case <-p.done:
			rep.ProcessesExited++
		default:
		}
	}
	for _, p := range procs {
		p.in.Close() // the worker process stops gracefully at EOF
	}
	var rtts []time.Duration
	for _, p := range procs {
		_ = p.cmd.Wait()
		<-p.done
		p.mu.Lock()
		rep.SessionsStarted += p.last.Sessions
		rep.SessionsLost += p.last.SessionsLost
		rep.HeartbeatsFailed += p.failed
		for _, us := range p.rtts {
			rtts = append(rtts, time.Duration(us)*time.Microsecond)
		}
		p.mu.Unlock()
	}
	rep.Remaining = remaining
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM bench_cw_results`).Scan(&rep.Results); err != nil {
		return nil, err
	}
	rep.ItemsPerSecond = float64(int64(c.items)-remaining) / rep.Seconds
	slices.Sort(rtts)
	rep.Heartbeats = len(rtts)
	rep.HeartbeatP50MS, rep.HeartbeatP90MS, rep.HeartbeatP99MS = ms(percentile(rtts, 50)), ms(percentile(rtts, 90)), ms(percentile(rtts, 99))
	if len(rtts) > 0 {
		rep.HeartbeatMaxMS = ms(rtts[len(rtts)-1])
	}
	if remaining > 0 {
		return rep, fmt.Errorf("%d items left after %v", remaining, c.timeout)
	}
	return rep, nil
}

// load1 returns the one-minute load average (0 if unreadable).
func load1() float64 {
	f := strings.Fields(loadavg())
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// overloadEnv is set in the environment of the worker processes, for the
// tests: their binary runs the overload-worker command when it is set.
const overloadEnv = "BENCH_OVERLOAD_WORKER"

// overloadWorker is the hidden command of a worker process: one worker on
// the overload queue until its stdin ends (or SIGTERM), printing a
// workerReport line every second and a final one.
func overloadWorker(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("overload-worker", flag.ContinueOnError)
	var c overloadConfig
	url := fs.String("database-url", "", "the server")
	name := fs.String("name", "overload", "the session's name")
	fs.IntVar(&c.concurrency, "concurrency", 256, "")
	fs.IntVar(&c.parts, "parts", 16, "")
	fs.IntVar(&c.ackBatch, "ack-batch", 0, "")
	fs.DurationVar(&c.heartbeat, "heartbeat", session.DefaultHeartbeat, "")
	fs.DurationVar(&c.expiry, "expiry", session.DefaultExpiry, "")
	fs.DurationVar(&c.taskTime, "task-time", 0, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	opts := c.options(*name)
	var mu sync.Mutex
	var rtts []int64
	var failed int64
	var sent time.Time
	opts.Testing.Session.BeforeHeartbeat = func() { sent = time.Now() } // the heartbeat goroutine, as AfterHeartbeat
	opts.Testing.Session.AfterHeartbeat = func(alive bool, err error) {
		d := time.Since(sent)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || !alive {
			failed++
			return
		}
		rtts = append(rtts, d.Microseconds())
	}
	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(worker.PoolConns(opts))
	if err := worker.ConfigurePool(cfg, opts); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: overloadQueue})
	if err != nil {
		return err
	}
	task := c.taskTime
	w, err := worker.New(q, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if task > 0 {
			t := time.NewTimer(task)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		return nil, worker.RecordValue(ctx, [16]byte(it.ID))
	}, opts)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	report := func(final bool) error {
		st := w.Stats()
		mu.Lock()
		r := workerReport{Sessions: st.Sessions, SessionsLost: st.SessionsLost, Acked: st.Acked, HeartbeatsUS: rtts, HBFailed: failed, Final: final}
		rtts, failed = nil, 0
		mu.Unlock()
		return enc.Encode(r)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			if rerr := report(true); err == nil {
				err = rerr
			}
			return err
		case <-t.C:
			if err := report(false); err != nil {
				return err
			}
		}
	}
}
