package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	livedpkg "github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/worker"
)

// The dependencies experiment (go -C bench run . depends): how much
// dependencies (claim.NewItem.After) cost. In each round it drains, with
// the same in-process workers, the same number of no-op items four ways,
// in an order that alternates between rounds:
//
//	plain   the items without dependencies;
//	fan     one root, --width·--depth children after it, one join after
//	        every child (a fan-out then a fan-in);
//	fanins  --width fan-ins of --depth items each: a root, --depth-2
//	        children after it, a join after the children;
//	chains  --width chains of --depth items, each after the one before.
//
// Each shape is enqueued (in calls of 1,000) before the workers start, and the
// drain is timed from starting the workers to the last item's ack. Every
// item must be acked exactly once (its result row is written in its ack
// transaction), and no waiting item or edge may be left.

// depsResult is one drain of one shape.
type depsResult struct {
	Shape   string  `json:"shape"`
	Round   int     `json:"round"`
	Items   int     `json:"items"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"items_per_second"`
	// Unblocked: dependents released by the workers' acks and reaps;
	// ReleaseFailures: releases after an ack that failed (left to the
	// reaper); Retries: serialization-failure retries of the workers' acks
	// and releases.
	Unblocked       int64 `json:"unblocked"`
	ReleaseFailures int64 `json:"release_failures"`
	Retries         int64 `json:"retries"`
}

func dependsCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("depends", out)
	var c commonFlags
	c.register(fs)
	width := fs.Int("width", 100, "fan: children = width·depth; chains: this many chains")
	depth := fs.Int("depth", 100, "chains: items per chain")
	rounds := fs.Int("rounds", 3, "rounds; each drains every shape once")
	workers := fs.Int("workers", 2, "in-process workers (one session each)")
	concurrency := fs.Int("concurrency", 64, "handlers per worker")
	shapes := fs.String("shapes", "plain,fan,fanins,chains", "shapes to drain, comma-separated: plain, fan, fanins, chains")
	lived := fs.Bool("lived", false, "drain in a database that has lived (internal/lived): other queues' rows analyzed before the experiment's queues existed, then a third of them ended")
	jsonOut := fs.Bool("json", false, "print one JSON line per drain")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("depends: unexpected argument %q", fs.Arg(0))
	}
	if *width < 1 || *depth < 1 || *rounds < 1 || *workers < 1 || *concurrency < 1 {
		return errors.New("--width, --depth, --rounds, --workers and --concurrency must be at least 1")
	}
	var order []string
	for _, s := range strings.Split(*shapes, ",") {
		switch s = strings.TrimSpace(s); s {
		case "plain", "fan", "fanins", "chains":
			order = append(order, s)
		default:
			return fmt.Errorf("--shapes: unknown shape %q (want plain, fan, fanins, chains)", s)
		}
	}
	url, setup, done, err := c.crdbworkDatabase(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	state := "fresh database"
	if *lived {
		// Other queues' rows, analyzed before the experiment's queues
		// exist, then ended, nacked and pruned unvacuumed (internal/lived,
		// autovacuum off for its tables).
		if err := livedpkg.Build(ctx, setup, livedpkg.Options{}); err != nil {
			return fmt.Errorf("building the lived state: %w", err)
		}
		state = "lived database (internal/lived)"
	}
	n := *width * *depth
	fmt.Fprintf(out, "dependencies, %s: %d no-op items per drain (fan: 1 + %d + 1; fanins: %d × (1 + %d + 1); chains: %d × %d), %d workers × %d handlers, %d rounds, GOMAXPROCS %d, load %s\n",
		state, n+2, n, *width, max(*depth-2, 0), *width, *depth, *workers, *concurrency, *rounds, runtime.GOMAXPROCS(0), loadavg())
	runs := map[string][]depsResult{}
	for round := range *rounds {
		o := slices.Clone(order)
		if round%2 == 1 {
			slices.Reverse(o)
		}
		for _, shape := range o {
			r, err := drainShape(ctx, url, setup, shape, round, *width, *depth, *workers, *concurrency)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", shape, round+1, err)
			}
			runs[shape] = append(runs[shape], r)
			if *jsonOut {
				b, _ := json.Marshal(r)
				fmt.Fprintln(out, string(b))
				continue
			}
			fmt.Fprintf(out, "round %d  %-6s %6d items  %7.2fs  %7.0f items/s  %5d unblocked  %d release failures  %d retries  load %s\n",
				round+1, shape, r.Items, r.Seconds, r.PerSec, r.Unblocked, r.ReleaseFailures, r.Retries, loadavg())
		}
	}
	if *jsonOut {
		return nil
	}
	fmt.Fprintf(out, "\nmedian of %d rounds, load %s:\n\n", *rounds, loadavg())
	fmt.Fprintf(out, "| %-6s | %6s | %8s | %9s | %13s |\n", "shape", "items", "seconds", "items/s", "time × plain")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 8), strings.Repeat("-", 8), strings.Repeat("-", 10), strings.Repeat("-", 11), strings.Repeat("-", 15))
	base := runs["plain"]
	for _, shape := range order {
		rs := runs[shape]
		secs, rates := make([]float64, len(rs)), make([]float64, len(rs))
		for i, r := range rs {
			secs[i], rates[i] = r.Seconds, r.PerSec
		}
		ratio := "—"
		if len(base) == len(rs) {
			ratios := make([]float64, len(rs))
			for i := range rs {
				ratios[i] = rs[i].Seconds / base[i].Seconds
			}
			ratio = fmt.Sprintf("%.2f×", median(ratios))
		}
		fmt.Fprintf(out, "| %-6s | %6d | %8.2f | %9.0f | %13s |\n", shape, rs[0].Items, median(secs), median(rates), ratio)
	}
	fmt.Fprintln(out, "\ntime × plain: the median over rounds of the shape's drain time over the plain drain's in the same round.")
	return nil
}

// drainShape enqueues one shape into a queue of its own, then drains it with
// fresh workers and checks that every item was acked exactly once.
func drainShape(ctx context.Context, url string, setup *pgxpool.Pool, shape string, round, width, depth, workers, concurrency int) (depsResult, error) {
	queue := fmt.Sprintf("deps-%s-%d", shape, round)
	if _, err := setup.Exec(ctx, `TRUNCATE bench_cw_results`); err != nil {
		return depsResult{}, err
	}
	producer, err := claim.New(setup, claim.Options{Queue: queue})
	if err != nil {
		return depsResult{}, err
	}
	items := shapeItems(shape, width, depth)
	if err := enqueueChunks(ctx, producer, items); err != nil {
		return depsResult{}, err
	}
	pools := make([]*pgxpool.Pool, workers)
	cw := &crdbworkSystem{concurrency: concurrency, ackBatch: 64, record: "batch"}
	opts := cw.options()
	opts.Partition = partition.Tuning{Poll: 100 * time.Millisecond}
	for i := range pools {
		if pools[i], err = newPool(ctx, url, worker.PoolConns(opts)); err != nil {
			return depsResult{}, err
		}
		defer pools[i].Close()
	}
	runCtx, cancel := context.WithTimeout(ctx, runTimeout(len(items))+time.Minute)
	defer cancel()
	var ws []*worker.Worker
	for _, p := range pools {
		q, err := claim.New(p, claim.Options{Queue: queue})
		if err != nil {
			return depsResult{}, err
		}
		w, err := worker.New(q, cw.handler(), opts)
		if err != nil {
			return depsResult{}, err
		}
		ws = append(ws, w)
	}
	start := time.Now()
	errs := make(chan error, len(ws))
	for _, w := range ws {
		go func() { errs <- w.Run(runCtx) }()
	}
	var done int
	for {
		if err := setup.QueryRow(ctx, `SELECT count(*) FROM bench_cw_results`).Scan(&done); err != nil {
			cancel()
			return depsResult{}, err
		}
		if done >= len(items) {
			break
		}
		select {
		case <-runCtx.Done():
			return depsResult{}, fmt.Errorf("%d of %d items done when the run timed out", done, len(items))
		case <-time.After(5 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	var unblocked, failures, retries int64
	for range ws {
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			return depsResult{}, err
		}
	}
	for _, w := range ws {
		st := w.Stats()
		unblocked += st.Unblocked
		failures += st.ReleaseFailures
		retries += st.Retries["ack"] + st.Retries["unblock"]
	}
	var left int
	if err := setup.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1) + (SELECT count(*) FROM crdbwork_waiting WHERE queue = $1)
		+ (SELECT count(*) FROM crdbwork_waits_for WHERE queue = $1) + (SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1)`, queue).Scan(&left); err != nil {
		return depsResult{}, err
	}
	if left != 0 || done != len(items) {
		return depsResult{}, fmt.Errorf("%d result rows for %d items, %d rows left in the queue's tables", done, len(items), left)
	}
	return depsResult{Shape: shape, Round: round + 1, Items: len(items), Seconds: elapsed.Seconds(),
		PerSec: float64(len(items)) / elapsed.Seconds(), Unblocked: unblocked, ReleaseFailures: failures, Retries: retries}, nil
}

// shapeItems returns the items of a shape, prerequisites first.
func shapeItems(shape string, width, depth int) []claim.NewItem {
	n := width * depth
	var items []claim.NewItem
	switch shape {
	case "plain":
		for i := range n + 2 {
			items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprint(i))})
		}
	case "fan":
		root := uuid.New()
		items = append(items, claim.NewItem{ID: root, Payload: []byte("root")})
		kids := make([]uuid.UUID, n)
		for i := range kids {
			kids[i] = uuid.New()
			items = append(items, claim.NewItem{ID: kids[i], Payload: []byte(fmt.Sprint(i)), After: []uuid.UUID{root}})
		}
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte("join"), After: kids})
	case "fanins":
		for f := range width {
			root := uuid.New()
			items = append(items, claim.NewItem{ID: root, Payload: []byte(fmt.Sprintf("root %d", f))})
			kids := make([]uuid.UUID, max(depth-2, 0))
			for i := range kids {
				kids[i] = uuid.New()
				items = append(items, claim.NewItem{ID: kids[i], Payload: []byte(fmt.Sprintf("%d.%d", f, i)), After: []uuid.UUID{root}})
			}
			after := kids
			if len(after) == 0 {
				after = []uuid.UUID{root}
			}
			items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprintf("join %d", f)), After: after})
		}
		// Two more, so that every shape has the same count as fan's.
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte("a")}, claim.NewItem{ID: uuid.New(), Payload: []byte("b")})
	case "chains":
		for c := range width {
			var prev uuid.UUID
			for d := range depth {
				it := claim.NewItem{ID: uuid.New(), Payload: []byte(fmt.Sprintf("%d.%d", c, d))}
				if d > 0 {
					it.After = []uuid.UUID{prev}
				}
				prev = it.ID
				items = append(items, it)
			}
		}
		// Two more, so that every shape has the same count as fan's.
		items = append(items, claim.NewItem{ID: uuid.New(), Payload: []byte("a")}, claim.NewItem{ID: uuid.New(), Payload: []byte("b")})
	}
	return items
}
