// Command bench measures crdbwork's exactly-once throughput against River
// (github.com/riverqueue/river) on one PostgreSQL server, in one run, and
// the growth of crdbwork's claim cost with the backlog and the number of
// sessions. It lives in its own module so that the library never depends on
// River.
//
//	go -C bench run . --help
//	go -C bench run .                   # River plain, River JobCompleteTx, crdbwork; 30,000 items, 3 rounds
//	go -C bench run . table             # crdbwork's two shapes, River, graphile-worker, pg-boss and the machine's limits
//	go -C bench run . growth            # claim cost at 10k, 100k and 1M items of backlog, 1, 4 and 16 sessions
//	go -C bench run . fairness          # small tenants' waits and Jain's index, fair queue against plain
//	go -C bench run . order             # how relaxed the claim order is (popped element index)
//	go -C bench run . latency           # pickup latency on an idle queue: River, crdbwork with and without parts and wake-ups
//	go -C bench run . sequences         # throughput of a sequenced queue (one item per key at a time) against the same queue plain
//	go -C bench run . depends           # dependencies: a 10k fan-out/fan-in, 100 fan-ins and 100 chains of 100 against 10k plain items
//	go -C bench run . lived             # one drain per feature on a fresh database and on one that has lived (internal/lived)
//	go -C bench run . limits            # how much of a queue's limits a fleet uses: 1, 2, 4 workers and churn, with and without parts
//	go -C bench run . claimcost         # the claim's server CPU per item, plain and in parts, with the foreign-key checks and without
//	go -C bench run . ackcost           # the ack's server CPU per item, items without a kind and with one
//	go -C bench run . overload          # 128 worker processes drain a backlog: sessions lost while alive, items/s, heartbeat round trips
//	go -C bench run . idle              # what idle fleets cost: statements/s per session, CPU, connections
//	go -C bench run . endedform         # the ended-id record per item against per ack transaction (GIN): the ack's and its readers' CPU
//
// Without --database-url it starts its own throwaway PostgreSQL server with
// the library's internal/dbserver (the server binaries must be installed:
// ../scripts/setup-db does it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const usage = `Usage:
  go -C bench run . [compare] [flags]   compare throughput with River (the default)
  go -C bench run . table [flags]       issue #32's table: crdbwork's two shapes, River, graphile-worker,
                                        pg-boss and the machine's limits, with the goals' pass/fail
  go -C bench run . growth [flags]      claim cost against backlog and sessions
  go -C bench run . fairness [flags]    tenants' waits and fairness, fair queue or plain
  go -C bench run . order [flags]       how relaxed the claim order is (PEI)
  go -C bench run . latency [flags]     pickup latency on an idle queue, beside River's
  go -C bench run . sequences [flags]   a sequenced queue's throughput against the same queue plain
  go -C bench run . depends [flags]     dependencies: fan-out/fan-in and chains against plain items
  go -C bench run . lived [flags]       one drain per feature on a fresh database and on one that has lived
  go -C bench run . limits [flags]      how much of a queue's limits (in flight, rate) a fleet uses; --handover: the hand-over bound
  go -C bench run . claimcost [flags]   the claim's server CPU per claimed item (one backend's CPU time), plain and parts mode
  go -C bench run . ackcost [flags]     the ack's server CPU per acked item (one backend's CPU time), without and with a kind
  go -C bench run . overload [flags]    --processes worker processes drain a backlog: sessions lost, items/s, heartbeat round trips
  go -C bench run . idle [flags]        what idle fleets cost: statements/s per session, server and client CPU, connections
  go -C bench run . endedform [flags]   the ended-id record's forms: per-item rows, a row per ack transaction with a GIN
                                        index (fastupdate off, on), none; the ack's CPU per item and the readers' (dedup check, prune)

compare drains --items no-op jobs with each system in turn, --rounds times,
alternating the systems in each round, on one PostgreSQL server:

  River plain           River's at-least-once mode: no result row, completions
                        batched (MaxWorkers --river-workers, FetchCooldown 1ms)
  River JobCompleteTx   River's transactional mode: each worker writes a result
                        row and completes its job in one transaction
  crdbwork exactly-once crdbwork's worker package: each item's result row is
                        written in its ack transaction

and prints the median jobs/s of each, its ratio to River plain (the median of
the ratios within each round, with their range), and the peak
number of client connections to the server during its runs (pg_stat_activity),
with the machine's load average. Only the drain is timed (from starting the
consumers to the last completion); enqueueing is not.

table drains --items no-op jobs with crdbwork's bench mode (what compare
runs), crdbwork in the shape a user writes first (4 workers × 256 handlers,
16 parts, ack batch 64, a Record per job), River plain, graphile-worker
batched and pg-boss batch fetch (Node.js child processes: bench/peers, npm ci
there when node_modules is missing) and the machine's exactly-once and
at-least-once limits (4 connections looping one DELETE … FOR UPDATE SKIP
LOCKED of 2,000 jobs, with and without their result rows inserted in the
same statement), the order rotated every round, and prints each one's
jobs/s, its ratios to crdbwork's bench mode and to the exactly-once limit,
CPU, statements and round trips per job, and issue #32's goals with pass or
FAIL.

latency has another process (this program again) enqueue one item at a
time into an idle queue, --gap to 2·--gap apart, and measures from the return
of its enqueue (the commit acknowledged) to the start of its handler, for River
(LISTEN/NOTIFY, its defaults) and crdbwork (its defaults: wake-ups on; with
--parts parts; with wake-ups off, the poll alone; and with the idle probe
instead of LISTEN, as on CockroachDB, without and with parts), alternating the systems
in each round; it prints p50 and p99 and their ratios to River's in the same
round.

growth seeds a backlog of items with INSERT ... SELECT generate_series and
measures crdbwork's claim latency and claim+ack throughput at each backlog
and number of concurrent sessions.

fairness spreads --items over --tenants tenants with Pareto-distributed
backlogs (a fifth of the tenants hold four fifths of the items), lets
--workers in-process workers drain them from a fair (--fair, the default) or
plain (--fair=false) queue while single items of small tenants trickle in,
and reports the small tenants' waits (in seconds and in claims) and Jain's
index of the backlogged tenants' service.

depends drains the same number of no-op items (--width·--depth + 2) four
ways with the same in-process workers: plain, as a fan-out/fan-in (one root,
the children after it, one join after every child), as --width fan-ins of
--depth items (a root, children after it, a join after them) and as --width
chains of --depth items, each enqueued before the workers start; it prints
each drain's time and items/s and its time over the plain drain's in the
same round. With --lived it first brings the database to the state of one
that has lived (internal/lived): other queues' rows, analyzed before the
experiment's queues exist, a third of them ended since.

lived drains, for each feature (plain, fair, sequenced, dependencies as a
fan-out/fan-in and as chains, the urgent lane, a fleet-wide limit), --items
items on a fresh database and on one that has lived (other queues with
--rows items analyzed before the queue under test existed, dead tuples,
ended ids, dead and waiting items; internal/lived), each in a database of
its own on one server; it prints each drain's time, the time to the first
ack, the longest stretch without an ack from the first ack to the last, and
whether every item ended exactly once, then per feature the median lived/
fresh ratio (goals: within 2×, no stretch over 2 s).

limits runs in-process workers under a queue's limit of --limit items in
flight (items of --item-time) and then under a rate of --rate items per
second (items of --rate-item-time), with 1, 2 and 4 workers and with a worker
joining or leaving every second, with and without parts, each on a fresh
database, and prints per cell the most and the mean running at once and the
rate achieved and the most started within any second (docs/limits.md,
"Measured"); with --handover, items longer than the shares' Grace under
churn (the hand-over bound). It fails if a bound was exceeded.

claimcost seeds --items items and has one session claim them all in batches
of --batch through claim.Queue on a pool of one connection, nothing acked,
and prints that connection's backend's CPU time (/proc/<pid>/stat, so the
server must run on this machine) per claimed item: the plain claim, the
parts-mode claim over --owned parts, and each with the foreign-key triggers
off (session_replication_role = replica, a measurement of the per-row
checks' share only).

ackcost seeds --items items, has one session claim them all (untimed), and
acks them through claim.Queue.AckMany in transactions of --batch items, no
record, on a pool of one connection, and prints that connection's backend's
CPU time per acked item (the whole ack transaction: BEGIN, the fenced delete
with its ended record, COMMIT): items without a kind and items of kind
--kind, alternating.

order enqueues --items items with random priorities (--priorities) and
counts, for every claimed item, the claimable items before it in the queue's
strict order (its popped element index, PEI): median, mean, p90, p99, max;
with --urgent-priority N, the urgent items' apart.

overload starts --processes worker processes (this program again, each a
separate OS process with one worker: --concurrency handlers, --parts parts,
results recorded in the ack transaction) on one queue holding a backlog of
--items items, waits until the backlog is drained, stops them gracefully,
and reports the sessions lost while their process was alive (the goal: none),
the items per second, the heartbeats' round trips (p50, p90, p99, max, with
the connection a heartbeat had to open, if any) and the machine's load. The
throwaway server gets max_connections for every process's connections.

sequences drains --items items spread over --keys keys from a plain queue
and from a sequenced one (docs/sequences.md: one item in flight per key, in
enqueue order), alternating which goes first in each round, and prints each
drain's jobs/s, the medians and the median ratio sequenced/plain, with the
machine's load.

Both check that every item was acked exactly once, and print one JSON line
with --json.

endedform measures the ended-id record's forms (issue #32, goal 2): today's
crdbwork_ended row per item, one row per ack transaction with the ids as an
array and a GIN index (fastupdate off, then on), and none. It drains
--items claimed items per form with the library's pipelined ack statement
in transactions of each of --batches items on one connection, the forms
rotated every round, and prints that backend's CPU per item, the whole
server's and the ack statement's execution time, checking that each record
holds every acked id; then, on a record of --record ended ids per form, the
CPU per id of the enqueue's dedup check and of the prune of expired ids.

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	cmd := "compare"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "compare":
		return compare(ctx, args, out)
	case "growth":
		return growth(ctx, args, out)
	case "fairness":
		return fairness(ctx, args, out)
	case "order":
		return orderCmd(ctx, args, out)
	case "latency":
		return latency(ctx, args, out)
	case "sequences":
		return sequences(ctx, args, out)
	case "depends":
		return dependsCmd(ctx, args, out)
	case "lived":
		return livedCmd(ctx, args, out)
	case "limits":
		return limitsCmd(ctx, args, out)
	case "table":
		return tableCmd(ctx, args, out)
	case "claimcost":
		return claimcostCmd(ctx, args, out)
	case "ackcost":
		return ackcostCmd(ctx, args, out)
	case "overload":
		return overloadCmd(ctx, args, out)
	case "idle":
		return idleCmd(ctx, args, out)
	case "endedform":
		return endedformCmd(ctx, args, out)
	case "produce": // the producer process of latency (not for users)
		return produce(ctx, args, out)
	case "overload-worker": // a worker process of overload (not for users)
		return overloadWorker(ctx, args, out)
	default:
		return fmt.Errorf("unknown command %q (want compare, table, growth, fairness, order, latency, sequences, depends, lived, limits, claimcost, ackcost, overload, idle or endedform; see --help)", cmd)
	}
}

// commonFlags are the flags of every command.
type commonFlags struct {
	databaseURL string
	statements  bool
	fsync       bool
	// preload loads pg_stat_statements in the throwaway server even
	// without --statements (compare counts statements per item).
	preload bool
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL server to use (its database is changed: River's and crdbwork's tables are created and emptied); default: start a throwaway server")
	fs.BoolVar(&c.statements, "statements", false, "print the statements each system ran per item, with server time (pg_stat_statements; preloaded in the throwaway server)")
	fs.BoolVar(&c.fsync, "fsync", false, "start the throwaway server durable: fsync, synchronous_commit and full_page_writes on (default: off, the tests' server)")
}

// postmaster is the pid of the server started by this command (0: none),
// whose CPU time compare reports.
var postmaster int

// database returns the URL of the server to use and a function that stops
// it when it was started here.
func (c *commonFlags) database(ctx context.Context, out io.Writer) (string, func(), error) {
	if c.databaseURL != "" {
		return c.databaseURL, func() {}, nil
	}
	url, pid, stop, err := startServer(ctx, out, c.statements || c.preload, c.fsync)
	if err != nil {
		return "", nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	durability := "fsync off"
	if c.fsync {
		durability = "fsync on: durable commits"
	}
	// The server's own word for it, so that a run shows what it ran on.
	var fsync, syncCommit string
	if conn, err := pgx.Connect(ctx, url); err == nil {
		_ = conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&fsync, &syncCommit)
		conn.Close(ctx)
	}
	fmt.Fprintf(out, "throwaway PostgreSQL (internal/dbserver: %s; the server says fsync=%s, synchronous_commit=%s) at %s\n", durability, fsync, syncCommit, url)
	postmaster = pid
	return url, stop, nil
}

func newFlagSet(name string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// system is one of the systems compared.
type system interface {
	name() string
	run(ctx context.Context, url string, d drain, m marks) (result, error)
}

// drain is what one run does: enqueue items+backlog jobs (untimed), then
// time the completion of items of them; the backlog stays in the queue
// while they drain (and is emptied, untimed, before the next run).
type drain struct {
	items, backlog int
}

// marks are called by a system's run just before it starts its consumers
// and just after the last item completed (before stopping them).
type marks struct {
	start, done func()
}

// appName is the application_name of the systems' connections, which the
// connection monitor counts.
const appName = "bench-system"

// result is one drain.
type result struct {
	elapsed   time.Duration
	peakConns int
	poolConns int
	retries   int64
	cpu       cpuTimes // from start to done
	count     counts   // from start to done
	// childCPU is the CPU time of a child process that ran the system
	// (the Node.js peers), added to the client's.
	childCPU time.Duration
	// noTrips: the system's round trips were not counted (another
	// process's connections).
	noTrips bool
}

// per1000 formats the run's statements and round trips per 1,000 of items.
func (r result) per1000(items int) string {
	if r.noTrips {
		return fmt.Sprintf("%.1f statements, — round trips", per1000(r.count.statements, items))
	}
	return r.count.per1000(items)
}

// runTimeout bounds one drain: at least a minute, or 1 ms per item.
func runTimeout(items int) time.Duration {
	return max(time.Minute, time.Duration(items)*time.Millisecond)
}

// newPool opens a pool of at most conns connections (0: pgxpool's default,
// the larger of 4 and the number of CPUs) for a measured system: the
// connection monitor counts its connections.
func newPool(ctx context.Context, url string, conns int) (*pgxpool.Pool, error) {
	return openPool(ctx, url, conns, appName)
}

// prepare starts or connects to the database (see database), opens the
// setup pool and creates River's and crdbwork's tables there; done closes the
// pool and stops the server it started.
func (c *commonFlags) prepare(ctx context.Context, out io.Writer) (url string, setup *pgxpool.Pool, done func(), err error) {
	url, stopServer, err := c.database(ctx, out)
	if err != nil {
		return "", nil, nil, err
	}
	if setup, err = newSetupPool(ctx, url); err != nil {
		stopServer()
		return "", nil, nil, err
	}
	done = func() { setup.Close(); stopServer() }
	if err := setupRiver(ctx, setup); err != nil {
		done()
		return "", nil, nil, err
	}
	if err := setupCrdbwork(ctx, setup); err != nil {
		done()
		return "", nil, nil, err
	}
	return url, setup, done, nil
}

// newSetupPool opens a pool for set-up and checks, which the connection
// monitor does not count.
// crdbworkDatabase is database, a setup pool on it and crdbwork's schema
// applied: what most commands start with. done closes the pool, then stops
// the server the command started (if it started one).
func (c *commonFlags) crdbworkDatabase(ctx context.Context, out io.Writer) (url string, setup *pgxpool.Pool, done func(), err error) {
	url, stopServer, err := c.database(ctx, out)
	if err != nil {
		return "", nil, nil, err
	}
	setup, err = newSetupPool(ctx, url)
	if err != nil {
		stopServer()
		return "", nil, nil, err
	}
	done = func() { setup.Close(); stopServer() }
	if err := setupCrdbwork(ctx, setup); err != nil {
		done()
		return "", nil, nil, err
	}
	return url, setup, done, nil
}

func newSetupPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return openPool(ctx, url, 2, "bench-setup")
}

func openPool(ctx context.Context, url string, conns int, name string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	if conns > 0 {
		cfg.MaxConns = int32(conns)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	if name == appName {
		countTrips(cfg.ConnConfig)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func compare(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("compare", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 30_000, "jobs drained by each system in each round")
	backlog := fs.Int("backlog", 0, "jobs enqueued beyond --items before each timed drain (e.g. 1000000): the drain of --items runs against that backlog")
	rounds := fs.Int("rounds", 3, "rounds; each runs every system once, in an order that alternates between rounds")
	only := fs.String("systems", "river,river-tx,crdbwork", "systems to run, comma-separated: river, river-tx, crdbwork, crdbwork-batch (crdbwork with --cw-record batch)")
	riverWorkers := fs.Int("river-workers", 1000, "River's MaxWorkers")
	riverConns := fs.Int("river-conns", 0, "River's pool size (0: pgxpool's default, max(4, CPUs))")
	cw := &crdbworkSystem{}
	fs.IntVar(&cw.workers, "cw-workers", 1, "crdbwork worker processes (in-process, one session each)")
	fs.IntVar(&cw.concurrency, "cw-concurrency", 0, "crdbwork handlers per worker (0: --river-workers, as many handlers as River runs)")
	fs.IntVar(&cw.ackBatch, "cw-ack-batch", 0, "most items acked in one transaction (worker.Options.MaxAckBatch; 0: its default, a quarter of the handlers, 64 to 256)")
	fs.IntVar(&cw.parts, "cw-parts", 0, "crdbwork parts (0: no parts mode, any session claims any item)")
	fs.IntVar(&cw.ackers, "cw-ackers", 0, "crdbwork settle goroutines per worker (worker.Options.Ackers; 0: its default)")
	fs.StringVar(&cw.record, "cw-record", "statement", "how crdbwork's handler records its result row: statement (worker.Options.BatchStatement: one INSERT per ack transaction, given as SQL, so the ack transaction is one round trip), batch (worker.Options.BatchRecord: the same INSERT run by Go code in the transaction) each (a Record per item, worker.Exec's: one INSERT per item, sent with the ack's COMMIT) or func (a Record per item that is a function running its INSERT: one round trip per item)")
	fs.IntVar(&cw.conns, "cw-conns", 0, "pool size of each crdbwork worker (0: worker.PoolConns)")
	fs.BoolVar(&cw.dedupOff, "cw-dedup-off", false, "turn the bench queue's dedup window off (claim.Policy.DedupOff): acks record no ended ids (what the record costs)")
	fs.StringVar(&cw.kind, "cw-kind", "", "every crdbwork item's kind (claim.NewItem.Kind; empty: none): what an item's kind costs its claim and ack")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process during crdbwork's first run to `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case *items < 1 || *rounds < 1 || *backlog < 0:
		return errors.New("--items and --rounds must be at least 1, --backlog at least 0")
	case cw.workers < 1 || cw.concurrency < 0 || cw.ackBatch < 0 || cw.parts < 0 || cw.conns < 0 || cw.ackers < 0:
		return errors.New("--cw-workers must be at least 1, --cw-concurrency, --cw-ack-batch, --cw-parts, --cw-conns and --cw-ackers at least 0")
	case cw.record != "statement" && cw.record != "batch" && cw.record != "each" && cw.record != "func":
		return fmt.Errorf("--cw-record %q: want statement, batch, each or func", cw.record)
	case *riverWorkers < 1 || *riverConns < 0:
		return errors.New("--river-workers must be at least 1, --river-conns at least 0")
	}
	cw.profile = *cpuprofile
	if cw.concurrency == 0 {
		cw.concurrency = *riverWorkers
	}
	var systems []system
	for _, s := range strings.Split(*only, ",") {
		switch strings.TrimSpace(s) {
		case "river":
			systems = append(systems, riverSystem{maxWorkers: *riverWorkers, conns: *riverConns})
		case "river-tx":
			systems = append(systems, riverSystem{tx: true, maxWorkers: *riverWorkers, conns: *riverConns})
		case "crdbwork":
			systems = append(systems, cw)
		case "crdbwork-batch":
			// The same workers with the results written by Go code in
			// the ack transaction (BatchRecord: four round trips per ack
			// transaction), beside the pipelined default in the same run.
			alt := *cw
			alt.record, alt.label, alt.profile = "batch", "crdbwork BatchRecord", ""
			systems = append(systems, &alt)
		default:
			return fmt.Errorf("--systems: unknown system %q (want river, river-tx, crdbwork, crdbwork-batch)", s)
		}
	}

	c.preload = true
	url, setup, done, err := c.prepare(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	stmts := newStatements(ctx, setup)
	if !stmts.on {
		fmt.Fprintln(out, "pg_stat_statements is not available on this server: statements per item show as —")
	}

	fmt.Fprintf(out, "%d items per run (backlog %d more), %d rounds, GOMAXPROCS %d, load %s\n", *items, *backlog, *rounds, runtime.GOMAXPROCS(0), loadavg())
	fmt.Fprintf(out, "crdbwork: %s\n", cw.settings())
	runs := make(map[string][]result)
	for round := range *rounds {
		order := slices.Clone(systems)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			res, err := measureRun(ctx, out, s, url, drain{items: *items, backlog: *backlog}, setup, stmts, round == 0 && c.statements, round)
			if err != nil {
				return err
			}
			runs[s.name()] = append(runs[s.name()], res)
		}
	}

	fmt.Fprintf(out, "\nmedian of %d rounds, %d items each, load %s:\n\n", *rounds, *items, loadavg())
	fmt.Fprintf(out, "| %-22s | %8s | %14s | %13s | %16s | %17s | %24s |\n", "system", "jobs/s", "× River plain", "rounds' range", "connections", "CPU µs/job cl+srv", "statements / trips per 1k")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 24), strings.Repeat("-", 10), strings.Repeat("-", 16), strings.Repeat("-", 15), strings.Repeat("-", 18), strings.Repeat("-", 19), strings.Repeat("-", 26))
	base := runs["River plain"]
	for _, s := range systems {
		rs := runs[s.name()]
		ratio, spread := "—", "—"
		if len(base) == len(rs) {
			ratios := make([]float64, len(rs))
			for i := range rs {
				ratios[i] = base[i].elapsed.Seconds() / rs[i].elapsed.Seconds()
			}
			ratio = fmt.Sprintf("%.2f×", median(ratios))
			spread = fmt.Sprintf("%.2f–%.2f", slices.Min(ratios), slices.Max(ratios))
		}
		peak := 0
		var client, server, st, trips []float64
		for _, r := range rs {
			peak = max(peak, r.peakConns)
			client = append(client, perItem(r.cpu.client, *items))
			server = append(server, perItem(r.cpu.server, *items))
			st = append(st, per1000(r.count.statements, *items))
			trips = append(trips, per1000(r.count.trips, *items))
		}
		stmtCol := fmt.Sprintf("%.1f", median(st))
		if !stmts.on {
			stmtCol = "—"
		}
		fmt.Fprintf(out, "| %-22s | %8.0f | %14s | %13s | %4d (pool %3d) | %7.0f + %7.0f | %24s |\n", s.name(), medianRate(rs, *items), ratio, spread,
			peak, rs[0].poolConns, median(client), median(server), fmt.Sprintf("%s / %.1f", stmtCol, median(trips)))
	}
	fmt.Fprintln(out, "\n× River plain: the median over rounds of the ratio of the two systems' rates in the same round.")
	fmt.Fprintln(out, "connections: the peak seen in pg_stat_activity (pool: the pool's limit; River adds a listener outside it).")
	fmt.Fprintln(out, "CPU: medians of this process (client) and of the server (0 with --database-url) per job while draining.")
	fmt.Fprintln(out, "per 1k: medians per 1,000 jobs drained of the statements the server ran (pg_stat_statements calls, BEGIN and")
	fmt.Fprintln(out, "  COMMIT included) and of the system's round trips (its connections' turns from reading to writing: a batch or")
	fmt.Fprintln(out, "  pipeline of statements sent together is one).")
	return nil
}

// perItem is d in microseconds per item.
func perItem(d time.Duration, items int) float64 {
	return float64(d.Microseconds()) / float64(items)
}

// medianRate is the median of the runs' items per second.
func medianRate(rs []result, items int) float64 {
	rates := make([]float64, len(rs))
	for i, r := range rs {
		rates[i] = float64(items) / r.elapsed.Seconds()
	}
	return median(rates)
}

// median returns the median of xs (0 if empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// measureRun runs s once: its drain with the statements, CPU and round-trip
// marks around it, and prints its round line (with showStatements, the
// statements it ran, from pg_stat_statements, after it).
func measureRun(ctx context.Context, out io.Writer, s system, url string, d drain, setup *pgxpool.Pool, stmts statements, showStatements bool, round int) (result, error) {
	var report strings.Builder
	var cpu0, cpu cpuTimes
	var count0, count counts
	m := marks{
		start: func() {
			stmts.reset(ctx, setup)
			count0 = readCounts()
			cpu0 = readCPU(postmaster)
		},
		done: func() {
			cpu = readCPU(postmaster).sub(cpu0)
			count = readCounts().sub(count0)
			count.statements = stmts.calls(ctx, setup)
			if showStatements && stmts.on {
				if err := stmts.print(ctx, &report, setup, s.name(), d.items, cpu.server); err != nil {
					fmt.Fprintln(&report, err)
				}
			}
		},
	}
	res, err := s.run(ctx, url, d, m)
	if err != nil {
		return result{}, fmt.Errorf("%s, round %d: %w", s.name(), round+1, err)
	}
	cpu.client += res.childCPU
	res.cpu, res.count = cpu, count
	retries := ""
	if res.retries > 0 {
		retries = fmt.Sprintf("  %.3f retries/job", float64(res.retries)/float64(d.items))
	}
	fmt.Fprintf(out, "round %d  %-22s %8.0f jobs/s  %6.2fs  peak %3d connections  CPU/job: client %3.0fµs server %3.0fµs  per 1,000 jobs: %s  load %s%s\n",
		round+1, s.name(), float64(d.items)/res.elapsed.Seconds(), res.elapsed.Seconds(), res.peakConns,
		perItem(res.cpu.client, d.items), perItem(res.cpu.server, d.items), res.per1000(d.items), loadavg(), retries)
	fmt.Fprint(out, report.String())
	return res, nil
}
