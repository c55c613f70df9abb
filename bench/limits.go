package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The limits experiment (go -C bench run . limits): how close a fleet of
// in-process workers gets to a queue's limits (docs/limits.md, "Measured"),
// with 1, 2 and 4 workers and with a worker joining or leaving every
// second (2 to 4 workers), with and without parts. Each cell runs twice on
// a database of its own: once under a limit of in flight (--limit, items
// of --item-time to 1.5×) and once under a rate (--rate, items of
// --rate-item-time to 1.5×). Once every worker has its share, the items
// are enqueued and worked off; a handler notes the handlers running at
// once and when each started. It prints, per cell, the most and the mean
// running at once against the limit, and the rate achieved and the most
// started within any second against the rate. With --handover it measures
// the hand-over bound instead: items longer than Grace (--handover-time to
// 1.5×) under churn, with and without parts. The suite's tests check the
// bounds (worker: TestLimitHoldsUnderChurn, TestRateLimitHoldsUnderChurn,
// TestLimitHandOverBound); this measures how much of the limits a fleet
// uses, which tests do not assert.

// limitsRow is one cell's figures.
type limitsRow struct {
	Mode       string  `json:"mode"`    // "16 parts" or "no parts"
	Workers    string  `json:"workers"` // "1", "2", "4" or "churn, 2–4"
	Most       int     `json:"most_in_flight"`
	Mean       float64 `json:"mean_in_flight"`
	Achieved   float64 `json:"rate_achieved,omitempty"`
	Burst      int     `json:"most_started_in_1s,omitempty"`
	Joins      int     `json:"joins,omitempty"` // workers that joined and left under churn
	Leaves     int     `json:"leaves,omitempty"`
	OverLimit  bool    `json:"over_limit,omitempty"` // in flight above the limit (not with --handover)
	OverBucket bool    `json:"over_bucket,omitempty"`
	Load       string  `json:"load"`
}

// limitsReport is the JSON output of limits.
type limitsReport struct {
	Handover   bool        `json:"handover"`
	Limit      int         `json:"limit"`
	Rate       float64     `json:"rate,omitempty"`
	Rows       []limitsRow `json:"rows"`
	GOMAXPROCS int         `json:"gomaxprocs"`
	LoadBefore string      `json:"load_before"`
	LoadAfter  string      `json:"load_after"`
}

func limitsCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("limits", out)
	var c commonFlags
	c.register(fs)
	limit := fs.Int("limit", 8, "the queue's limit of items in flight")
	rate := fs.Float64("rate", 100, "the queue's rate limit, items per second")
	items := fs.Int("items", 1000, "items per cell under the in-flight limit")
	rateItems := fs.Int("rate-items", 400, "items per cell under the rate limit")
	itemTime := fs.Duration("item-time", 20*time.Millisecond, "an item's run time under the in-flight limit (uniform up to 1.5×)")
	rateItemTime := fs.Duration("rate-item-time", 2*time.Millisecond, "an item's run time under the rate limit (uniform up to 1.5×)")
	handover := fs.Bool("handover", false, "measure the hand-over bound instead: items longer than Grace under churn")
	handoverItems := fs.Int("handover-items", 48, "items per cell with --handover")
	handoverTime := fs.Duration("handover-time", 3*time.Second, "an item's run time with --handover (uniform up to 1.5×)")
	asJSON := fs.Bool("json", false, "print one JSON line with every cell")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("limits: unexpected arguments %q", fs.Args())
	case *limit < 1 || *rate <= 0 || *items < 1 || *rateItems < 2 || *handoverItems < 1:
		return errors.New("limits: --limit, --items and --handover-items must be at least 1, --rate-items at least 2, --rate positive")
	case *itemTime <= 0 || *rateItemTime <= 0 || *handoverTime <= 0:
		return errors.New("limits: the item times must be positive")
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
	dbs := &livedDBs{admin: admin, server: serverURL} // fresh databases only: no template
	rep := limitsReport{Handover: *handover, Limit: *limit, GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadavg()}
	if !*handover {
		rep.Rate = *rate
	}
	fmt.Fprintf(out, "limits: limit %d in flight, rate %v/s, handover %v, GOMAXPROCS %d, load %s\n", *limit, *rate, *handover, rep.GOMAXPROCS, rep.LoadBefore)
	conc := worker.Limits{Queue: claim.Limit{MaxInFlight: *limit}}
	for _, parts := range []int{16, 0} {
		mode := "no parts"
		if parts > 0 {
			mode = fmt.Sprintf("%d parts", parts)
		}
		workerCounts := []int{1, 2, 4, -1}
		if *handover {
			workerCounts = []int{-1}
		}
		for _, workers := range workerCounts {
			row := limitsRow{Mode: mode, Workers: fmt.Sprint(workers)}
			if workers < 0 {
				row.Workers = "churn, 2–4"
			}
			if *handover {
				m, f, err := measureLimit(ctx, dbs, parts, workers, conc, *handoverItems, *handoverTime)
				if err != nil {
					return fmt.Errorf("%s, %s workers: %w", mode, row.Workers, err)
				}
				row.Most, row.Mean, _ = m.figures(time.Second)
				row.Joins, row.Leaves = f.joins, f.leaves
			} else {
				m, f, err := measureLimit(ctx, dbs, parts, workers, conc, *items, *itemTime)
				if err != nil {
					return fmt.Errorf("%s, %s workers, in flight: %w", mode, row.Workers, err)
				}
				row.Most, row.Mean, _ = m.figures(time.Second)
				row.Joins, row.Leaves = f.joins, f.leaves
				row.OverLimit = row.Most > *limit
				rt, f, err := measureLimit(ctx, dbs, parts, workers, worker.Limits{Queue: claim.Limit{Rate: *rate}}, *rateItems, *rateItemTime)
				if err != nil {
					return fmt.Errorf("%s, %s workers, rate: %w", mode, row.Workers, err)
				}
				_, _, row.Burst = rt.figures(time.Second)
				row.Achieved = rt.achieved()
				row.Joins, row.Leaves = row.Joins+f.joins, row.Leaves+f.leaves
				// Each worker's bucket holds max(1, its share · 100 ms) tokens; at most 4 workers.
				row.OverBucket = row.Burst > int(*rate)+4*int(max(1, *rate*0.1))
			}
			row.Load = loadavg()
			rep.Rows = append(rep.Rows, row)
			fmt.Fprintf(out, "%-9s %-10s most %2d of %d, mean %5.2f (%3.0f%%)", row.Mode, row.Workers, row.Most, *limit, row.Mean, 100*row.Mean/float64(*limit))
			if !*handover {
				fmt.Fprintf(out, " | rate %6.1f/s of %v (%3.0f%%), most in 1 s %d", row.Achieved, *rate, 100*row.Achieved / *rate, row.Burst)
			}
			fmt.Fprintf(out, " | %d joins, %d leaves | load %s\n", row.Joins, row.Leaves, row.Load)
		}
	}
	rep.LoadAfter = loadavg()
	if *asJSON {
		return printJSON(fs.Output(), rep)
	}
	fmt.Fprintf(out, "\nload %s\n\n", rep.LoadAfter)
	if *handover {
		fmt.Fprintf(out, "| mode | workers | most in flight (limit %d) | mean in flight |\n|---|---|---|---|\n", *limit)
	} else {
		fmt.Fprintf(out, "| mode | workers | most in flight (limit %d) | mean in flight | rate achieved (limit %v/s) | most started in 1 s |\n|---|---|---|---|---|---|\n", *limit, *rate)
	}
	var over []string
	for _, r := range rep.Rows {
		fmt.Fprintf(out, "| %s | %s | %d | %.1f (%.0f %%) |", r.Mode, r.Workers, r.Most, r.Mean, 100*r.Mean/float64(*limit))
		if !*handover {
			fmt.Fprintf(out, " %.1f/s (%.0f %%) | %d |", r.Achieved, 100*r.Achieved / *rate, r.Burst)
		}
		fmt.Fprintln(out)
		if r.OverLimit || r.OverBucket {
			over = append(over, r.Mode+"/"+r.Workers)
		}
	}
	fmt.Fprintln(out, "\nin flight: handlers running at once (a little less than what the limit counts, claim to settled ack); mean over the span from the first start to the last end.")
	if len(over) > 0 {
		return fmt.Errorf("limits: a bound was exceeded in %s", strings.Join(over, ", "))
	}
	return nil
}

// limitsQueue is the experiment's queue.
const limitsQueue = "bench-limits"

// limitsOptions are the workers' options: fast limits, sessions and
// rebalances, 8 handlers each (the figures of docs/limits.md).
func limitsOptions(parts int) worker.Options {
	return worker.Options{
		Parts: parts, Concurrency: 8,
		Session:   session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond},
		Limits:    worker.LimitOptions{Refresh: 100 * time.Millisecond, Grace: 400 * time.Millisecond, Rotate: 500 * time.Millisecond},
		Partition: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: 2 * time.Second},
	}
}

// meter records the handlers running at once and when each started.
type meter struct {
	mu          sync.Mutex
	cur, max    int
	busy        time.Duration // the handlers' summed run time
	first, last time.Time
	starts      []time.Time
	done        atomic.Int64
}

// handler returns a handler that runs for a random time in [lo, hi).
func (m *meter) handler(lo, hi time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		start := time.Now()
		m.mu.Lock()
		m.cur++
		m.max = max(m.max, m.cur)
		if m.first.IsZero() {
			m.first = start
		}
		m.starts = append(m.starts, start)
		m.mu.Unlock()
		select {
		case <-time.After(lo + rand.N(hi-lo)):
		case <-ctx.Done():
		}
		end := time.Now()
		m.mu.Lock()
		m.cur--
		m.busy += end.Sub(start)
		m.last = end
		m.mu.Unlock()
		m.done.Add(1)
		return nil, ctx.Err()
	}
}

// figures returns the most handlers that ran at once, the mean number
// running, and the most that started within any window of w.
func (m *meter) figures(w time.Duration) (most int, mean float64, burst int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if span := m.last.Sub(m.first); span > 0 {
		mean = float64(m.busy) / float64(span)
	}
	s := slices.Clone(m.starts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	j := 0
	for i := range s {
		for s[i].Sub(s[j]) >= w {
			j++
		}
		burst = max(burst, i-j+1)
	}
	return m.max, mean, burst
}

// achieved returns the starts per second from the first start to the last.
func (m *meter) achieved() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.starts) < 2 {
		return 0
	}
	s := slices.Clone(m.starts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	return float64(len(s)-1) / s[len(s)-1].Sub(s[0]).Seconds()
}

// limitsFleet runs in-process workers on one pool.
type limitsFleet struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	q      *claim.Queue
	opts   worker.Options
	h      worker.Handler
	live   []*limitsWorker
	joins  int
	leaves int
}

type limitsWorker struct {
	w    *worker.Worker
	stop context.CancelFunc
	done chan error
}

func (f *limitsFleet) start() error {
	w, err := worker.New(f.q, f.h, f.opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(f.ctx)
	lw := &limitsWorker{w: w, stop: cancel, done: make(chan error, 1)}
	go func() { lw.done <- w.Run(ctx) }()
	f.live = append(f.live, lw)
	f.joins++
	return nil
}

func (lw *limitsWorker) shutdown() error {
	lw.stop()
	return <-lw.done
}

// churn stops a random worker or starts one, keeping between 2 and 4.
func (f *limitsFleet) churn() error {
	if len(f.live) > 2 && (len(f.live) >= 4 || rand.IntN(2) == 0) {
		i := rand.IntN(len(f.live))
		err := f.live[i].shutdown()
		f.live = append(f.live[:i], f.live[i+1:]...)
		f.leaves++
		return err
	}
	return f.start()
}

func (f *limitsFleet) stopAll() error {
	var errs []error
	for _, lw := range f.live {
		errs = append(errs, lw.shutdown())
	}
	f.live = nil
	return errors.Join(errs...)
}

// measureLimit starts workers workers (negative: 2 to 4 workers, one
// joining or leaving every second) under lims on a fresh database, waits
// until they hold the whole limit between them, then enqueues n items of d
// to 1.5·d each and works them off. It returns the meter, whose clock
// starts with the first item, and the fleet.
func measureLimit(ctx context.Context, dbs *livedDBs, parts, workers int, lims worker.Limits, n int, d time.Duration) (*meter, *limitsFleet, error) {
	f0 := limitsOptions(parts)
	u, drop, err := dbs.create(ctx, false)
	if err != nil {
		return nil, nil, err
	}
	defer drop()
	pool, err := openPool(ctx, u, 4*worker.PoolConns(f0)+4, "bench-limits")
	if err != nil {
		return nil, nil, err
	}
	defer pool.Close()
	if parts > 0 {
		if err := partition.SetParts(ctx, pool, crsql.Tables{}, limitsQueue, parts); err != nil {
			return nil, nil, err
		}
	}
	q, err := claim.New(pool, claim.Options{Queue: limitsQueue})
	if err != nil {
		return nil, nil, err
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{MaxInFlight: lims.Queue.MaxInFlight, Rate: lims.Queue.Rate}}); err != nil {
		return nil, nil, err
	}
	m := &meter{}
	f := &limitsFleet{ctx: ctx, pool: pool, q: q, opts: f0, h: m.handler(d, d+d/2)}
	defer func() { _ = f.stopAll() }()
	churn := workers < 0
	if churn {
		workers = 2
	}
	for range workers {
		if err := f.start(); err != nil {
			return nil, nil, err
		}
	}
	f.joins = 0 // count the churn's joins only
	shared := func() bool {
		var share int64
		var rate float64
		for _, lw := range f.live {
			st := lw.w.Stats().Limits
			share, rate = share+st.Share, rate+st.RateShare
		}
		return share == int64(lims.Queue.MaxInFlight) && math.Abs(rate-lims.Queue.Rate) < 1e-6
	}
	if err := waitLimits(ctx, time.Minute, "every worker to have its share", shared); err != nil {
		return nil, nil, err
	}
	batch := make([]claim.NewItem, n)
	for i := range batch {
		batch[i].Payload = []byte(fmt.Sprint(i))
	}
	if _, err := q.Enqueue(ctx, batch...); err != nil {
		return nil, nil, err
	}
	timeout := runTimeout(n) + time.Duration(n)*d
	end := time.Now().Add(timeout)
	for m.done.Load() < int64(n) {
		if time.Now().After(end) {
			return nil, nil, fmt.Errorf("%d of %d items done after %v", m.done.Load(), n, timeout)
		}
		if !churn {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return nil, nil, err
			}
			continue
		}
		next := time.Now().Add(time.Second)
		for m.done.Load() < int64(n) && time.Now().Before(next) {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return nil, nil, err
			}
		}
		if m.done.Load() < int64(n) {
			if err := f.churn(); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := f.stopAll(); err != nil {
		return nil, nil, err
	}
	return m, f, nil
}

// waitLimits polls cond every 10 ms until it holds, for at most d.
func waitLimits(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return fmt.Errorf("timed out after %v waiting for %s", d, what)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// sleepCtx sleeps d, or less if ctx ends (then its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
