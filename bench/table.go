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
)

// The table of issue #32: crdbwork in its bench mode and in the shape a
// user writes first, River plain, graphile-worker and pg-boss in their fast
// settings, and the machine's exactly-once and at-least-once limits, in one
// run on one server, systems alternating, the order rotated every round.

// Names of the table's systems in the output.
const (
	nameBench    = "crdbwork bench mode"
	nameUser     = "crdbwork user shape"
	nameGraphile = "graphile-worker batched"
	namePgBoss   = "pg-boss batch fetch"
)

// userShapeRecord is how the user shape records its result rows (a
// --cw-record value): a Record per item, what a user writes first. When the
// worker's pipelined per-item Record (worker.Exec) is what --cw-record each
// measures, nothing here changes; if it gets a name of its own, this is the
// one line to switch.
const userShapeRecord = "each"

// tableSystems are the systems of the table, by their --systems names, in
// their first round's order.
var tableSystems = []string{"crdbwork", "crdbwork-user", "river", "graphile", "pgboss", "limit-eo", "limit-alo"}

// goal is one of issue #32's ratio goals: system's rate at least min times
// base's, the median of the same-round ratios.
type goal struct {
	system, base string
	min          float64
	what         string
}

var tableGoals = []goal{
	{nameBench, "limit exactly-once", 0.3, "crdbwork bench mode ≥ 0.3× the exactly-once limit"},
	{nameUser, "limit exactly-once", 0.2, "crdbwork user shape ≥ 0.2× the exactly-once limit"},
	{nameBench, nameGraphile, 1.5, "crdbwork bench mode ≥ 1.5× graphile-worker batched"},
	{nameBench, namePgBoss, 1.5, "crdbwork bench mode ≥ 1.5× pg-boss batch fetch"},
}

func tableCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("table", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 50_000, "jobs drained by each system in each round")
	rounds := fs.Int("rounds", 3, "rounds; each runs every system once, the order rotated by one every round")
	only := fs.String("systems", strings.Join(tableSystems, ","), "systems to run, comma-separated, of "+strings.Join(tableSystems, ", "))
	riverWorkers := fs.Int("river-workers", 1000, "River's MaxWorkers, and crdbwork bench mode's handlers")
	userRecord := fs.String("user-record", userShapeRecord, "how the user shape records its results (a --cw-record value of compare: each, batch or statement)")
	graphileJobs := fs.Int("graphile-jobs", 24, "graphile-worker's concurrentJobs (its pool: one more)")
	peerBatch := fs.Int("peer-batch", 500, "graphile-worker's localQueue size and pg-boss's batchSize")
	pgbossWorkers := fs.Int("pgboss-workers", 4, "pg-boss work() loops")
	limitConns := fs.Int("limit-conns", 4, "connections of each limit program")
	limitBatch := fs.Int("limit-batch", 2000, "jobs each limit statement takes")
	peersDir := fs.String("peers-dir", "peers", "directory of the Node.js peers (bench/peers; npm ci runs there when node_modules is missing or older than the lock file)")
	asJSON := fs.Bool("json", false, "also print the table and the goals as one JSON line at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case *items < 1 || *rounds < 1:
		return errors.New("--items and --rounds must be at least 1")
	case *riverWorkers < 1 || *graphileJobs < 1 || *peerBatch < 1 || *pgbossWorkers < 1 || *limitConns < 1 || *limitBatch < 1:
		return errors.New("--river-workers, --graphile-jobs, --peer-batch, --pgboss-workers, --limit-conns and --limit-batch must be at least 1")
	case *userRecord != "statement" && *userRecord != "batch" && *userRecord != "each":
		return fmt.Errorf("--user-record %q: want statement, batch or each", *userRecord)
	}
	bench := &crdbworkSystem{workers: 1, concurrency: *riverWorkers, record: "statement", label: nameBench}
	user := &crdbworkSystem{workers: 4, concurrency: 256, parts: 16, ackBatch: 64, record: *userRecord, label: nameUser}
	var systems []system
	peers := false
	seen := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); seen[s] {
			return fmt.Errorf("--systems: %s twice", s)
		}
		seen[s] = true
		switch s {
		case "crdbwork":
			systems = append(systems, bench)
		case "crdbwork-user":
			systems = append(systems, user)
		case "river":
			systems = append(systems, riverSystem{maxWorkers: *riverWorkers})
		case "graphile":
			peers = true
			systems = append(systems, peerSystem{peer: "graphile", label: nameGraphile, dir: *peersDir,
				args: []string{"--jobs", fmt.Sprint(*graphileJobs), "--batch", fmt.Sprint(*peerBatch)}})
		case "pgboss":
			peers = true
			systems = append(systems, peerSystem{peer: "pgboss", label: namePgBoss, dir: *peersDir,
				args: []string{"--workers", fmt.Sprint(*pgbossWorkers), "--batch", fmt.Sprint(*peerBatch)}})
		case "limit-eo":
			systems = append(systems, limitSystem{exactlyOnce: true, conns: *limitConns, batch: *limitBatch})
		case "limit-alo":
			systems = append(systems, limitSystem{conns: *limitConns, batch: *limitBatch})
		default:
			return fmt.Errorf("--systems: unknown system %q (want %s)", s, strings.Join(tableSystems, ", "))
		}
	}
	if peers {
		if err := ensurePeers(ctx, *peersDir, out); err != nil {
			return err
		}
	}

	c.preload = true
	url, setup, done, err := c.prepare(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	if err := setupMachineLimits(ctx, setup); err != nil {
		return err
	}
	stmts := newStatements(ctx, setup)
	if !stmts.on {
		fmt.Fprintln(out, "pg_stat_statements is not available on this server: statements per job show as —")
	}

	fmt.Fprintf(out, "%d jobs per run, %d rounds, GOMAXPROCS %d, load %s\n", *items, *rounds, runtime.GOMAXPROCS(0), loadavg())
	fmt.Fprintf(out, "%s: %s\n%s: %s\n", nameBench, bench.settings(), nameUser, user.settings())
	runs := make(map[string][]result)
	var loads []string
	report := tableReport{Items: *items, Rounds: *rounds}
	for round := range *rounds {
		order := slices.Concat(systems[round%len(systems):], systems[:round%len(systems)])
		before := loadavg()
		for _, s := range order {
			res, err := measureRun(ctx, out, s, url, drain{items: *items}, setup, stmts, round == 0 && c.statements, round)
			if err != nil {
				return err
			}
			runs[s.name()] = append(runs[s.name()], res)
		}
		loads = append(loads, fmt.Sprintf("round %d: %s → %s", round+1, before, loadavg()))
	}

	fmt.Fprintf(out, "\nmedians of %d rounds, %d jobs each; load (1, 5, 15 min) %s\n\n", *rounds, *items, strings.Join(loads, "; "))
	fmt.Fprintf(out, "| %-23s | %7s | %-24s | %-24s | %17s | %25s | %11s |\n", "system", "jobs/s", "× crdbwork bench (range)", "× exactly-once limit", "CPU µs/job cl+srv", "statements / trips per 1k", "connections")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 25), strings.Repeat("-", 9), strings.Repeat("-", 26), strings.Repeat("-", 26), strings.Repeat("-", 19), strings.Repeat("-", 27), strings.Repeat("-", 13))
	for _, s := range systems {
		rs := runs[s.name()]
		var client, server, st, trips []float64
		peak := 0
		for _, r := range rs {
			peak = max(peak, r.peakConns)
			client = append(client, perItem(r.cpu.client, *items))
			server = append(server, perItem(r.cpu.server, *items))
			st = append(st, per1000(r.count.statements, *items))
			trips = append(trips, per1000(r.count.trips, *items))
		}
		stCol, tripCol := fmt.Sprintf("%.1f", median(st)), fmt.Sprintf("%.1f", median(trips))
		if !stmts.on {
			stCol = "—"
		}
		if rs[0].noTrips {
			tripCol = "—"
		}
		fmt.Fprintf(out, "| %-23s | %7.0f | %-24s | %-24s | %7.0f + %7.0f | %25s | %11d |\n", s.name(), medianRate(rs, *items),
			ratioCol(runs, s.name(), nameBench), ratioCol(runs, s.name(), "limit exactly-once"),
			median(client), median(server), stCol+" / "+tripCol, peak)
		row := tableRowJSON{System: s.name(), JobsPerSecond: medianRate(rs, *items),
			XBench: newRatioJSON(sameRoundRatios(runs, s.name(), nameBench)), XLimit: newRatioJSON(sameRoundRatios(runs, s.name(), "limit exactly-once")),
			CPUClientMicros: median(client), CPUServerMicros: median(server), PeakConns: peak}
		if stmts.on {
			v := median(st)
			row.StatementsPer1k = &v
		}
		if !rs[0].noTrips {
			v := median(trips)
			row.TripsPer1k = &v
		}
		report.Systems = append(report.Systems, row)
	}
	fmt.Fprintln(out)
	for _, g := range tableGoals {
		ratios := sameRoundRatios(runs, g.system, g.base)
		if ratios == nil {
			fmt.Fprintf(out, "goal: %s: not measured (run both)\n", g.what)
			continue
		}
		verdict := "FAIL"
		if median(ratios) >= g.min {
			verdict = "pass"
		}
		report.Goals = append(report.Goals, goalJSON{Goal: g.what, Min: g.min, Ratio: newRatioJSON(ratios), Pass: verdict == "pass"})
		fmt.Fprintf(out, "goal: %s: %.2f× (rounds %.2f–%.2f): %s\n", g.what, median(ratios), slices.Min(ratios), slices.Max(ratios), verdict)
	}
	fmt.Fprintln(out, "\nWhat each system does per job:")
	legend := map[string]string{
		nameBench: fmt.Sprintf("exactly-once: a result row inserted in the job's ack transaction, with the claim-checked delete (%d worker × %d handlers, BatchStatement: one INSERT per ack transaction, sent with it)", bench.workers, bench.concurrency),
		nameUser: fmt.Sprintf("exactly-once: the demo's settings (%d workers × %d handlers, %d parts, ack batch %d), results recorded %s", user.workers, user.concurrency, user.parts, user.ackBatch,
			map[string]string{"each": "by a Record per job", "batch": "by a BatchRecord", "statement": "by a BatchStatement"}[user.record]),
		"River plain":         fmt.Sprintf("at-least-once, no result row: River v0.51.1, MaxWorkers %d, FetchCooldown 1 ms, completions batched", *riverWorkers),
		nameGraphile:          fmt.Sprintf("at-least-once, no result row (a task cannot add to graphile-worker's completion): %s, its documented fast settings: localQueue %d, completeJobBatchDelay 0, concurrentJobs %d, one Node.js process", peerVersion(nameGraphile, "graphile-worker"), *peerBatch, *graphileJobs),
		namePgBoss:            fmt.Sprintf("a result row per job inserted in the transaction of its completion (complete() on the handler's connection; the handler is at-least-once: pg-boss fences no claim): %s, %d work() loops of batchSize %d, one Node.js process", peerVersion(namePgBoss, "pg-boss"), *pgbossWorkers, *peerBatch),
		"limit exactly-once":  fmt.Sprintf("%d connections looping one statement: DELETE of the oldest %d jobs FOR UPDATE SKIP LOCKED, their result rows inserted in the same statement", *limitConns, *limitBatch),
		"limit at-least-once": fmt.Sprintf("%d connections looping the same DELETE … RETURNING alone", *limitConns),
	}
	for _, s := range systems {
		fmt.Fprintf(out, "  %-25s %s\n", s.name()+":", legend[s.name()])
	}
	fmt.Fprintln(out, "× columns: the median over rounds of the ratio of the two systems' rates in the same round (range: the rounds' lowest and highest).")
	fmt.Fprintln(out, "CPU: medians per job of the client (this process, and the Node.js process for the peers) and of the server (0 with --database-url).")
	fmt.Fprintln(out, "per 1k: statements the server ran (pg_stat_statements calls, BEGIN and COMMIT included; for the peers, also peer.js's own")
	fmt.Fprintln(out, "  check of the end) and round trips (this process's connections only: — for the Node.js peers) per 1,000 jobs.")
	fmt.Fprintln(out, "connections: the peak seen in pg_stat_activity during the system's runs.")
	if *asJSON {
		report.Loads = loads
		b, err := json.Marshal(report)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, string(b))
	}
	return nil
}

// tableReport is the table as one JSON line (--json).
type tableReport struct {
	Items   int            `json:"items"`
	Rounds  int            `json:"rounds"`
	Loads   []string       `json:"loads"` // per round: /proc/loadavg before → after
	Systems []tableRowJSON `json:"systems"`
	Goals   []goalJSON     `json:"goals"` // the goals both of whose systems ran
}

type tableRowJSON struct {
	System          string     `json:"system"`
	JobsPerSecond   float64    `json:"jobs_per_s"`
	XBench          *ratioJSON `json:"x_crdbwork_bench,omitempty"`
	XLimit          *ratioJSON `json:"x_exactly_once_limit,omitempty"`
	CPUClientMicros float64    `json:"cpu_client_us"`
	CPUServerMicros float64    `json:"cpu_server_us"`
	StatementsPer1k *float64   `json:"statements_per_1k,omitempty"`  // without pg_stat_statements: absent
	TripsPer1k      *float64   `json:"round_trips_per_1k,omitempty"` // the Node.js peers': absent
	PeakConns       int        `json:"peak_connections"`
}

// ratioJSON is a median of same-round ratios with their range.
type ratioJSON struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func newRatioJSON(ratios []float64) *ratioJSON {
	if ratios == nil {
		return nil
	}
	return &ratioJSON{Median: median(ratios), Min: slices.Min(ratios), Max: slices.Max(ratios)}
}

type goalJSON struct {
	Goal  string     `json:"goal"`
	Min   float64    `json:"min"`
	Ratio *ratioJSON `json:"ratio"`
	Pass  bool       `json:"pass"`
}

// peerVersion is the version a peer reported ("" before it ran).
func peerVersion(label, fallback string) string {
	if v, ok := peerVersions.Load(label); ok {
		return v.(string)
	}
	return fallback
}

// sameRoundRatios returns, for each round, system's rate over base's (nil
// unless both ran in every round).
func sameRoundRatios(runs map[string][]result, system, base string) []float64 {
	s, b := runs[system], runs[base]
	if len(s) == 0 || len(s) != len(b) {
		return nil
	}
	ratios := make([]float64, len(s))
	for i := range s {
		ratios[i] = b[i].elapsed.Seconds() / s[i].elapsed.Seconds()
	}
	return ratios
}

// ratioCol formats the median same-round ratio of system to base with its
// range ("—" unless both ran).
func ratioCol(runs map[string][]result, system, base string) string {
	ratios := sameRoundRatios(runs, system, base)
	if ratios == nil {
		return "—"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", median(ratios), slices.Min(ratios), slices.Max(ratios))
}
