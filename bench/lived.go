package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The lived experiment (go -C bench run . lived): one drain per feature —
// plain, fair, sequenced, dependencies as a fan-out/fan-in and as chains,
// the urgent lane, a fleet-wide limit — on a fresh database and on one that
// has lived (internal/lived: other queues with --rows items analyzed before
// the queue under test existed, dead tuples, ended ids, dead and waiting
// items; autovacuum off for its tables, so that the statistics stay those
// of before the burst). Each drain gets a database of its own on the same
// server, in an order that alternates between rounds: a fresh one (the
// schema only) or a copy of the lived template (built once per run). The
// items are enqueued through the API (the burst on a quiet queue), then
// in-process workers drain them, each writing a result row per item in its
// ack transaction. Each drain reports its time, the longest stretch
// without an ack from its first ack to its last (every item is enqueued up
// front, so work is claimable throughout unless a statement or a release
// stalls), and whether every item ended exactly once (one result row each,
// nothing left in the queue's tables).

// livedFeatures are the features drained, in order.
var livedFeatures = []string{"plain", "fair", "sequenced", "fan", "chains", "urgent", "limits"}

// livedRun is one drain.
type livedRun struct {
	Feature string  `json:"feature"`
	Lived   bool    `json:"lived"`
	Round   int     `json:"round"`
	Items   int     `json:"items"`
	Seconds float64 `json:"seconds"`
	// FirstAck is the time from starting the workers to the first ack
	// (sessions, parts); LongestStretch the longest time without an ack
	// from the first ack to the last.
	FirstAck       float64 `json:"first_ack_seconds"`
	LongestStretch float64 `json:"longest_stretch_seconds"`
	ExactlyOnce    bool    `json:"exactly_once"`
	// TimedOut: the drain did not end within --timeout (Seconds is then
	// the timeout, and Acked how many items were acked by then).
	TimedOut bool   `json:"timed_out,omitempty"`
	Acked    int64  `json:"acked"`
	Retries  int64  `json:"retries"`
	Load     string `json:"load"`
}

// livedSummary is one feature's figures over the rounds.
type livedSummary struct {
	Feature string `json:"feature"`
	// Ratio is the median over rounds of the lived drain's time over the
	// fresh one's in the same round.
	Ratio        float64 `json:"ratio"`
	FreshSeconds float64 `json:"fresh_seconds"`
	LivedSeconds float64 `json:"lived_seconds"`
	FreshStretch float64 `json:"fresh_longest_stretch_seconds"` // the longest of the rounds
	LivedStretch float64 `json:"lived_longest_stretch_seconds"`
	FreshFirst   float64 `json:"fresh_first_ack_seconds"` // the longest of the rounds
	LivedFirst   float64 `json:"lived_first_ack_seconds"`
	ExactlyOnce  bool    `json:"exactly_once"`        // every drain of the feature, fresh and lived
	TimedOut     bool    `json:"timed_out,omitempty"` // some drain of the feature did not end within --timeout
	WithinGoals  bool    `json:"within_goals"`        // ratio ≤ 2 and no lived stretch over 2 s
}

// livedReport is the experiment's JSON line.
type livedReport struct {
	Items       int            `json:"items"`
	Rows        int            `json:"rows"`
	Workers     int            `json:"workers"`
	Concurrency int            `json:"concurrency"`
	Rounds      int            `json:"rounds"`
	Autovacuum  bool           `json:"autovacuum"`
	Runs        []livedRun     `json:"runs"`
	Features    []livedSummary `json:"features"`
	LoadBefore  string         `json:"load_before"`
	LoadAfter   string         `json:"load_after"`
	GOMAXPROCS  int            `json:"gomaxprocs"`
}

func livedCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("lived", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 2000, "items per drain")
	rows := fs.Int("rows", 120_000, "items of the lived database's other queues")
	rounds := fs.Int("rounds", 1, "rounds; each drains every feature on a fresh database and on a lived one, in an order that alternates")
	workers := fs.Int("workers", 2, "in-process workers (one session each)")
	concurrency := fs.Int("concurrency", 64, "handlers per worker")
	autovacuum := fs.Bool("autovacuum", false, "leave autovacuum on for the lived database's tables (by default it is off, so that the statistics stay those of before the burst, and nothing vacuums the burst's dead rows)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give a drain up after this long (it is reported as timed out, with the items acked by then)")
	features := fs.String("features", strings.Join(livedFeatures, ","), "features to drain, comma-separated: "+strings.Join(livedFeatures, ", "))
	asJSON := fs.Bool("json", false, "print one JSON line with every run and the summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("lived: unexpected arguments %q", fs.Args())
	case *items < 100 || *rows < 1000 || *rounds < 1 || *workers < 1 || *concurrency < 1 || *timeout <= 0:
		return errors.New("lived: --items must be at least 100, --rows at least 1000, --rounds, --workers and --concurrency at least 1, --timeout positive")
	}
	var order []string
	for _, f := range strings.Split(*features, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(livedFeatures, f) {
			return fmt.Errorf("--features: unknown feature %q (want %s)", f, strings.Join(livedFeatures, ", "))
		}
		order = append(order, f)
	}
	if *asJSON {
		out = io.Discard
	}
	serverURL, stop, err := c.database(ctx, out)
	if err != nil {
		return err
	}
	defer stop()
	admin, err := newSetupPool(ctx, serverURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	dbs := &livedDBs{admin: admin, server: serverURL, opts: lived.Options{Rows: *rows, Autovacuum: *autovacuum}}
	defer dbs.close()
	rep := livedReport{Items: *items, Rows: *rows, Workers: *workers, Concurrency: *concurrency, Rounds: *rounds, Autovacuum: *autovacuum,
		LoadBefore: loadavg(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	fmt.Fprintf(out, "lived: %d items per drain, lived database of %d other items (autovacuum %s), %d workers × %d handlers, %d rounds, GOMAXPROCS %d, load %s\n",
		*items, *rows, map[bool]string{false: "off", true: "on"}[*autovacuum], *workers, *concurrency, *rounds, rep.GOMAXPROCS, rep.LoadBefore)
	start := time.Now()
	if err := dbs.buildTemplate(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "lived template built in %v\n", time.Since(start).Round(time.Millisecond))
	for round := range *rounds {
		for _, f := range order {
			kinds := []bool{false, true}
			if round%2 == 1 {
				slices.Reverse(kinds)
			}
			for _, isLived := range kinds {
				r, err := livedDrain(ctx, dbs, f, isLived, *items, *workers, *concurrency, *timeout)
				if err != nil {
					return fmt.Errorf("%s, %s, round %d: %w", f, map[bool]string{false: "fresh", true: "lived"}[isLived], round+1, err)
				}
				r.Round = round + 1
				rep.Runs = append(rep.Runs, r)
				ended := fmt.Sprintf("exactly once %-5v", r.ExactlyOnce)
				if r.TimedOut {
					ended = fmt.Sprintf("TIMED OUT with %d of %d acked", r.Acked, r.Items)
				}
				fmt.Fprintf(out, "round %d  %-9s %-5s %6d items  %7.2fs  first ack %5.2fs  longest stretch %5.2fs  %s  retries %d  load %s\n",
					r.Round, f, map[bool]string{false: "fresh", true: "lived"}[isLived], r.Items, r.Seconds, r.FirstAck, r.LongestStretch, ended, r.Retries, r.Load)
			}
		}
	}
	rep.Features = summarizeLived(order, rep.Runs)
	rep.LoadAfter = loadavg()
	if *asJSON {
		return printJSON(fs.Output(), rep)
	}
	fmt.Fprintf(out, "\nmedian of %d rounds, load %s:\n\n", *rounds, rep.LoadAfter)
	fmt.Fprintln(out, "| feature | fresh s | lived s | lived/fresh | first ack fresh / lived (s) | longest stretch fresh / lived (s) | exactly once | goals |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|")
	for _, s := range rep.Features {
		goals := "met"
		if !s.WithinGoals {
			goals = "missed"
		}
		ended := fmt.Sprint(s.ExactlyOnce)
		if s.TimedOut {
			ended = "timed out"
		}
		fmt.Fprintf(out, "| %s | %.2f | %.2f | %.2f× | %.2f / %.2f | %.2f / %.2f | %s | %s |\n", s.Feature, s.FreshSeconds, s.LivedSeconds, s.Ratio,
			s.FreshFirst, s.LivedFirst, s.FreshStretch, s.LivedStretch, ended, goals)
	}
	fmt.Fprintf(out, "\nlived/fresh: median over rounds of the lived drain's time over the fresh one's in the same round (a timed-out drain counts as --timeout, %v).\n", *timeout)
	fmt.Fprintln(out, "first ack: the longest time from starting the workers to the first ack (sessions and parts; with a limit, its Grace; with dependencies, the root's ack and its release); longest stretch: the longest time without an ack from the first ack to the last, the longest of the rounds.")
	fmt.Fprintln(out, "goals (issue #29): lived within 2× of fresh, no stretch over 2 s without an ack while items are claimable.")
	return nil
}

// summarizeLived gives each feature's medians, ratio and longest stretches.
func summarizeLived(order []string, runs []livedRun) []livedSummary {
	var out []livedSummary
	for _, f := range order {
		s := livedSummary{Feature: f, ExactlyOnce: true}
		byRound := map[int][2]float64{}
		var fresh, lv, ratios []float64
		for _, r := range runs {
			if r.Feature != f {
				continue
			}
			s.ExactlyOnce = s.ExactlyOnce && r.ExactlyOnce
			s.TimedOut = s.TimedOut || r.TimedOut
			pair := byRound[r.Round]
			if r.Lived {
				lv = append(lv, r.Seconds)
				s.LivedStretch = max(s.LivedStretch, r.LongestStretch)
				s.LivedFirst = max(s.LivedFirst, r.FirstAck)
				pair[1] = r.Seconds
			} else {
				fresh = append(fresh, r.Seconds)
				s.FreshStretch = max(s.FreshStretch, r.LongestStretch)
				s.FreshFirst = max(s.FreshFirst, r.FirstAck)
				pair[0] = r.Seconds
			}
			byRound[r.Round] = pair
		}
		for _, p := range byRound {
			if p[0] > 0 && p[1] > 0 {
				ratios = append(ratios, p[1]/p[0])
			}
		}
		if len(fresh) > 0 {
			s.FreshSeconds = median(fresh)
		}
		if len(lv) > 0 {
			s.LivedSeconds = median(lv)
		}
		if len(ratios) > 0 {
			s.Ratio = median(ratios)
		}
		s.WithinGoals = s.Ratio <= 2 && s.LivedStretch <= 2 && s.ExactlyOnce && !s.TimedOut
		out = append(out, s)
	}
	return out
}

// livedDBs makes the drains' databases on one server: fresh ones, and
// copies of the lived template.
type livedDBs struct {
	admin     *pgxpool.Pool
	server    string
	opts      lived.Options
	template  string // "" until built
	cockroach bool
	mu        sync.Mutex
	n         int
}

// dbURL returns the URL of database name on the server.
func (d *livedDBs) dbURL(name string) (string, error) {
	u, err := url.Parse(d.server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("lived: --database-url must be a postgres:// URL (the experiment makes databases beside its own)")
	}
	u.Path, u.RawPath = "/"+name, ""
	return u.String(), nil
}

// buildTemplate makes the lived template database: the schema, the
// results table, then lived.Build. On CockroachDB, which has no template
// databases, each lived drain builds its own instead.
func (d *livedDBs) buildTemplate(ctx context.Context) error {
	var version string
	if err := d.admin.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		return err
	}
	d.cockroach = strings.Contains(version, "CockroachDB")
	if d.cockroach {
		return nil
	}
	name := fmt.Sprintf("bench_lived_template_%d", time.Now().UnixNano())
	if err := d.build(ctx, name, true); err != nil {
		return err
	}
	d.template = name
	return nil
}

// build creates database name and applies the schema, and with lived
// brings it to the lived state.
func (d *livedDBs) build(ctx context.Context, name string, isLived bool) error {
	if _, err := d.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	u, err := d.dbURL(name)
	if err != nil {
		return err
	}
	pool, err := newSetupPool(ctx, u)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setupCrdbwork(ctx, pool); err != nil {
		return err
	}
	if isLived {
		if err := lived.Build(ctx, pool, d.opts); err != nil {
			return err
		}
	}
	return nil
}

// create returns the URL of a new database for one drain, fresh or lived,
// and a function that drops it.
func (d *livedDBs) create(ctx context.Context, isLived bool) (string, func(), error) {
	d.mu.Lock()
	d.n++
	name := fmt.Sprintf("bench_lived_%d_%d", time.Now().UnixNano(), d.n)
	d.mu.Unlock()
	drop := func() {
		stmt := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize()
		if d.cockroach {
			stmt += " CASCADE"
		} else {
			stmt += " WITH (FORCE)"
		}
		_, _ = d.admin.Exec(context.Background(), stmt)
	}
	var err error
	if isLived && d.template != "" {
		_, err = d.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{d.template}.Sanitize())
	} else {
		err = d.build(ctx, name, isLived)
	}
	if err != nil {
		drop()
		return "", nil, err
	}
	u, err := d.dbURL(name)
	if err != nil {
		drop()
		return "", nil, err
	}
	return u, drop, nil
}

// close drops the template.
func (d *livedDBs) close() {
	if d.template != "" {
		_, _ = d.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{d.template}.Sanitize()+" WITH (FORCE)")
	}
}

// livedQueue is the queue under test: quiet (absent) when the lived
// database's statistics were taken.
const livedQueue = "bench-burst"

// livedDrain drains one feature's items on a new database, fresh or lived.
func livedDrain(ctx context.Context, dbs *livedDBs, feature string, isLived bool, n, workers, concurrency int, timeout time.Duration) (livedRun, error) {
	run := livedRun{Feature: feature, Lived: isLived}
	u, drop, err := dbs.create(ctx, isLived)
	if err != nil {
		return run, err
	}
	defer drop()
	setup, err := newSetupPool(ctx, u)
	if err != nil {
		return run, err
	}
	defer setup.Close()
	cw := &crdbworkSystem{concurrency: concurrency, ackBatch: 64, record: "batch", parts: 16}
	opts := cw.options()
	if err := partition.SetParts(ctx, setup, crsql.Tables{}, livedQueue, 16); err != nil {
		return run, err
	}
	producer, err := claim.New(setup, claim.Options{Queue: livedQueue})
	if err != nil {
		return run, err
	}
	var items []claim.NewItem
	switch feature {
	case "plain", "limits", "urgent", "fair", "sequenced":
		items = make([]claim.NewItem, n)
		for i := range items {
			items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
			switch feature {
			case "fair":
				items[i].Tenant = fmt.Sprintf("tenant-%d", i%100)
			case "sequenced":
				items[i].Key = fmt.Sprintf("key-%d", i%100)
			case "urgent":
				items[i].Priority = 10
				if i%10 == 0 {
					items[i].Priority = 1
				}
			}
		}
	case "fan":
		items = shapeItems("fan", max(n/100, 1), 100)
	case "chains":
		items = shapeItems("chains", max(n/100, 1), 100)
	}
	switch feature {
	case "fair":
		err = producer.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}})
	case "limits":
		err = producer.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{MaxInFlight: 32}})
	case "sequenced":
		err = producer.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On})
	case "urgent":
		opts.UrgentLane, opts.UrgentPriority = true, 1
	}
	if err != nil {
		return run, err
	}
	if err := enqueueChunks(ctx, producer, items); err != nil {
		return run, err
	}
	run.Items = len(items)
	var ws []*worker.Worker
	for range workers {
		pool, err := newPool(ctx, u, worker.PoolConns(opts))
		if err != nil {
			return run, err
		}
		defer pool.Close()
		q, err := claim.New(pool, claim.Options{Queue: livedQueue})
		if err != nil {
			return run, err
		}
		w, err := worker.New(q, cw.handler(), opts)
		if err != nil {
			return run, err
		}
		ws = append(ws, w)
	}
	// The acks as the workers count them (committed acks), watched every
	// millisecond: the stretches between them.
	var (
		first, last time.Time
		seen        int64
		longest     time.Duration
	)
	acked := func() int64 {
		var total int64
		for _, w := range ws {
			total += w.Stats().Acked
		}
		if total > seen {
			now := time.Now()
			if first.IsZero() {
				first = now
			} else {
				longest = max(longest, now.Sub(last))
			}
			last, seen = now, total
		}
		return total
	}
	runCtx, stopWorkers := context.WithCancel(ctx)
	errs := make(chan error, len(ws))
	var wg sync.WaitGroup
	start := time.Now()
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- w.Run(runCtx) }()
	}
	deadline := time.NewTimer(timeout)
	tick := time.NewTicker(time.Millisecond)
	var runErr error
	for acked() < int64(len(items)) && runErr == nil && !run.TimedOut {
		select {
		case err := <-errs:
			runErr = fmt.Errorf("a worker stopped: %v", err)
		case <-ctx.Done():
			runErr = ctx.Err()
		case <-deadline.C:
			run.TimedOut = true
			// A stall that lasts until the timeout is a stretch too.
			longest = max(longest, time.Since(last))
		case <-tick.C:
		}
	}
	tick.Stop()
	deadline.Stop()
	elapsed := time.Since(start)
	stopWorkers()
	wg.Wait()
	if runErr != nil {
		return run, runErr
	}
	run.Seconds, run.LongestStretch, run.Acked = elapsed.Seconds(), longest.Seconds(), seen
	if !first.IsZero() {
		run.FirstAck = first.Sub(start).Seconds()
	}
	run.Retries, run.Load = workerRetries(ws), loadavg()
	if run.TimedOut {
		return run, nil
	}
	var rows, distinct, left int
	if err := setup.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_cw_results), (SELECT count(DISTINCT item_id) FROM bench_cw_results),
       (SELECT count(*) FROM crdbwork_items WHERE queue = $1) + (SELECT count(*) FROM crdbwork_waiting WHERE queue = $1)
       + (SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1)`, livedQueue).Scan(&rows, &distinct, &left); err != nil {
		return run, err
	}
	run.ExactlyOnce = rows == len(items) && distinct == len(items) && left == 0
	if !run.ExactlyOnce {
		return run, fmt.Errorf("not exactly once: %d result rows (%d distinct) for %d items, %d left in the queue's tables", rows, distinct, len(items), left)
	}
	return run, nil
}
