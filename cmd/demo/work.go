package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/schedule"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// defaultParts is the number of parts every demo command gives a queue that
// has none stored yet.
const defaultParts = 16

// defaultConcurrency is the handlers per worker of `demo run` and `demo work`:
// handlers hold no connection, so more of them cost a goroutine each, and
// claims and ack transactions then carry more items (see the README's
// performance section).
const defaultConcurrency = 256

// insertResults writes the result rows of one ack transaction in one
// statement (the worker's BatchRecord hook).
const insertResults = `INSERT INTO demo_results (item_id, session_id, part, attempt)
SELECT * FROM unnest($1::UUID[], $2::UUID[], $3::BIGINT[], $4::BIGINT[])`

// demoHandler "works" for taskTime (giving up when ctx ends) and hands its
// item to recordResults, which writes the results of every item of an ack
// transaction in one INSERT inside that transaction.
func demoHandler(taskTime time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if taskTime > 0 {
			t := time.NewTimer(taskTime)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
		return nil, worker.RecordValue(ctx, it)
	}
}

// recordResults is the demo's claim.BatchRecord: one result row per acked
// item, all in one statement. Ids go as [16]byte: pgx encodes uuid.UUID
// through its string form (driver.Valuer), which costs more than the insert.
func recordResults(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
	ids := make([][16]byte, len(acked))
	sessions := make([][16]byte, len(acked))
	parts := make([]int64, len(acked))
	attempts := make([]int64, len(acked))
	for i, r := range acked {
		it := r.Value.(claim.Item)
		ids[i], sessions[i], parts[i], attempts[i] = it.ID, it.Session, int64(it.Part), int64(it.Attempt)
	}
	// Queued: it goes to the server with the ack's COMMIT, one round trip.
	return claim.Exec(insertResults, ids, sessions, parts, attempts)(ctx, tx)
}

// workerSettings are the settings shared by `run` and `work`.
type workerSettings struct {
	parts       int
	concurrency int
	ackBatch    int
	taskTime    time.Duration
	heartbeat   time.Duration
	expiry      time.Duration
	rebalance   time.Duration
	metricsAddr string
	// wrap, if not nil, wraps the demo handler (demo work --record-runs).
	wrap func(worker.Handler) worker.Handler
	// anyPart runs the worker without parts (any session claims any
	// item): demo work --any-part.
	anyPart bool
	// urgentPriority is the urgent lane's threshold, used when urgentLane
	// (--urgent-priority given).
	urgentPriority int
	urgentLane     bool
	// wake is --wake: how idle workers learn of other processes' items.
	wake string
}

// wakeModes are --wake's values.
var wakeModes = map[string]worker.WakeMode{"auto": worker.WakeAuto, "listen": worker.WakeListen, "probe": worker.WakeProbe}

// register adds the flags; partsUsage says what --parts does for the command.
func (w *workerSettings) register(f *cli.FlagSet, partsUsage string) {
	f.IntVar(&w.parts, "parts", defaultParts, 1, partition.MaxParts, partsUsage)
	f.IntVar(&w.concurrency, "concurrency", defaultConcurrency, 1, 10_000, "handlers running at once in each worker")
	f.IntVar(&w.ackBatch, "ack-batch", worker.DefaultMaxAckBatch, 1, 10_000, "most items acked in one transaction (1: each item in its own)")
	f.DurationVar(&w.taskTime, "task-time", 2*time.Millisecond, true, "time the demo handler spends on each item")
	f.DurationVar(&w.heartbeat, "heartbeat", session.DefaultHeartbeat, false, "session heartbeat interval")
	f.DurationVar(&w.expiry, "expiry", session.DefaultExpiry, false, "session expiry: a session that has not heartbeaten for this long is deleted by its peers")
	f.DurationVar(&w.rebalance, "rebalance", 500*time.Millisecond, false, "interval between part rebalances")
	f.IntVar(&w.urgentPriority, "urgent-priority", 0, math.MinInt32, math.MaxInt32, "turn the urgent lane on: items with priority <= N are claimed by any worker with a free handler, not only by their part's owner (not given: off)")
	f.StringVar(&w.metricsAddr, "metrics-addr", "", "HOST:PORT", "serve Prometheus metrics at http://HOST:PORT/metrics (off when empty; :0 picks a free port)", nil)
	f.StringVar(&w.wake, "wake", "auto", "MODE", "how idle workers learn of items other processes enqueue: auto (LISTEN on PostgreSQL, the idle probe on CockroachDB), listen or probe (the idle probe on either engine, as on CockroachDB)", func(s string) error {
		if _, ok := wakeModes[s]; !ok {
			return errors.New("must be auto, listen or probe")
		}
		return nil
	})
}

// validate checks what the flags alone cannot.
func (w *workerSettings) validate(f *cli.FlagSet) error {
	w.urgentLane = f.IsSet("urgent-priority")
	if w.expiry < session.MinExpiryFactor*w.heartbeat {
		return f.UsageError("--expiry %v must be at least %d heartbeats (%v): raise --expiry or lower --heartbeat",
			w.expiry, session.MinExpiryFactor, session.MinExpiryFactor*w.heartbeat)
	}
	return nil
}

// poolSize is the pool connections one worker needs, whatever its
// concurrency (worker.PoolConns: claims, settle goroutines, maintenance,
// rebalancer; the heartbeat has one more of its own, outside the pool).
func (w *workerSettings) poolSize() int {
	return worker.PoolConns(worker.Options{Parts: w.parts, MaxAckBatch: w.ackBatch})
}

// configurePool prepares a worker pool's configuration for these settings
// (worker.ConfigurePool): the server ends a transaction idle longer than
// --expiry (idle_in_transaction_session_timeout, a startup parameter), so
// that a frozen worker's open transaction cannot hold its locks, and its
// peers' reapers of expired sessions, for ever.
func (w *workerSettings) configurePool(cfg *pgxpool.Config) error {
	return worker.ConfigurePool(cfg, worker.Options{Session: session.Tuning{Heartbeat: w.heartbeat, Expiry: w.expiry}})
}

// newWorker returns a parts-mode worker with the demo handler.
func (w *workerSettings) newWorker(db worker.DB, queue, name string, log *zap.Logger, m *metricsServer) (*worker.Worker, error) {
	var obs worker.Observer
	if m != nil {
		obs = m.collector
	}
	h := demoHandler(w.taskTime)
	if w.wrap != nil {
		h = w.wrap(h)
	}
	parts := w.parts
	if w.anyPart {
		parts = 0
	}
	q, err := claim.New(db, claim.Options{Queue: queue, Tables: tables})
	if err != nil {
		return nil, err
	}
	wk, err := worker.New(q, h, worker.Options{
		Concurrency:     w.concurrency,
		MaxAckBatch:     w.ackBatch,
		Parts:           parts,
		ShutdownTimeout: 5 * time.Second,
		Session:         session.Tuning{Heartbeat: w.heartbeat, Expiry: w.expiry},
		Name:            name,
		Partition:       partition.Tuning{Poll: w.rebalance},
		Logger:          log.With(zap.String("worker", name)),
		Observer:        obs,
		BatchRecord:     recordResults,
		UrgentLane:      w.urgentLane,
		UrgentPriority:  w.urgentPriority,
		Wake:            wakeModes[w.wake],
	})
	if err == nil && m != nil {
		m.collector.AddWorker(wk)
	}
	return wk, err
}

type workConfig struct {
	common
	workerSettings
	name        string
	reportEvery time.Duration
	waitDB      time.Duration
	// recordRuns is --record-runs, a flag of demotest builds only
	// (record_demotest.go).
	recordRuns bool
	every      time.Duration
	skipMissed bool
	shared     bool
}

// workTestFlags and workTestSetup, set only in demotest builds
// (record_demotest.go), add the tests' flags to `demo work` and act on them
// before the worker starts (the returned function runs when it stopped).
var (
	workTestFlags func(f *cli.FlagSet, c *workConfig)
	workTestSetup func(ctx context.Context, c *workConfig, out *cli.Console) (func(), error)
)

// demoSchedule is the name of the periodic schedule of `demo work --every`.
const demoSchedule = "demo-every"

// statsPrefix starts the lines of --report-every on stderr.
const statsPrefix = "demo-work-stats "

// workStats are the counters of one `demo work` process, as reported with
// --report-every and read by `demo run --kill-every`.
type workStats struct {
	Sessions     int64            `json:"sessions"`
	SessionsLost int64            `json:"sessions_lost"`
	ClaimsLost   int64            `json:"claims_lost"`
	Acked        int64            `json:"acked"`
	Retries      map[string]int64 `json:"retries"`
}

func statsOf(st worker.Stats) workStats {
	r := workStats{Sessions: st.Sessions, SessionsLost: st.SessionsLost, ClaimsLost: st.LostClaims, Acked: st.Acked,
		Retries: map[string]int64{}}
	for k, v := range st.Retries {
		r.Retries[k] = v
	}
	r.Retries["parts"] += st.Parts.Retries
	return r
}

func cmdWork(ctx context.Context, name string, args []string, out *cli.Console) error {
	var c workConfig
	f := prog.NewFlagSet(name, `Runs one worker process on --queue in parts mode (--any-part: without parts)
until SIGINT or SIGTERM, then stops gracefully (in-flight items finish, the
session is deleted, which releases its parts at once). The handler waits
--task-time and records the item in demo_results inside the ack transaction.
A final line with the worker's counters goes to stderr. Its connections end a transaction left idle longer
than --expiry (idle_in_transaction_session_timeout), so that a frozen
worker's open transaction cannot hold its locks, and its peers' reapers, for
ever. It works only on a queue the demo created (or a new one, which it
creates), and creates the crdbwork schema and the demo's tables if they are
missing; a database holding other queues needs --shared-database.`)
	c.common.register(f, urlRequired)
	c.workerSettings.register(f, "parts the queue is divided into, if it has no stored number yet (a stored number wins, with a warning)")
	host, _ := os.Hostname()
	f.DurationVar(&c.reportEvery, "report-every", 0, true, "print the worker's counters as a JSON line on stderr this often (used by `demo run --kill-every`; 0: off)")
	f.DurationVar(&c.waitDB, "wait-db", 0, true, "at start, keep trying this long to reach a database that refuses connections or is restarting (0: fail at once)")
	f.StringVar(&c.name, "name", fmt.Sprintf("demo-work-%s-%d", host, os.Getpid()), "NAME", "session name shown by `crdbwork status`", nil)
	f.BoolVar(&c.anyPart, "any-part", false, "claim in any part of --queue: the worker owns no parts (a queue without parts), every worker of the queue claims any of its items")
	f.DurationVar(&c.every, "every", 0, true, "also run the periodic schedule \"demo-every\": one item on --queue per period of this length, however many `demo work` processes run it (0: off)")
	f.BoolVar(&c.skipMissed, "skip-missed", false, "with --every: periods missed while no process ran get no item (default: one item for the latest missed period)")
	f.BoolVar(&c.shared, "shared-database", false, sharedUsage)
	f.FlagOnly("shared-database")
	if workTestFlags != nil {
		workTestFlags(f, &c)
	}
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	if err := c.validate(f); err != nil {
		return err
	}
	var sched *schedule.Schedule
	if c.every > 0 {
		missed := schedule.CatchUp
		if c.skipMissed {
			missed = schedule.Skip
		}
		sched = &schedule.Schedule{Name: demoSchedule, Every: c.every, Missed: missed, Make: func(p time.Time) claim.NewItem {
			return claim.NewItem{Payload: []byte("periodic " + p.Format(time.RFC3339Nano))}
		}}
		if _, err := schedule.PeriodAt(*sched, time.Now()); err != nil {
			return f.UsageError("--every %v: %v", c.every, err)
		}
	}
	log, watch, err := newLogger(c.logLevel, out)
	if err != nil {
		return err
	}
	defer log.Sync()
	// SIGINT or SIGTERM while starting is a stop request like any other.
	stoppedEarly := func(err error) error {
		if ctx.Err() != nil {
			out.Errorf("demo work: %s stopped before it started working", c.name)
			return nil
		}
		return err
	}
	poolSize := c.poolSize()
	if c.metricsAddr != "" {
		poolSize++ // the scrapes' database reads
	}
	if sched != nil {
		poolSize++ // the schedule's transactions
	}
	// With --wait-db, a database that is restarting is waited for.
	var pool *pgxpool.Pool
	var parts int
	err = retryStartup(ctx, c.waitDB, func() error {
		p, err := cli.ConnectWith(ctx, c.databaseURL, poolSize, c.configurePool)
		if err != nil {
			return err
		}
		if err := openDemo(ctx, p, "work", c.queue, c.shared, out); err != nil {
			p.Close()
			return err
		}
		if parts, err = partition.EnsureParts(ctx, p, tables, c.queue, c.parts); err != nil {
			p.Close()
			return cli.Failf(1, "%v", err)
		}
		pool = p
		return nil
	})
	if err != nil {
		return stoppedEarly(err)
	}
	defer pool.Close()
	var ms *metricsServer
	if c.metricsAddr != "" {
		if ms, err = serveMetrics(c.metricsAddr, pool, out); err != nil {
			return err
		}
		defer ms.close()
	}
	cli.Warm(ctx, pool)
	if workTestSetup != nil {
		done, err := workTestSetup(ctx, &c, out)
		if err != nil {
			return err
		}
		defer done()
	}
	w, err := c.newWorker(pool, c.queue, c.name, log, ms)
	if err != nil {
		return cli.Failf(2, "%v", err)
	}
	engine := cli.EngineName(ctx, pool)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watch.run(wctx, pool)
	start := time.Now()
	started := make(chan struct{})
	go func() {
		// One line once the first session is up: it says the worker connected.
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-started:
				return
			case <-t.C:
			}
			if id := w.Stats().Session; id != "" {
				how := fmt.Sprintf("%d parts", parts)
				if c.anyPart {
					how = "any part"
				}
				out.Errorf("demo work: %s working on queue %q (%s, %s, session %s)", c.name, c.queue, engine, how, id)
				return
			}
		}
	}()
	if c.reportEvery > 0 {
		go func() {
			t := time.NewTicker(c.reportEvery)
			defer t.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
				}
				b, _ := json.Marshal(statsOf(w.Stats()))
				out.ErrorLine(statsPrefix + string(b))
			}
		}()
	}
	var runnerDone chan struct{}
	rctx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	if sched != nil {
		q, err := claim.New(pool, claim.Options{Queue: c.queue, Tables: tables})
		if err != nil {
			return cli.Failf(2, "%v", err)
		}
		r, err := schedule.New(q, schedule.Options{Logger: log.With(zap.String("worker", c.name))}, *sched)
		if err != nil {
			return cli.Failf(2, "%v", err)
		}
		runnerDone = make(chan struct{})
		go func() {
			defer close(runnerDone)
			_ = r.Run(rctx)
		}()
	}
	runErr := w.Run(ctx)
	close(started)
	stopRunner()
	if runnerDone != nil {
		<-runnerDone // it stops at once
	}
	if c.reportEvery > 0 {
		b, _ := json.Marshal(statsOf(w.Stats()))
		out.ErrorLine(statsPrefix + string(b))
	}
	st := w.Stats()
	elapsed := time.Since(start)
	if c.json {
		b, _ := json.Marshal(map[string]any{
			"name": c.name, "pid": os.Getpid(), "elapsed_seconds": elapsed.Seconds(),
			"sessions": st.Sessions, "sessions_lost": st.SessionsLost, "claimed": st.Claimed,
			"acked": st.Acked, "nacked": st.Nacked, "released": st.Released, "dead": st.Dead,
			"claims_lost": st.LostClaims, "retries": st.Retries, "error": errString(runErr),
		})
		out.ErrorLine(string(b))
	} else {
		out.Errorf("demo work: %s stopped after %s: acked %d, claimed %d, nacked %d, released %d, dead %d, claims lost %d, sessions %d (%d lost)",
			c.name, round(elapsed), st.Acked, st.Claimed, st.Nacked, st.Released, st.Dead, st.LostClaims, st.Sessions, st.SessionsLost)
	}
	if runErr != nil {
		if errors.Is(runErr, crsql.ErrSchemaMissing) {
			return cli.Failf(2, "the crdbwork schema is not in this database: run `crdbwork migrate` first")
		}
		if errors.Is(runErr, worker.ErrPrivileges) {
			// A refused user is exit 2, its line naming the user, the
			// tables and the privileges it lacks (the worker's message,
			// not the server's refusal it may wrap).
			return &cli.ExitError{Code: 2, Msg: runErr.Error()}
		}
		return cli.Failf(1, "%v", runErr)
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
