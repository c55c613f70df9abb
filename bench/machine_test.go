package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLimitProgramsDrain runs each limit program on a throwaway server and
// checks the database after it: every job taken, and one result row per
// job for the exactly-once limit, none for the at-least-once one.
func TestLimitProgramsDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	url, _, stop, err := startServer(ctx, &strings.Builder{}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	setup, err := newSetupPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if err := setupMachineLimits(ctx, setup); err != nil {
		t.Fatal(err)
	}
	for _, l := range []limitSystem{{exactlyOnce: true, conns: 4, batch: 700}, {conns: 3, batch: 1000}} {
		started, done := 0, 0
		res, err := l.run(ctx, url, drain{items: 5003}, marks{start: func() { started++ }, done: func() { done++ }})
		if err != nil {
			t.Fatalf("%s: %v", l.name(), err)
		}
		if started != 1 || done != 1 || res.elapsed <= 0 || res.peakConns < 1 {
			t.Errorf("%s: marks start %d, done %d times; elapsed %v, peak %d connections", l.name(), started, done, res.elapsed, res.peakConns)
		}
		var left, results, distinct int
		if err := setup.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_limit_jobs), (SELECT count(*) FROM bench_limit_results), (SELECT count(DISTINCT job_id) FROM bench_limit_results)`).Scan(&left, &results, &distinct); err != nil {
			t.Fatal(err)
		}
		want := 0
		if l.exactlyOnce {
			want = 5003
		}
		if left != 0 || results != want || distinct != want {
			t.Errorf("%s: %d jobs left, %d result rows (%d distinct); want 0 and %d", l.name(), left, results, distinct, want)
		}
	}
	if _, err := (limitSystem{conns: 1, batch: 10}).run(ctx, url, drain{items: 10, backlog: 5}, marks{}); err == nil {
		t.Error("a limit program ran with a backlog")
	}
}

// tableRow is a row of the table command: system, jobs/s, the two ratio
// columns, client and server CPU, statements and round trips per 1k.
var tableRow = regexp.MustCompile(`(?m)^\| (crdbwork bench mode|crdbwork user shape|River plain|graphile-worker batched|pg-boss batch fetch|limit exactly-once|limit at-least-once) +\| +(\d+) \| (\S+(?: \(\S+\))?) +\| (\S+(?: \(\S+\))?) +\| +(\d+) \+ +(\d+) \| +(\S+) / (\S+) \| +(\d+) \|$`)

// checkTable checks that the table command's output has a row for each of
// want with a positive rate, the ratios given where both systems ran, and
// a goal line for each of issue #32's goals.
func checkTable(t *testing.T, out string, want ...string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	for _, r := range tableRow.FindAllStringSubmatch(out, -1) {
		rows[r[1]] = r
	}
	if len(rows) != len(want) {
		t.Fatalf("want %d table rows (%q), got %d:\n%s", len(want), want, len(rows), out)
	}
	for _, name := range want {
		r, ok := rows[name]
		if !ok {
			t.Fatalf("no row for %s:\n%s", name, out)
		}
		if rate, _ := strconv.Atoi(r[2]); rate <= 0 {
			t.Errorf("%s: %d jobs/s", name, rate)
		}
		if st, err := strconv.ParseFloat(r[7], 64); err != nil || st <= 0 {
			t.Errorf("%s: %s statements per 1,000 jobs", name, r[7])
		}
		if conns, _ := strconv.Atoi(r[9]); conns < 1 {
			t.Errorf("%s: peak %d connections", name, conns)
		}
	}
	if r, ok := rows["limit exactly-once"]; ok && !strings.HasPrefix(r[4], "1.00× (1.00–1.00)") {
		t.Errorf("the exactly-once limit's ratio to itself is %s", r[4])
	}
	if r, ok := rows["crdbwork bench mode"]; ok && !strings.HasPrefix(r[3], "1.00× (1.00–1.00)") {
		t.Errorf("crdbwork bench mode's ratio to itself is %s", r[3])
	}
	if n := len(regexp.MustCompile(`(?m)^goal: .*: (\d+\.\d+× \(rounds \S+\): (pass|FAIL)|not measured \(run both\))$`).FindAllString(out, -1)); n != len(tableGoals) {
		t.Errorf("want %d goal lines, got %d:\n%s", len(tableGoals), n, out)
	}
	return rows
}

// TestTableWithoutNode runs the table with the Go systems only (no Node.js
// needed): both crdbwork shapes, River and the two limits, two rounds, each
// run checked in the database by its system; the goals that need both
// crdbwork and the exactly-once limit get a verdict, the peers' goals say
// they were not measured.
func TestTableWithoutNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"table", "--items", "2000", "--rounds", "2", "--river-workers", "64", "--systems", "crdbwork,crdbwork-user,river,limit-eo,limit-alo", "--json"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	checkTable(t, out.String(), "crdbwork bench mode", "crdbwork user shape", "River plain", "limit exactly-once", "limit at-least-once")
	if n := strings.Count(out.String(), "\nround "); n != 10 {
		t.Errorf("want 10 runs (5 systems × 2 rounds), got %d:\n%s", n, out.String())
	}
	for _, want := range []string{"goal: crdbwork bench mode ≥ 0.3× the exactly-once limit: ", "goal: crdbwork bench mode ≥ 1.5× graphile-worker batched: not measured"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// --json: the same table and the two goals both of whose systems ran.
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep tableReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("last line is not the JSON report: %v\n%s", err, out.String())
	}
	if len(rep.Systems) != 5 || len(rep.Goals) != 2 || len(rep.Loads) != 2 {
		t.Errorf("JSON report: %d systems, %d goals, %d rounds' loads; want 5, 2, 2: %s", len(rep.Systems), len(rep.Goals), len(rep.Loads), lines[len(lines)-1])
	}
	for _, r := range rep.Systems {
		if r.JobsPerSecond <= 0 || r.XBench == nil || r.XLimit == nil || r.TripsPer1k == nil || r.StatementsPer1k == nil {
			t.Errorf("JSON report: %+v", r)
		}
	}
	for _, g := range rep.Goals {
		if g.Ratio == nil || g.Pass != (g.Ratio.Median >= g.Min) {
			t.Errorf("JSON report: goal %+v", g)
		}
	}
	// The order rotates: round 2 starts with the second system.
	if first := regexp.MustCompile(`(?m)^round 2  (\S+ \S+ \S+)`).FindStringSubmatch(out.String()); first == nil || first[1] != "crdbwork user shape" {
		t.Errorf("round 2 does not start with the user shape (%q):\n%s", first, out.String())
	}
}
