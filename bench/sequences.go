package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The sequences experiment (go -C bench run . sequences): the throughput
// cost of a sequenced queue (docs/sequences.md). The same items, spread
// round-robin over --keys keys, are drained from a plain queue and from a
// sequenced one (one item in flight per key, in enqueue order), alternating
// which goes first in each round, by the same in-process workers; each run
// writes a result row per item in its ack transaction (exactly-once) and
// checks that every item was acked once, and in the sequenced runs that
// each key's items were acked in enqueue order.

// seqRun is one drain.
type seqRun struct {
	Sequenced bool    `json:"sequenced"`
	Round     int     `json:"round"`
	Seconds   float64 `json:"seconds"`
	JobsPerS  float64 `json:"jobs_per_s"`
	Load      string  `json:"load"`
	Retries   int64   `json:"claim_retries"`
	// MaxGap is the longest stretch between two acks (by the database
	// clock), and from the drain's start to the first ack.
	MaxGap float64 `json:"max_gap_s"`
}

// seqSummary is the experiment's JSON line.
type seqSummary struct {
	Items       int      `json:"items"`
	Keys        int      `json:"keys"`
	Workers     int      `json:"workers"`
	Concurrency int      `json:"concurrency"`
	Parts       int      `json:"parts"`
	HandlerMs   float64  `json:"handler_ms"`
	Lived       bool     `json:"lived"`
	Runs        []seqRun `json:"runs"`
	PlainJobsS  float64  `json:"plain_jobs_per_s"`
	SeqJobsS    float64  `json:"sequenced_jobs_per_s"`
	Ratio       float64  `json:"ratio"` // median over rounds of sequenced/plain in the same round
	RatioMin    float64  `json:"ratio_min"`
	RatioMax    float64  `json:"ratio_max"`
	LoadBefore  string   `json:"load_before"`
	LoadAfter   string   `json:"load_after"`
	GOMAXPROCS  int      `json:"gomaxprocs"`
}

func sequences(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("sequences", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 20_000, "items drained per run")
	keys := fs.Int("keys", 100, "keys the items are spread over, round-robin")
	rounds := fs.Int("rounds", 3, "rounds; each drains the plain queue and the sequenced one, in an order that alternates")
	workers := fs.Int("workers", 2, "in-process workers (one session each)")
	concurrency := fs.Int("concurrency", 64, "handlers per worker")
	parts := fs.Int("parts", 0, "parts of both queues (0: no parts mode)")
	handler := fs.Duration("handler", 0, "how long each handler sleeps (0: none)")
	isLived := fs.Bool("lived", false, "drain in a database that has lived (internal/lived, as the lived experiment: other queues with 120,000 items analyzed before, dead tuples); each run's queue is new, its burst in no statistics")
	asJSON := fs.Bool("json", false, "print one JSON line with every run and the summary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("sequences: unexpected arguments %q", fs.Args())
	case *items < 1 || *keys < 1 || *rounds < 1 || *workers < 1 || *concurrency < 1 || *parts < 0 || *handler < 0:
		return errors.New("sequences: --items, --keys, --rounds, --workers and --concurrency must be at least 1, --parts and --handler at least 0")
	}
	url, setup, done, err := c.crdbworkDatabase(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	if _, err := setup.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_seq_results (
    item_key TEXT NOT NULL, n BIGINT NOT NULL, done BIGSERIAL PRIMARY KEY, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return err
	}
	if *isLived {
		if err := buildLived(ctx, setup); err != nil {
			return err
		}
	}
	sum := seqSummary{Items: *items, Keys: *keys, Workers: *workers, Concurrency: *concurrency, Parts: *parts,
		HandlerMs: float64(*handler) / float64(time.Millisecond), Lived: *isLived, LoadBefore: loadavg(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if !*asJSON {
		state := "a fresh database"
		if *isLived {
			state = "a database that has lived"
		}
		fmt.Fprintf(out, "%d items over %d keys per run, %d rounds, %d workers × %d handlers, %d parts, handler %v, in %s, GOMAXPROCS %d, load %s\n",
			*items, *keys, *rounds, *workers, *concurrency, *parts, *handler, state, sum.GOMAXPROCS, sum.LoadBefore)
	}
	var plain, seq, ratios []float64
	for round := range *rounds {
		order := []bool{false, true}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		var rates [2]float64
		for _, sequenced := range order {
			r, err := seqDrain(ctx, url, setup, sequenced, round, *isLived, *items, *keys, *workers, *concurrency, *parts, *handler)
			if err != nil {
				return fmt.Errorf("round %d, sequenced %v: %w", round+1, sequenced, err)
			}
			r.Round = round + 1
			sum.Runs = append(sum.Runs, r)
			if sequenced {
				rates[1] = r.JobsPerS
				seq = append(seq, r.JobsPerS)
			} else {
				rates[0] = r.JobsPerS
				plain = append(plain, r.JobsPerS)
			}
			if !*asJSON {
				name := map[bool]string{false: "plain", true: "sequenced"}[sequenced]
				fmt.Fprintf(out, "round %d  %-10s %8.0f jobs/s  %6.2fs  longest without an ack %5.2fs  claim retries %d  load %s\n",
					round+1, name, r.JobsPerS, r.Seconds, r.MaxGap, r.Retries, r.Load)
			}
		}
		ratios = append(ratios, rates[1]/rates[0])
	}
	sum.PlainJobsS, sum.SeqJobsS = median(plain), median(seq)
	sum.Ratio, sum.RatioMin, sum.RatioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
	sum.LoadAfter = loadavg()
	if *asJSON {
		return json.NewEncoder(out).Encode(sum)
	}
	fmt.Fprintf(out, "\nmedian of %d rounds: plain %.0f jobs/s, sequenced %.0f jobs/s; sequenced/plain %.2f (rounds' range %.2f–%.2f); load %s\n",
		*rounds, sum.PlainJobsS, sum.SeqJobsS, sum.Ratio, sum.RatioMin, sum.RatioMax, sum.LoadAfter)
	return nil
}

// buildLived brings the experiment's database to the state of one that has
// lived, the lived experiment's (lived.Build with its default options),
// unless an earlier run on the same database (--database-url) did: its
// other queues are there, and their statistics as that run left them.
func buildLived(ctx context.Context, db *pgxpool.Pool) error {
	var done bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM crdbwork_queues WHERE name = $1)`, lived.PlainQueue).Scan(&done); err != nil {
		return fmt.Errorf("sequences: %w", err)
	}
	if done {
		return nil
	}
	if err := lived.Build(ctx, db, lived.Options{}); err != nil {
		return fmt.Errorf("sequences: %w", err)
	}
	return nil
}

// seqDrain enqueues items over keys into a fresh plain or sequenced queue
// and drains it with in-process workers, timing the drain only. In a
// lived database (lived) the queue is new in every run (its name has the
// round) and the items table is not analyzed after the enqueue: the burst
// is in no statistics, as a quiet queue's burst in a database with other
// queues. Otherwise the table is analyzed (RefreshStats) before the drain.
func seqDrain(ctx context.Context, url string, setup *pgxpool.Pool, sequenced bool, round int, lived bool, items, keys, workers, concurrency, parts int, handler time.Duration) (seqRun, error) {
	name := map[bool]string{false: "bench-plain", true: "bench-seq"}[sequenced]
	if lived {
		name = fmt.Sprintf("%s-%d", name, round+1)
	}
	if _, err := setup.Exec(ctx, `TRUNCATE bench_seq_results`); err != nil {
		return seqRun{}, err
	}
	if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, name); err != nil {
		return seqRun{}, err
	}
	if err := partition.SetParts(ctx, setup, crsql.Tables{}, name, max(parts, 1)); err != nil {
		return seqRun{}, err
	}
	q, err := claim.New(setup, claim.Options{Queue: name})
	if err != nil {
		return seqRun{}, err
	}
	toggle := claim.Off
	if sequenced {
		toggle = claim.On
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: toggle}); err != nil {
		return seqRun{}, err
	}
	batch := make([]claim.NewItem, 0, 5000)
	for done := 0; done < items; done += len(batch) {
		batch = batch[:0]
		for i := done; i < min(done+cap(batch), items); i++ {
			batch = append(batch, claim.NewItem{Key: fmt.Sprint("key-", i%keys), Payload: []byte(fmt.Sprint(i / keys))})
		}
		if _, err := q.Enqueue(ctx, batch...); err != nil {
			return seqRun{}, fmt.Errorf("enqueue: %w", err)
		}
	}
	if !lived {
		if err := store.RefreshStats(ctx, setup, "crdbwork_items"); err != nil {
			return seqRun{}, err
		}
	}
	var began time.Time
	if err := setup.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&began); err != nil {
		return seqRun{}, err
	}
	opts := worker.Options{Concurrency: concurrency, Parts: parts, Poll: 10 * time.Millisecond, Partition: partition.Tuning{Poll: 100 * time.Millisecond}}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if handler > 0 {
			select {
			case <-time.After(handler):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO bench_seq_results (item_key, n) VALUES ($1, $2::BIGINT)`, it.Key, string(it.Payload))
			return err
		}, nil
	}
	ws := make([]*worker.Worker, workers)
	for i := range ws {
		pool, err := newPool(ctx, url, worker.PoolConns(opts))
		if err != nil {
			return seqRun{}, err
		}
		defer pool.Close()
		wq, err := claim.New(pool, claim.Options{Queue: name})
		if err != nil {
			return seqRun{}, err
		}
		if ws[i], err = worker.New(wq, h, opts); err != nil {
			return seqRun{}, err
		}
	}
	acked := func() int64 {
		var n int64
		for _, w := range ws {
			n += w.Stats().Acked
		}
		return n
	}
	elapsed, runErr := drainWorkers(ctx, ws, items, acked, func() {}, func(bool) {})
	if runErr != nil {
		return seqRun{}, runErr
	}
	var n, distinct, left, disorder int
	var maxGap float64
	if err := setup.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_seq_results),
	       (SELECT count(DISTINCT (item_key, n)) FROM bench_seq_results),
	       (SELECT count(*) FROM crdbwork_items WHERE queue = $1),
	       (SELECT count(*) FROM (SELECT n < lag(n) OVER (PARTITION BY item_key ORDER BY done) AS back FROM bench_seq_results) AS r WHERE back),
	       (SELECT COALESCE(max(EXTRACT(EPOCH FROM at - prev)), 0)::FLOAT8 FROM
	            (SELECT at, COALESCE(lag(at) OVER (ORDER BY at), $2::TIMESTAMPTZ) AS prev FROM bench_seq_results) AS g)`,
		name, began).Scan(&n, &distinct, &left, &disorder, &maxGap); err != nil {
		return seqRun{}, err
	}
	if n != items || distinct != items || left != 0 {
		return seqRun{}, fmt.Errorf("%d result rows (%d distinct) and %d items left for %d items", n, distinct, left, items)
	}
	if sequenced && disorder != 0 {
		return seqRun{}, fmt.Errorf("%d items acked before an earlier item of their key", disorder)
	}
	retries := workerRetries(ws)
	if lived {
		if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_queues WHERE name = $1`, name); err != nil {
			return seqRun{}, err
		}
	}
	return seqRun{Sequenced: sequenced, Seconds: elapsed.Seconds(), JobsPerS: float64(items) / elapsed.Seconds(), Load: loadavg(), Retries: retries, MaxGap: maxGap}, nil
}
