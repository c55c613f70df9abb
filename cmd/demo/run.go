package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
)

// demoDatabase is the database the demo creates in the embedded server.
const demoDatabase = "crdbwork_demo"

type runConfig struct {
	common
	workerSettings
	limits             limitFlags
	items, workers     int
	killEvery, timeout time.Duration
	progress           bool
	bench              bool
	downloadCockroach  bool
	// shared: --shared-database (checkOwnership).
	shared bool
	// restartDBEvery and restartDBDown: restarts of the embedded server.
	restartDBEvery, restartDBDown time.Duration
}

// summary is the outcome of a demo run; its JSON is the last line of stdout
// with --json.
type summary struct {
	OK             bool    `json:"ok"`
	RunID          string  `json:"run_id"`
	Engine         string  `json:"engine"`
	Embedded       bool    `json:"embedded"`
	Queue          string  `json:"queue"`
	Mode           string  `json:"mode"` // "in-process" or "processes"
	Workers        int     `json:"workers"`
	Concurrency    int     `json:"concurrency"`
	Parts          int     `json:"parts"`
	TaskTimeMS     float64 `json:"task_time_ms"`
	Enqueued       int64   `json:"enqueued"`
	Acked          int64   `json:"acked"`
	Duplicates     int64   `json:"duplicates"`
	Lost           int64   `json:"lost"`
	Pending        int64   `json:"pending"`
	Dead           int64   `json:"dead"`
	EnqueueSeconds float64 `json:"enqueue_seconds"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	ItemsPerSecond float64 `json:"items_per_second"`
	WorkersKilled  int     `json:"workers_killed"`
	DBRestarts     int     `json:"db_restarts"`
	// Claimed, PastLease and OldestClaimSeconds: see verdict.
	Claimed            int64   `json:"claimed"`
	PastLease          int64   `json:"claimed_past_lease"`
	OldestClaimSeconds float64 `json:"oldest_claim_age_seconds"`
	TimedOut           bool    `json:"timed_out"`
	Interrupted        bool    `json:"interrupted"`
	Error              string  `json:"error,omitempty"`
	// Known only when the workers run in-process.
	SessionsStarted *int64 `json:"sessions_started,omitempty"`
	SessionsLost    *int64 `json:"sessions_lost,omitempty"`
	ClaimsLost      *int64 `json:"claims_lost,omitempty"`
	// Retries counts serialization-failure retries by kind (in-process only).
	Retries map[string]int64 `json:"retries,omitempty"`
	// UrgentPriority is the urgent lane's threshold, if it was on.
	UrgentPriority *int `json:"urgent_priority,omitempty"`
}

func cmdRun(ctx context.Context, name string, args []string, out *cli.Console) error {
	c := runConfig{bench: name == "bench"}
	what := `Runs the demo: enqueues --items keyed items into --queue (divided into --parts
parts), works them off with --workers worker sessions in parts mode, each with
--concurrency handlers that wait --task-time and record the item in
demo_results inside the ack transaction, and then checks exactly-once against
demo_enqueued. Without --database-url (or DATABASE_URL) it starts an embedded
database server: cockroach from COCKROACH_BINARY or PATH (or one downloaded
earlier with --download-cockroach), else PostgreSQL's binaries from this
machine, in a temporary directory, stopped at the end. --download-cockroach
downloads the latest stable CockroachDB once (about 100 MB, into
~/.cache/crdbwork or CRDBWORK_CACHE_DIR) when no cockroach binary is found.

The demo works only on what it made. Given a database, it creates the
crdbwork schema and its own tables there if they are missing, and refuses
(exit 2, before writing anything) a --queue it did not create and, unless
--shared-database is given, a database that holds other queues. Measurements
live in the bench module: go -C bench run . fairness, go -C bench run . order.

With --kill-every, the workers are child processes ("demo work") and a random
one is killed with SIGKILL that often and replaced; its claims and parts come
back when its session expires (--heartbeat defaults to 250ms and --expiry to
1.5s then, so that failover is quick).

Prints a summary on stdout (with --json, one JSON object as the last line).
Exits 1 if an item was lost or acknowledged twice, or on --timeout.`
	if c.bench {
		what = `Runs the demo like "demo run" (same flags), without the progress line, and prints
only the JSON summary, whose items_per_second is the throughput, plus one
human line on stderr.`
	}
	f := prog.NewFlagSet(name, what)
	c.common.register(f, "PostgreSQL or CockroachDB URL; without one, an embedded server is started")
	c.workerSettings.register(f, "parts the queue is divided into (set before the enqueue, replacing a stored number)")
	f.IntVar(&c.items, "items", 10_000, 1, 100_000_000, "items to enqueue")
	c.limits.register(f, "the queue")
	f.IntVar(&c.workers, "workers", 4, 1, 1000, "worker sessions (in this process; child processes with --kill-every)")
	f.DurationVar(&c.killEvery, "kill-every", 0, true, "run the workers as child processes and SIGKILL a random one this often, starting a replacement (0: off)")
	f.DurationVar(&c.timeout, "timeout", 10*time.Minute, false, "give up if items remain this long after the workers started")
	f.BoolVar(&c.progress, "progress", !c.bench, "show a live progress line on stderr")
	f.DurationVar(&c.restartDBEvery, "restart-db-every", 0, true, "restart the embedded database server while the workers run, each time it has been up this long (needs the embedded server: no --database-url) (0: off)")
	f.DurationVar(&c.restartDBDown, "restart-db-down", 0, true, "with --restart-db-every: stop the server, wait this long, start it (0: a fast restart, pg_ctl restart -m fast)")
	f.BoolVar(&c.downloadCockroach, "download-cockroach", false, "without a database URL and a cockroach binary, download CockroachDB (needs network) instead of using PostgreSQL")
	f.BoolVar(&c.shared, "shared-database", false, sharedUsage)
	f.FlagOnly("shared-database")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if c.bench {
		c.json = true
	}
	if c.killEvery > 0 {
		if !f.IsSet("heartbeat") {
			c.heartbeat = 250 * time.Millisecond
		}
		if !f.IsSet("expiry") {
			c.expiry = max(1500*time.Millisecond, session.MinExpiryFactor*c.heartbeat)
		}
	}
	if err := c.validate(f); err != nil {
		return err
	}
	if c.restartDBEvery > 0 && c.databaseURL != "" {
		return f.UsageError("--restart-db-every restarts the embedded database server, which the demo starts only without --database-url or DATABASE_URL; it cannot restart a server it did not start")
	}
	if c.restartDBDown > 0 && c.restartDBEvery == 0 {
		return f.UsageError("--restart-db-down needs --restart-db-every")
	}
	log, watch, err := newLogger(c.logLevel, out)
	if err != nil {
		return err
	}
	defer log.Sync()
	r := &demoRun{c: &c, out: out, log: log, watch: watch, flags: f}
	return r.run(ctx)
}

// demoRun is one run of the demo.
type demoRun struct {
	c     *runConfig
	flags *cli.FlagSet // to tell the flags given from their defaults
	out   *cli.Console
	log   *zap.Logger
	// watch reports outages and recoveries once.
	watch *outageWatch
	// recent are the progress samples of the last rateWindow, oldest first.
	recent []progressSample
}

type progressSample struct {
	at   time.Time
	done int64
}

// rateWindow is how far back the progress line's rate looks.
const rateWindow = 5 * time.Second

// rate records done at now and returns the items per second over the last
// rateWindow (since the start while the run is younger).
func (r *demoRun) rate(now time.Time, done int64, start time.Time) float64 {
	if len(r.recent) == 0 {
		r.recent = append(r.recent, progressSample{at: start})
	}
	r.recent = append(r.recent, progressSample{at: now, done: done})
	for len(r.recent) > 2 && now.Sub(r.recent[1].at) >= rateWindow {
		r.recent = r.recent[1:]
	}
	first := r.recent[0]
	if d := now.Sub(first.at).Seconds(); d > 0 {
		return float64(done-first.done) / d
	}
	return 0
}

func (r *demoRun) run(ctx context.Context) (err error) {
	c := r.c
	s := summary{Queue: c.queue, Workers: c.workers, Concurrency: c.concurrency, Parts: c.parts,
		TaskTimeMS: float64(c.taskTime) / float64(time.Millisecond), Mode: "in-process"}
	if c.killEvery > 0 {
		s.Mode = "processes"
	}
	defer func() {
		if err != nil && ctx.Err() != nil && !isExit(err) {
			err = cli.Failf(130, "interrupted")
		}
	}()

	url := c.databaseURL
	var srv *dbserver.Server
	if url == "" {
		srv, err = r.startServer(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if err := srv.Stop(); err != nil {
				r.out.Errorf("demo: stopping the embedded %s server: %v", srv.Kind(), err)
			}
		}()
		s.Engine, s.Embedded = string(srv.Kind()), true
		url, err = srv.CreateDatabase(ctx, demoDatabase)
		if err != nil {
			return cli.Failf(1, "creating the database %s in the embedded %s server: %v", demoDatabase, srv.Kind(), err)
		}
	}
	pool, err := cli.Connect(ctx, url, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if s.Engine == "" {
		s.Engine = cli.EngineName(ctx, pool)
	}
	if err := openDemo(ctx, pool, "run", c.queue, c.shared, r.out); err != nil {
		return err
	}
	if err := partition.SetParts(ctx, pool, tables, c.queue, c.parts); err != nil {
		return cli.Failf(1, "%v", err)
	}
	if err := c.limits.apply(ctx, r.flags, pool, c.queue); err != nil {
		return cli.Failf(1, "setting the limits: %v", err)
	}

	runID := uuid.New()
	s.RunID = runID.String()
	enqStart := time.Now()
	if err := enqueueDemoShaped(ctx, pool, c.queue, runID, c.items, itemShape{}, nil); err != nil {
		return cli.Failf(1, "%v", err)
	}
	s.EnqueueSeconds = time.Since(enqStart).Seconds()
	if c.progress {
		r.out.Errorf("demo: enqueued %d items into queue %q (%d parts) in %s; starting %d workers (%s)",
			c.items, c.queue, c.parts, round(time.Since(enqStart)), c.workers, s.Mode)
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go r.watch.run(wctx, pool)
	var ms *metricsServer
	if c.metricsAddr != "" {
		// With --kill-every the workers are other processes: this server
		// has the database gauges only.
		if ms, err = serveMetrics(c.metricsAddr, pool, r.out); err != nil {
			return err
		}
		defer ms.close()
	}
	var group workerGroup
	if c.killEvery > 0 {
		group, err = startFleet(c, url, r.out)
	} else {
		group, err = startInProcess(ctx, c, url, r.log, ms)
	}
	if err != nil {
		return err
	}
	var restarter *dbRestarter
	if c.restartDBEvery > 0 {
		restarter = startRestarter(srv, c.restartDBEvery, c.restartDBDown, r.out)
	}
	start := time.Now()
	outcome, runErr := r.wait(ctx, pool, group, start)
	var restartErr error
	s.DBRestarts, restartErr = restarter.finish()
	if runErr == nil && restartErr != nil {
		runErr = restartErr
	}
	if s.DBRestarts > 0 {
		// Idle connections opened before the last restart are dead: the
		// server ended them (57P01). Drop them, so that verify's queries
		// open new ones instead of failing on the first use of an old one.
		pool.Reset()
	}
	elapsed := time.Since(start)
	if outcome.finished > 0 {
		elapsed = outcome.finished
	}
	group.stop(20 * time.Second)
	s.WorkersKilled = group.killed()
	group.counters(&s)
	s.TimedOut, s.Interrupted = outcome.timedOut, outcome.interrupted
	if runErr != nil {
		s.Error = runErr.Error()
	}

	// Verify with a fresh context: an interrupted run still reports.
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	v, err := check(vctx, pool, checkFilter{runID: &runID})
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	s.Enqueued, s.Acked, s.Duplicates, s.Lost, s.Pending, s.Dead = v.Enqueued, v.Acked, v.Duplicates, v.Lost, v.Pending, v.Dead
	s.Claimed, s.PastLease, s.OldestClaimSeconds = v.Claimed, v.PastLease, v.OldestClaimSeconds
	s.ElapsedSeconds = elapsed.Seconds()
	if elapsed > 0 {
		s.ItemsPerSecond = float64(v.Acked) / elapsed.Seconds()
	}
	s.OK = v.ok() && !s.TimedOut && !s.Interrupted && runErr == nil
	if c.urgentLane {
		s.UrgentPriority = &c.urgentPriority
	}
	r.printSummary(s)
	switch {
	case s.Interrupted:
		return cli.ExitCode(130)
	case !s.OK:
		return cli.ExitCode(1)
	}
	return nil
}

func isExit(err error) bool {
	var ee *cli.ExitError
	var code cli.ExitCode
	return errors.As(err, &ee) || errors.As(err, &code)
}

// startServer starts the embedded database server.
func (r *demoRun) startServer(ctx context.Context) (*dbserver.Server, error) {
	logf := func(string, ...any) {}
	if verbose(r.c.logLevel) {
		logf = func(format string, args ...any) { r.out.Errorf("dbserver: "+format, args...) }
	}
	r.out.Errorf("demo: no --database-url or DATABASE_URL given: starting an embedded database server")
	if r.c.downloadCockroach {
		// The download is worth a line even when not verbose.
		logf = func(format string, args ...any) { r.out.Errorf("dbserver: "+format, args...) }
	}
	srv, err := dbserver.Start(ctx, dbserver.Options{Logf: logf, Download: r.c.downloadCockroach})
	if err != nil {
		if errors.Is(err, dbserver.ErrNoServer) {
			return nil, &cli.ExitError{Code: 2, Msg: err.Error(), Raw: true}
		}
		if ctx.Err() != nil {
			return nil, cli.Failf(130, "interrupted")
		}
		return nil, cli.Failf(1, "starting the embedded database server: %v", err)
	}
	r.out.Errorf("demo: started an embedded %s server (%s); it is stopped at the end", srv.Kind(), cli.RedactURL(srv.URL(demoDatabase)))
	return srv, nil
}

type waitOutcome struct {
	finished    time.Duration // when the last item went, since the start
	timedOut    bool
	interrupted bool
}

// countFailFor is how long counting the items left may keep failing
// before the run gives up.
const countFailFor = 30 * time.Second

// pollEvery is how often the demo reads the workers' own counters (no
// query); it bounds the error of the measured elapsed time.
const pollEvery = 50 * time.Millisecond

// countEvery is how often the demo counts the items left in the database
// while the workers' counters do not say they are all done: the counters
// of killed worker processes lag (their last report), and items can leave
// the queue in ways no worker counts, so the count is what ends a run, but
// once a second keeps no backend busy.
const countEvery = time.Second

// confirmEvery is how often the demo counts the items left while the
// workers' counters say every item is done but the count still finds some.
const confirmEvery = 250 * time.Millisecond

// wait waits until the queue is empty, the timeout hits, ctx is cancelled
// or the workers fail, showing progress. It reads the workers' counters
// every pollEvery and counts the items left in the database only when the
// counters say that every item is done (to confirm it), or every
// countEvery.
func (r *demoRun) wait(ctx context.Context, pool *pgxpool.Pool, group workerGroup, start time.Time) (waitOutcome, error) {
	c := r.c
	var o waitOutcome
	timeout := time.NewTimer(c.timeout)
	defer timeout.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var lastShown, lastCount time.Time
	var lastErr error
	failures := 0
	var failingSince time.Time
	counted := int64(-1) // the last count of the items left (-1: none yet)
	// remaining is what is known of the items left: the last count, or
	// less if the workers' counters say so since.
	remaining := func() int64 {
		left := max(int64(c.items)-group.settled(), 0)
		if counted >= 0 {
			left = min(left, counted)
		}
		return left
	}
	for {
		select {
		case <-ctx.Done():
			o.interrupted = true
			r.showProgress(pool, group, start, remaining(), true)
			r.out.EndProgress()
			return o, nil
		case <-timeout.C:
			o.timedOut = true
			// The items left as the database counts them now (the
			// counters may be ahead of it); what is known if it fails.
			left := remaining()
			if n, err := countItems(ctx, pool, c.queue); err == nil {
				left = n
			}
			r.showProgress(pool, group, start, left, true)
			r.out.EndProgress()
			r.out.Errorf("demo: timed out after %v with %d items left", c.timeout, left)
			return o, nil
		case err := <-group.failed():
			r.out.EndProgress()
			return o, err
		case <-tick.C:
		}
		since := time.Since(lastCount)
		if since >= countEvery || (group.settled() >= int64(c.items) && since >= confirmEvery) {
			lastCount = time.Now()
			n, err := countItems(ctx, pool, c.queue)
			if err != nil {
				if ctx.Err() != nil {
					continue
				}
				if failures == 0 {
					failingSince = time.Now()
				}
				failures++
				lastErr = err
				// A database restart (--restart-db-every) or outage takes
				// seconds: give up only when counting fails for longer.
				if failures >= 3 && time.Since(failingSince) >= countFailFor {
					r.out.EndProgress()
					return o, fmt.Errorf("counting the items left keeps failing: %w", lastErr)
				}
				continue
			}
			failures = 0
			counted = n
			if n == 0 {
				o.finished = time.Since(start)
				r.showProgress(pool, group, start, 0, true)
				r.out.EndProgress()
				return o, nil
			}
		}
		if c.progress && counted >= 0 && time.Since(lastShown) >= 500*time.Millisecond {
			lastShown = time.Now()
			r.showProgress(pool, group, start, remaining(), false)
		}
	}
}

// showProgress prints the progress line.
func (r *demoRun) showProgress(pool *pgxpool.Pool, group workerGroup, start time.Time, remaining int64, force bool) {
	c := r.c
	if !c.progress || remaining < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Live: a heartbeat within the last two heartbeat intervals; a killed
	// worker drops out of the count long before its session expires.
	sessions := "?"
	if infos, err := session.List(ctx, pool, tables); err == nil {
		n := 0
		for _, in := range infos {
			if in.SinceHeartbeat <= 2*c.heartbeat {
				n++
			}
		}
		sessions = fmt.Sprint(n)
	}
	done := max(int64(c.items)-remaining, 0)
	now := time.Now()
	elapsed := now.Sub(start)
	rate := r.rate(now, done, start)
	line := fmt.Sprintf("demo: %d/%d done, %.0f items/s over %v, %s live sessions", done, c.items, rate,
		min(rateWindow, elapsed.Round(time.Second)), sessions)
	if c.killEvery > 0 {
		line += fmt.Sprintf(", %d killed", group.killed())
	}
	if elapsed >= time.Minute {
		line += fmt.Sprintf(", %s", elapsed.Round(time.Second))
	} else {
		line += fmt.Sprintf(", %s", elapsed.Round(100*time.Millisecond))
	}
	r.out.Progress(line, force)
}

// countItems counts the items left in queue.
func countItems(ctx context.Context, pool *pgxpool.Pool, queue string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return stmts.VerifyCountItems(ctx, pool, queue)
}

// printSummary prints the summary: a table, or one JSON line.
func (r *demoRun) printSummary(s summary) {
	if r.c.bench {
		r.out.Errorf("bench: %d items in %.2fs: %.0f items/s (%s, %d workers × %d handlers, %d parts, task time %v)",
			s.Acked, s.ElapsedSeconds, s.ItemsPerSecond, s.Engine, s.Workers, s.Concurrency, s.Parts, r.c.taskTime)
	}
	if r.c.json {
		cli.PrintJSON(r.out, s)
		return
	}
	var b strings.Builder
	v := verdict{Enqueued: s.Enqueued, Acked: s.Acked, Duplicates: s.Duplicates, Lost: s.Lost, Pending: s.Pending, Dead: s.Dead}
	switch {
	case s.Interrupted:
		b.WriteString("crdbwork demo: INTERRUPTED — " + verdictLine(v) + "\n")
	case s.TimedOut:
		b.WriteString("crdbwork demo: TIMED OUT — " + verdictLine(v) + "\n")
	case s.OK:
		b.WriteString("crdbwork demo: PASS — every enqueued item was acknowledged exactly once\n")
	default:
		b.WriteString("crdbwork demo: FAIL — " + verdictLine(v) + "\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	engine := s.Engine
	if s.Embedded {
		engine += " (embedded)"
	}
	fmt.Fprintf(tw, "  engine\t%s\n", engine)
	fmt.Fprintf(tw, "  workers\t%d %s × %d handlers, %d parts, task time %v\n", s.Workers, map[bool]string{true: "processes", false: "in-process sessions"}[s.Mode == "processes"], s.Concurrency, s.Parts, r.c.taskTime)
	fmt.Fprintf(tw, "  enqueued\t%d (in %.2fs)\n", s.Enqueued, s.EnqueueSeconds)
	fmt.Fprintf(tw, "  acked\t%d\n", s.Acked)
	fmt.Fprintf(tw, "  duplicates\t%d\n", s.Duplicates)
	fmt.Fprintf(tw, "  lost\t%d\n", s.Lost)
	fmt.Fprintf(tw, "  pending\t%d\n", s.Pending)
	fmt.Fprintf(tw, "  dead\t%d\n", s.Dead)
	if s.Claimed > 0 {
		fmt.Fprintf(tw, "  claimed\t%d (%d past their lease; oldest claim %s old)\n", s.Claimed, s.PastLease, round(time.Duration(s.OldestClaimSeconds*float64(time.Second))))
	}
	if s.DBRestarts > 0 {
		fmt.Fprintf(tw, "  database restarts\t%d (every %v)\n", s.DBRestarts, r.c.restartDBEvery)
	}
	if s.Mode == "processes" {
		fmt.Fprintf(tw, "  workers killed\t%d (SIGKILL, every %v)\n", s.WorkersKilled, r.c.killEvery)
	}
	if s.SessionsStarted != nil {
		fmt.Fprintf(tw, "  sessions\t%d started, %d lost; %d claims lost\n", *s.SessionsStarted, *s.SessionsLost, *s.ClaimsLost)
	}
	if len(s.Retries) > 0 {
		fmt.Fprintf(tw, "  retries\t%s\n", formatCounts(s.Retries))
	}
	if s.UrgentPriority != nil {
		fmt.Fprintf(tw, "  urgent lane\titems with priority <= %d claimed by any worker\n", *s.UrgentPriority)
	}
	fmt.Fprintf(tw, "  elapsed\t%.2fs\n", s.ElapsedSeconds)
	fmt.Fprintf(tw, "  throughput\t%.0f items/s\n", s.ItemsPerSecond)
	fmt.Fprintf(tw, "  run id\t%s\n", s.RunID)
	if s.Error != "" {
		fmt.Fprintf(tw, "  error\t%s\n", cli.OneLine(s.Error))
	}
	tw.Flush()
	r.out.Printf("%s", b.String())
}

// formatCounts writes counts as "ack 3, claim 1", by name, skipping zeros.
func formatCounts(m map[string]int64) string {
	var names []string
	for k, v := range m {
		if v != 0 {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
