package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// latencyQueue is the crdbwork queue of the latency runs.
const latencyQueue = "bench-latency"

// latencyArgs is River's job of the latency runs; its worker tells when it
// started.
type latencyArgs struct{}

func (latencyArgs) Kind() string { return "bench_latency" }

type latencyWorker struct {
	river.WorkerDefaults[latencyArgs]
	started chan<- time.Time
}

func (w latencyWorker) Work(context.Context, *river.Job[latencyArgs]) error {
	w.started <- time.Now()
	return nil
}

// consumer is one system whose pickup latency is measured: start starts
// its consumer, whose handlers send the time they start on started, and
// returns the function that stops it; producer names the enqueue the
// producer process runs ("river" or "crdbwork").
type consumer struct {
	name     string
	producer string
	start    func(ctx context.Context, url string, started chan<- time.Time) (stop func() error, err error)
}

// riverConsumer is River with its defaults (LISTEN/NOTIFY, FetchCooldown
// 100 ms, FetchPollInterval 1 s), 8 workers.
func riverConsumer() consumer {
	return consumer{name: "River", producer: "river", start: func(ctx context.Context, url string, started chan<- time.Time) (func() error, error) {
		pool, err := newPool(ctx, url, 0)
		if err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, `TRUNCATE river_job`); err != nil {
			pool.Close()
			return nil, err
		}
		workers := river.NewWorkers()
		river.AddWorker(workers, latencyWorker{started: started})
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
			Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 8}},
			Workers: workers,
		})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("river client: %w", err)
		}
		if err := client.Start(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("river start: %w", err)
		}
		return func() error {
			defer pool.Close()
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			return client.Stop(stopCtx)
		}, nil
	}}
}

// Wake-ups of a crdbwork consumer: the default (LISTEN on PostgreSQL),
// none (the poll alone), or the idle probe without LISTEN (what runs on
// CockroachDB; worker.WakeProbe).
const (
	wakeDefault = iota
	wakeNone
	wakeProbe
)

// crdbworkConsumer is one crdbwork worker with the default options (8
// handlers, Poll 150 ms), parts parts (0: none), and the wake-ups wake
// (with wakeProbe, the probe's interval probeEvery; 0: the default).
func crdbworkConsumer(parts int, wake int, probeEvery time.Duration) consumer {
	name := "crdbwork"
	if parts > 0 {
		name += fmt.Sprintf(", %d parts", parts)
	}
	opts := worker.Options{Parts: parts, Partition: partition.Tuning{Poll: 100 * time.Millisecond}}
	switch wake {
	case wakeNone:
		name += ", no wake-ups"
		opts.NoWake = true
	case wakeProbe:
		name += ", probe"
		opts.Wake, opts.ProbeEvery = worker.WakeProbe, probeEvery
	}
	return consumer{name: name, producer: "crdbwork", start: func(ctx context.Context, url string, started chan<- time.Time) (func() error, error) {
		pool, err := newPool(ctx, url, worker.PoolConns(opts))
		if err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, latencyQueue); err != nil {
			pool.Close()
			return nil, err
		}
		if err := partition.SetParts(ctx, pool, crsql.Tables{}, latencyQueue, max(parts, 1)); err != nil {
			pool.Close()
			return nil, err
		}
		q, err := claim.New(pool, claim.Options{Queue: latencyQueue})
		if err != nil {
			pool.Close()
			return nil, err
		}
		w, err := worker.New(q, func(ctx context.Context, it claim.Item) (worker.Record, error) {
			started <- time.Now()
			return nil, nil
		}, opts)
		if err != nil {
			pool.Close()
			return nil, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(runCtx) }()
		stop := func() error {
			cancel()
			err := <-done
			pool.Close()
			return err
		}
		// Measure once the worker owns its parts.
		deadline := time.Now().Add(time.Minute)
		for parts > 0 && w.Stats().Parts.Acquired < int64(parts) {
			if time.Now().After(deadline) {
				return nil, errors.Join(fmt.Errorf("the worker owns %d of %d parts after a minute", w.Stats().Parts.Acquired, parts), stop())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return stop, nil
	}}
}

// producerEnv is set in the environment of the producer process, for the
// tests: their binary runs the produce command when it is set (see
// TestMain).
const producerEnv = "BENCH_LATENCY_PRODUCER"

// producerProcess is the enqueueing process of a latency run: this
// program, run again with the hidden produce command.
type producerProcess struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startProducer(ctx context.Context, kind, url string) (*producerProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "produce", "--kind", kind, "--database-url", url)
	cmd.Env = append(os.Environ(), producerEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &producerProcess{cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

// enqueue has the producer enqueue one item and returns when its enqueue
// returned there (its commit acknowledged).
func (p *producerProcess) enqueue() (time.Time, error) {
	if _, err := io.WriteString(p.in, "\n"); err != nil {
		return time.Time{}, err
	}
	if !p.out.Scan() {
		return time.Time{}, fmt.Errorf("the producer process ended: %v", p.out.Err())
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(p.out.Text()), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("the producer process answered %q", p.out.Text())
	}
	return time.Unix(0, ns), nil
}

func (p *producerProcess) stop() error {
	p.in.Close()
	return p.cmd.Wait()
}

// produce is the hidden command of the producer process: for each line
// read, it enqueues one item (kind river: River's Client.Insert; crdbwork:
// claim.Queue.Enqueue, each in its own transaction) and prints the Unix
// time in nanoseconds at which the enqueue returned.
func produce(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("produce", out)
	kind := fs.String("kind", "", "river or crdbwork")
	url := fs.String("database-url", "", "the server")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		return err
	}
	defer pool.Close()
	var enqueue func() error
	switch *kind {
	case "river":
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
		if err != nil {
			return err
		}
		enqueue = func() error { _, err := client.Insert(ctx, latencyArgs{}, nil); return err }
	case "crdbwork":
		q, err := claim.New(pool, claim.Options{Queue: latencyQueue})
		if err != nil {
			return err
		}
		enqueue = func() error { _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte{}}); return err }
	default:
		return fmt.Errorf("--kind %q: want river or crdbwork", *kind)
	}
	in := bufio.NewScanner(os.Stdin)
	w := bufio.NewWriter(out)
	for in.Scan() {
		if err := enqueue(); err != nil {
			return err
		}
		fmt.Fprintln(w, time.Now().UnixNano())
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return in.Err()
}

// measureLatency starts c, then samples times has a producer process
// enqueue one item into the idle queue and takes the time from the
// enqueue's return to its handler's start, waiting gap to 2·gap between
// items (the queue idle meanwhile). The first warm-up samples are dropped.
func measureLatency(ctx context.Context, url string, c consumer, samples, warmup int, gap time.Duration) ([]time.Duration, error) {
	started := make(chan time.Time, 16)
	stop, err := c.start(ctx, url, started)
	if err != nil {
		return nil, err
	}
	p, err := startProducer(ctx, c.producer, url)
	if err != nil {
		return nil, errors.Join(err, stop())
	}
	var lat []time.Duration
	var runErr error
	for i := range samples + warmup {
		time.Sleep(gap + rand.N(gap+1))
		t0, err := p.enqueue()
		if err != nil {
			runErr = err
			break
		}
		select {
		case t1 := <-started:
			if i >= warmup {
				lat = append(lat, max(0, t1.Sub(t0)))
			}
		case <-time.After(30 * time.Second):
			runErr = fmt.Errorf("sample %d: no handler started within 30 s", i)
		case <-ctx.Done():
			runErr = ctx.Err()
		}
		if runErr != nil {
			break
		}
	}
	return lat, errors.Join(runErr, p.stop(), stop())
}

// percentile returns the p-th percentile (0 < p <= 100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// latency is the latency command.
func latency(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("latency", out)
	var c commonFlags
	c.register(fs)
	samples := fs.Int("samples", 100, "items measured per run")
	rounds := fs.Int("rounds", 3, "rounds; each runs every system once, in an order that alternates between rounds")
	gap := fs.Duration("gap", 150*time.Millisecond, "idle time before each item: a random value between gap and 2·gap (River's producer notifies at most once per 100 ms, its FetchCooldown)")
	parts := fs.Int("parts", 16, "parts of the crdbwork run with parts")
	probeEvery := fs.Duration("probe-every", worker.DefaultProbeEvery, "the idle probe's interval in the crdbwork-probe systems (worker.Options.ProbeEvery)")
	only := fs.String("systems", "river,crdbwork,crdbwork-parts,crdbwork-poll,crdbwork-probe,crdbwork-parts-probe",
		"systems to run, comma-separated: river, crdbwork, crdbwork-parts, crdbwork-poll (wake-ups off: the poll alone), crdbwork-probe and crdbwork-parts-probe (the idle probe instead of LISTEN, as on CockroachDB)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *samples < 1 || *rounds < 1 || *parts < 1:
		return errors.New("--samples, --rounds and --parts must be at least 1")
	case *gap < 0:
		return errors.New("--gap must not be negative")
	case *probeEvery <= 0:
		return errors.New("--probe-every must be positive")
	}
	var systems []consumer
	for _, s := range strings.Split(*only, ",") {
		switch strings.TrimSpace(s) {
		case "river":
			systems = append(systems, riverConsumer())
		case "crdbwork":
			systems = append(systems, crdbworkConsumer(0, wakeDefault, 0))
		case "crdbwork-parts":
			systems = append(systems, crdbworkConsumer(*parts, wakeDefault, 0))
		case "crdbwork-poll":
			systems = append(systems, crdbworkConsumer(0, wakeNone, 0))
		case "crdbwork-probe":
			systems = append(systems, crdbworkConsumer(0, wakeProbe, *probeEvery))
		case "crdbwork-parts-probe":
			systems = append(systems, crdbworkConsumer(*parts, wakeProbe, *probeEvery))
		default:
			return fmt.Errorf("--systems: unknown system %q", s)
		}
	}
	url, _, done, err := c.prepare(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "pickup latency: enqueue (its commit returned, in another process) → handler start, idle queue; %d items per run, %d rounds, load %s\n",
		*samples, *rounds, loadavg())
	type stat struct{ p50, p99 time.Duration }
	runs := make(map[string][]stat)
	for round := range *rounds {
		order := slices.Clone(systems)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			lat, err := measureLatency(ctx, url, s, *samples, 5, *gap)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", s.name, round+1, err)
			}
			st := stat{percentile(lat, 50), percentile(lat, 99)}
			runs[s.name] = append(runs[s.name], st)
			fmt.Fprintf(out, "round %d  %-28s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  load %s\n",
				round+1, s.name, ms(st.p50), ms(st.p99), ms(percentile(lat, 100)), loadavg())
		}
	}
	fmt.Fprintf(out, "\nmedian of %d rounds, load %s:\n\n", *rounds, loadavg())
	fmt.Fprintf(out, "| %-28s | %8s | %8s | %14s | %14s |\n", "system", "p50 ms", "p99 ms", "p50 × River", "p99 × River")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 30), strings.Repeat("-", 10), strings.Repeat("-", 10), strings.Repeat("-", 16), strings.Repeat("-", 16))
	base := runs["River"]
	for _, s := range systems {
		rs := runs[s.name]
		var p50, p99, r50, r99 []float64
		for i, r := range rs {
			p50, p99 = append(p50, ms(r.p50)), append(p99, ms(r.p99))
			if len(base) == len(rs) {
				r50 = append(r50, ms(r.p50)/max(ms(base[i].p50), 0.001))
				r99 = append(r99, ms(r.p99)/max(ms(base[i].p99), 0.001))
			}
		}
		ratio := func(xs []float64) string {
			if len(xs) == 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f×", median(xs))
		}
		fmt.Fprintf(out, "| %-28s | %8.2f | %8.2f | %14s | %14s |\n", s.name, median(p50), median(p99), ratio(r50), ratio(r99))
	}
	fmt.Fprintln(out, "\n× River: the median over rounds of the ratio to River's figure in the same round (below 1: faster).")
	return nil
}
