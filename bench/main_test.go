package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMain runs the produce command instead of the tests in the producer
// processes that latency starts from the test binary.
func TestMain(m *testing.M) {
	if os.Getenv(producerEnv) != "" || os.Getenv(overloadEnv) != "" {
		if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench produce:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestLatencyMeasuresEverySystem runs a tiny latency table: one row per
// system, River at 1.00×. Each sample fails the
// run unless its item's handler started.
func TestLatencyMeasuresEverySystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"latency", "--samples", "5", "--rounds", "2", "--gap", "110ms", "--parts", "4"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	row := regexp.MustCompile(`(?m)^\| (River|crdbwork|crdbwork, 4 parts|crdbwork, no wake-ups|crdbwork, probe|crdbwork, 4 parts, probe) +\| +([0-9.]+) \| +([0-9.]+) \| +([0-9.]+)× \| +([0-9.]+)× \|$`)
	rows := row.FindAllStringSubmatch(out.String(), -1)
	if len(rows) != 6 {
		t.Fatalf("want 6 table rows, got %d:\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if r[1] == "River" && (r[4] != "1.00" || r[5] != "1.00") {
			t.Errorf("River's ratios to itself are %s× and %s×", r[4], r[5])
		}
	}
	if n := strings.Count(out.String(), "\nround "); n != 12 {
		t.Errorf("want 12 runs (6 systems × 2 rounds), got %d:\n%s", n, out.String())
	}
}

// TestCompareDrainsEverySystem runs a small comparison on a throwaway server
// and checks its table: one row per system with a positive rate, River plain
// at 1.00×. Each run itself fails unless every job completed (and, for the
// transactional systems, wrote exactly one result row).
func TestCompareDrainsEverySystem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"--items", "500", "--rounds", "2", "--cw-concurrency", "64"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	checkCompareTable(t, out.String(), 3)
	if n := strings.Count(out.String(), "\nround "); n != 6 {
		t.Errorf("want 6 runs (3 systems × 2 rounds), got %d:\n%s", n, out.String())
	}
}

// compareRow is a row of compare's table: system, jobs/s, ratio,
// connections, statements and round trips per 1,000 jobs.
var compareRow = regexp.MustCompile(`(?m)^\| (River plain|River JobCompleteTx|crdbwork exactly-once|crdbwork BatchRecord) +\| +(\d+) \| +([0-9.]+)× \| +[0-9.]+–[0-9.]+ \| +(\d+) \(pool +\d+\) \| +\d+ \+ +\d+ \| +([0-9.]+) / ([0-9.]+) \|$`)

// checkCompareTable checks that compare's table has want rows, each with a
// positive rate, connections, statements and round trips, and River plain
// at 1.00×.
func checkCompareTable(t *testing.T, out string, want int) {
	t.Helper()
	rows := compareRow.FindAllStringSubmatch(out, -1)
	if len(rows) != want {
		t.Fatalf("want %d table rows, got %d:\n%s", want, len(rows), out)
	}
	for _, r := range rows {
		rate, _ := strconv.Atoi(r[2])
		conns, _ := strconv.Atoi(r[4])
		stmts, _ := strconv.ParseFloat(r[5], 64)
		trips, _ := strconv.ParseFloat(r[6], 64)
		if rate <= 0 || conns <= 0 || stmts <= 0 || trips <= 0 {
			t.Errorf("%s: rate %d jobs/s, %d connections, %v statements and %v round trips per 1,000 jobs; want all positive", r[1], rate, conns, stmts, trips)
		}
		if r[1] == "River plain" && r[3] != "1.00" {
			t.Errorf("River plain's ratio to itself is %s×", r[3])
		}
	}
}

// TestCompareBacklogOnDurableServer drains 300 jobs of 1,300 on a durable
// server (fsync on), with River and both of crdbwork's ways of recording
// results: each run fails unless the jobs completed, once each, number at
// least those counted and the rest are still queued.
func TestCompareBacklogOnDurableServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"--items", "300", "--backlog", "1000", "--fsync", "--rounds", "1", "--systems", "river,crdbwork,crdbwork-batch", "--cw-concurrency", "32"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"fsync on: durable commits; the server says fsync=on, synchronous_commit=on", "300 items per run (backlog 1000 more)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	checkCompareTable(t, out.String(), 3)
}

// TestGrowthMeasuresEveryCell runs a tiny cost-growth table.
func TestGrowthMeasuresEveryCell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"growth", "--backlogs", "1000,3000", "--sessions", "1,3", "--duration", "300ms"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	row := regexp.MustCompile(`(?m)^\| +(\d+) \| +(\d+) \| +\S+ \| +\S+ \| +(\d+) \|`)
	rows := row.FindAllStringSubmatch(out.String(), -1)
	if len(rows) != 4 {
		t.Fatalf("want 4 cells, got %d:\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if rate, _ := strconv.Atoi(r[3]); rate <= 0 {
			t.Errorf("backlog %s, %s sessions: %d items/s", r[1], r[2], rate)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--items", "0"},
		{"--backlog", "-1"},
		{"--systems", "river,kafka"},
		{"growth", "--backlogs", "10,x"},
		{"latency", "--samples", "0"},
		{"latency", "--systems", "river,kafka"},
		{"latency", "--probe-every", "0s"},
		{"table", "--items", "0"},
		{"table", "--systems", "crdbwork,sidekiq"},
		{"table", "--systems", "crdbwork,limit-eo,crdbwork"},
		{"table", "--user-record", "sometimes"},
		{"table", "--limit-conns", "0"},
		{"frobnicate"},
	} {
		if err := run(context.Background(), args, &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func TestMedianRate(t *testing.T) {
	rs := []result{{elapsed: 4 * time.Second}, {elapsed: time.Second}, {elapsed: 2 * time.Second}}
	if got := medianRate(rs, 100); got != 50 {
		t.Errorf("median of 25, 100 and 50 items/s: got %v", got)
	}
	if got := medianRate(rs[:2], 100); got != 62.5 {
		t.Errorf("median of 25 and 100 items/s: got %v", got)
	}
}

// TestOverloadDrains runs a tiny overload: two worker processes (this test
// binary again) drain 500 items; every item has its result, and the report
// counts the processes' sessions and heartbeats.
func TestOverloadDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"overload", "--processes", "2", "--items", "500", "--concurrency", "16", "--parts", "4",
		"--heartbeat", "200ms", "--expiry", "10s", "--json"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep OverloadReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("the last line is not the JSON report: %v\n%s", err, out.String())
	}
	// At least one session: on a quiet machine the first process can
	// drain the 500 items before the second has started its session (the
	// backlog is there before the processes start, as in a real run).
	if rep.Results != 500 || rep.Remaining != 0 || rep.Processes != 2 || rep.SessionsStarted < 1 || rep.Heartbeats == 0 || rep.ProcessesExited != 0 {
		t.Fatalf("report %+v: want 500 results, none left, a session started, heartbeats timed, no process exited early", rep)
	}
}
