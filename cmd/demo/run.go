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

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/internal/order"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
)

// demoDatabase is the database the demo creates in the embedded server.
const demoDatabase = "crdbwork_demo"

type runConfig struct {
	common
	workerSettings
	limits limitFlags
	tenantConfig
	items, workers     int
	killEvery, timeout time.Duration
	progress           bool
	bench              bool
	// measureOrder counts the PEI of every claimed item (--measure-order);
	// priorities is the number of random priorities items get.
	measureOrder      bool
	priorities        int
	downloadCockroach bool
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
	// With --tenants: the tenant figures (tenants.go).
	*TenantReport
	// With --measure-order: the popped element index (PEI) of the claimed
	// items (see "How relaxed is the order" in the README), over PEICount
	// items; PEIUrgent* over the urgent items (with --urgent-priority).
	PEICount        *int     `json:"pei_count,omitempty"`
	PEIMedian       *int64   `json:"pei_median,omitempty"`
	PEIMean         *float64 `json:"pei_mean,omitempty"`
	PEIP90          *int64   `json:"pei_p90,omitempty"`
	PEIP99          *int64   `json:"pei_p99,omitempty"`
	PEIMax          *int64   `json:"pei_max,omitempty"`
	PEIUrgentCount  *int     `json:"pei_urgent_count,omitempty"`
	PEIUrgentMedian *int64   `json:"pei_urgent_median,omitempty"`
	PEIUrgentP99    *int64   `json:"pei_urgent_p99,omitempty"`
	// PEIErrors counts claims whose count failed (their items have no PEI).
	PEIErrors *int `json:"pei_errors,omitempty"`
	// UrgentPriority is the urgent lane's threshold, if it was on.
	UrgentPriority *int `json:"urgent_priority,omitempty"`
}

func cmdRun(ctx context.Context, name string, args []string, out *console) error {
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
	f := newFlagSet(name, what)
	c.common.register(f, "PostgreSQL or CockroachDB URL; without one, an embedded server is started")
	c.workerSettings.register(f, "parts the queue is divided into (set before the enqueue, replacing a stored number)")
	f.intVar(&c.items, "items", 10_000, 1, 100_000_000, "items to enqueue")
	c.limits.register(f, "the queue")
	f.intVar(&c.workers, "workers", 4, 1, 1000, "worker sessions (in this process; child processes with --kill-every)")
	f.durationVar(&c.killEvery, "kill-every", 0, true, "run the workers as child processes and SIGKILL a random one this often, starting a replacement (0: off)")
	f.durationVar(&c.timeout, "timeout", 10*time.Minute, false, "give up if items remain this long after the workers started")
	f.boolVar(&c.progress, "progress", !c.bench, "show a live progress line on stderr")
	f.durationVar(&c.restartDBEvery, "restart-db-every", 0, true, "restart the embedded database server this often while the workers run (needs the embedded server: no --database-url) (0: off)")
	f.durationVar(&c.restartDBDown, "restart-db-down", 0, true, "with --restart-db-every: stop the server, wait this long, start it (0: a fast restart, pg_ctl restart -m fast)")
	c.tenantConfig.register(f)
	f.boolVar(&c.anyPart, "any-part", false, "the workers claim in any part (no part ownership) instead of their own parts")
	f.boolVar(&c.measureOrder, "measure-order", false, "measure how relaxed the claim order is: for each claimed item, count right after its claim the claimable items before it in the queue's strict order (its popped element index, PEI); prints the median, mean, p90 and p99 (needs in-process workers: no --kill-every)")
	f.intVar(&c.priorities, "priorities", 1, 1, 1<<30, "give items uniformly random priorities in [0, N) (1: all 0; with --measure-order and not given: 1000)")
	f.boolVar(&c.downloadCockroach, "download-cockroach", false, "without a database URL and a cockroach binary, download CockroachDB (needs network) instead of using PostgreSQL")
	f.boolVar(&c.shared, "shared-database", false, sharedUsage)
	f.flagOnly("shared-database")
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if c.bench {
		c.json = true
	}
	if c.killEvery > 0 {
		if !f.isSet("heartbeat") {
			c.heartbeat = 250 * time.Millisecond
		}
		if !f.isSet("expiry") {
			c.expiry = max(1500*time.Millisecond, session.MinExpiryFactor*c.heartbeat)
		}
	}
	if err := c.validate(f); err != nil {
		return err
	}
	if err := c.tenantConfig.validateTenants(f, c.items, c.killEvery); err != nil {
		return err
	}
	if c.tenants > 0 && (c.measureOrder || f.isSet("priorities")) {
		return f.usageError("--tenants gives every item priority 0 and measures waits, not the order: it cannot be combined with --measure-order or --priorities")
	}
	if c.anyPart && c.killEvery > 0 {
		return f.usageError("--any-part runs the workers in this process: it cannot be combined with --kill-every")
	}
	if c.restartDBEvery > 0 && c.databaseURL != "" {
		return f.usageError("--restart-db-every restarts the embedded database server, which the demo starts only without --database-url or DATABASE_URL; it cannot restart a server it did not start")
	}
	if c.measureOrder && c.killEvery > 0 {
		return f.usageError("--measure-order counts in the workers' claim loops, in this process: it cannot be used with --kill-every (child processes)")
	}
	if c.measureOrder && !f.isSet("priorities") {
		c.priorities = 1000
	}
	if c.restartDBDown > 0 && c.restartDBEvery == 0 {
		return f.usageError("--restart-db-down needs --restart-db-every")
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
	flags *flagSet // to tell the flags given from their defaults
	out   *console
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
			err = failf(130, "interrupted")
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
				r.out.errorf("demo: stopping the embedded %s server: %v", srv.Kind(), err)
			}
		}()
		s.Engine, s.Embedded = string(srv.Kind()), true
		url, err = srv.CreateDatabase(ctx, demoDatabase)
		if err != nil {
			return failf(1, "creating the database %s in the embedded %s server: %v", demoDatabase, srv.Kind(), err)
		}
	}
	pool, err := connect(ctx, url, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if s.Engine == "" {
		s.Engine = engineName(ctx, pool)
	}
	if err := openDemo(ctx, pool, "run", c.queue, c.shared, r.out); err != nil {
		return err
	}
	if err := partition.SetParts(ctx, pool, tables, c.queue, c.parts); err != nil {
		return failf(1, "%v", err)
	}
	if err := c.limits.apply(ctx, r.flags, pool, c.queue); err != nil {
		return failf(1, "setting the limits: %v", err)
	}

	runID := uuid.New()
	s.RunID = runID.String()
	enqStart := time.Now()
	var tl *tenantLoad
	if c.tenants > 0 {
		if tl, err = startTenants(ctx, pool, c, runID); err != nil {
			return failf(1, "%v", err)
		}
	} else if err := enqueueDemoShaped(ctx, pool, c.queue, runID, c.items, itemShape{priorities: c.priorities}, nil); err != nil {
		return failf(1, "%v", err)
	}
	s.EnqueueSeconds = time.Since(enqStart).Seconds()
	if c.progress {
		r.out.errorf("demo: enqueued %d items into queue %q (%d parts) in %s; starting %d workers (%s)",
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
	var meter *order.Meter
	if c.measureOrder {
		// Its own connections: counting must not wait behind the demo's
		// progress queries, nor take the workers' connections.
		mpool, err := connect(ctx, url, min(c.workers, 8))
		if err != nil {
			return err
		}
		defer mpool.Close()
		if meter, err = order.NewMeter(mpool, tables, c.queue); err != nil {
			return failf(1, "%v", err)
		}
		c.onClaim = func(ctx context.Context, items []claim.Item) {
			// A failed count (a stopping worker, a database blip) leaves
			// its items out of the figures; PEIErrors says how many.
			_, _ = meter.Observe(ctx, items)
		}
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
	if tl != nil {
		if err := tl.startTrickle(ctx, url, c.queue, runID, r.out); err != nil {
			restarter.finish()
			group.stop(20 * time.Second)
			return failf(1, "%v", err)
		}
	}
	outcome, runErr := r.wait(ctx, pool, group, start)
	tl.stopTrickle()
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
		return failf(1, "%v", err)
	}
	s.Enqueued, s.Acked, s.Duplicates, s.Lost, s.Pending, s.Dead = v.Enqueued, v.Acked, v.Duplicates, v.Lost, v.Pending, v.Dead
	s.Claimed, s.PastLease, s.OldestClaimSeconds = v.Claimed, v.PastLease, v.OldestClaimSeconds
	s.ElapsedSeconds = elapsed.Seconds()
	if elapsed > 0 {
		s.ItemsPerSecond = float64(v.Acked) / elapsed.Seconds()
	}
	if tl != nil {
		s.TenantReport = tl.report()
	}
	s.OK = v.ok() && !s.TimedOut && !s.Interrupted && runErr == nil
	if c.urgentLane {
		s.UrgentPriority = &c.urgentPriority
	}
	if meter != nil {
		addPEI(&s, meter, c)
	}
	r.printSummary(s)
	switch {
	case s.Interrupted:
		return exitCode(130)
	case !s.OK:
		return exitCode(1)
	}
	return nil
}

func isExit(err error) bool {
	var ee *exitError
	var code exitCode
	return errors.As(err, &ee) || errors.As(err, &code)
}

// startServer starts the embedded database server.
func (r *demoRun) startServer(ctx context.Context) (*dbserver.Server, error) {
	logf := func(string, ...any) {}
	if verbose(r.c.logLevel) {
		logf = func(format string, args ...any) { r.out.errorf("dbserver: "+format, args...) }
	}
	r.out.errorf("demo: no --database-url or DATABASE_URL given: starting an embedded database server")
	if r.c.downloadCockroach {
		// The download is worth a line even when not verbose.
		logf = func(format string, args ...any) { r.out.errorf("dbserver: "+format, args...) }
	}
	srv, err := dbserver.Start(ctx, dbserver.Options{Logf: logf, Download: r.c.downloadCockroach})
	if err != nil {
		if errors.Is(err, dbserver.ErrNoServer) {
			return nil, &exitError{code: 2, msg: err.Error(), raw: true}
		}
		if ctx.Err() != nil {
			return nil, failf(130, "interrupted")
		}
		return nil, failf(1, "starting the embedded database server: %v", err)
	}
	r.out.errorf("demo: started an embedded %s server (%s); it is stopped at the end", srv.Kind(), redactURL(srv.URL(demoDatabase)))
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

// pollEvery is how often the demo counts the items left; it bounds the
// error of the measured elapsed time.
const pollEvery = 50 * time.Millisecond

// wait polls the items table until the queue is empty, the timeout hits,
// ctx is cancelled or the workers fail, showing progress.
func (r *demoRun) wait(ctx context.Context, pool *pgxpool.Pool, group workerGroup, start time.Time) (waitOutcome, error) {
	c := r.c
	var o waitOutcome
	timeout := time.NewTimer(c.timeout)
	defer timeout.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var lastShown time.Time
	var lastErr error
	failures := 0
	var failingSince time.Time
	remaining := int64(-1)
	for {
		select {
		case <-ctx.Done():
			o.interrupted = true
			r.showProgress(pool, group, start, remaining, true)
			r.out.endProgress()
			return o, nil
		case <-timeout.C:
			o.timedOut = true
			r.showProgress(pool, group, start, remaining, true)
			r.out.endProgress()
			r.out.errorf("demo: timed out after %v with %d items left", c.timeout, remaining)
			return o, nil
		case err := <-group.failed():
			r.out.endProgress()
			return o, err
		case <-tick.C:
		}
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
			if failures >= 25 && time.Since(failingSince) >= countFailFor {
				r.out.endProgress()
				return o, fmt.Errorf("counting the items left keeps failing: %w", lastErr)
			}
			continue
		}
		failures = 0
		remaining = n
		if n == 0 {
			o.finished = time.Since(start)
			r.showProgress(pool, group, start, 0, true)
			r.out.endProgress()
			return o, nil
		}
		if c.progress && time.Since(lastShown) >= 500*time.Millisecond {
			lastShown = time.Now()
			r.showProgress(pool, group, start, n, false)
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
	r.out.progress(line, force)
}

// countItems counts the items left in queue.
func countItems(ctx context.Context, pool *pgxpool.Pool, queue string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return store.CountItems(ctx, pool, queue)
}

// printSummary prints the summary: a table, or one JSON line.
func (r *demoRun) printSummary(s summary) {
	if r.c.bench {
		r.out.errorf("bench: %d items in %.2fs: %.0f items/s (%s, %d workers × %d handlers, %d parts, task time %v)",
			s.Acked, s.ElapsedSeconds, s.ItemsPerSecond, s.Engine, s.Workers, s.Concurrency, s.Parts, r.c.taskTime)
	}
	if r.c.json {
		printJSON(r.out, s)
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
	printTenantLines(tw, s.TenantReport)
	if s.UrgentPriority != nil {
		fmt.Fprintf(tw, "  urgent lane\titems with priority <= %d claimed by any worker\n", *s.UrgentPriority)
	}
	if s.PEICount != nil {
		fmt.Fprintf(tw, "  order (PEI)\tmedian %d, mean %.1f, p90 %d, p99 %d, max %d over %d claimed items (priorities 0..%d)\n",
			*s.PEIMedian, *s.PEIMean, *s.PEIP90, *s.PEIP99, *s.PEIMax, *s.PEICount, r.c.priorities-1)
		if s.PEIUrgentCount != nil {
			fmt.Fprintf(tw, "  urgent (PEI)\tmedian %d, p99 %d over %d urgent items\n", *s.PEIUrgentMedian, *s.PEIUrgentP99, *s.PEIUrgentCount)
		}
		if *s.PEIErrors > 0 {
			fmt.Fprintf(tw, "  order errors\t%d claims not counted\n", *s.PEIErrors)
		}
	}
	fmt.Fprintf(tw, "  elapsed\t%.2fs\n", s.ElapsedSeconds)
	fmt.Fprintf(tw, "  throughput\t%.0f items/s\n", s.ItemsPerSecond)
	fmt.Fprintf(tw, "  run id\t%s\n", s.RunID)
	if s.Error != "" {
		fmt.Fprintf(tw, "  error\t%s\n", oneLine(s.Error))
	}
	tw.Flush()
	r.out.printf("%s", b.String())
}

// addPEI puts the meter's figures in the summary.
func addPEI(s *summary, m *order.Meter, c *runConfig) {
	a := m.Summary()
	errs := m.Errors()
	s.PEICount, s.PEIMedian, s.PEIMean, s.PEIP90, s.PEIP99, s.PEIMax, s.PEIErrors = &a.Count, &a.Median, &a.Mean, &a.P90, &a.P99, &a.Max, &errs
	if c.urgentLane {
		u := m.SummaryWhere(func(p int) bool { return p <= c.urgentPriority })
		s.PEIUrgentCount, s.PEIUrgentMedian, s.PEIUrgentP99 = &u.Count, &u.Median, &u.P99
	}
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
