package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"
)

// runJSON runs a bench command with --json and decodes its line.
func runJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, append(args, "--json"), &out); err != nil {
		t.Fatalf("bench %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String())), &m); err != nil {
		t.Fatalf("bench %s: not one JSON line: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return m
}

// num returns a JSON number field.
func num(t *testing.T, m map[string]any, key string) float64 {
	t.Helper()
	v, ok := m[key].(float64)
	if !ok {
		t.Fatalf("no number %q in %v", key, m)
	}
	return v
}

// exactlyOnce checks the run's own figures: every item acked once.
func exactlyOnce(t *testing.T, m map[string]any, items float64) {
	t.Helper()
	if enq := num(t, m, "enqueued"); enq < items || num(t, m, "acked") != enq || num(t, m, "lost") != 0 || num(t, m, "duplicates") != 0 {
		t.Fatalf("not every item acked exactly once: %v", m)
	}
}

// A fair queue serves small tenants ahead of the big tenants' backlogs, and
// serves the backlogged tenants evenly; a plain one does neither. The
// assertions count claims (how many items were claimed before a small
// tenant's), not seconds, so they do not depend on the machine's speed.
func TestFairnessExperiment(t *testing.T) {
	runs := map[bool]map[string]any{}
	for _, fair := range []bool{true, false} {
		s := runJSON(t, "fairness", "--tenants", "50", "--items", "3000", "--workers", "2", "--concurrency", "8",
			"--trickle-rate", "100", map[bool]string{true: "--fair", false: "--fair=false"}[fair])
		exactlyOnce(t, s, 3000)
		enq := num(t, s, "enqueued")
		if got := num(t, s, "trickle_items"); enq != 3000+got {
			t.Errorf("fair=%v: enqueued %v, want the 3000 up-front items and the %v trickle items", fair, enq, got)
		}
		if num(t, s, "observed_claims") != enq {
			t.Errorf("fair=%v: the workers noted %v claims of %v items", fair, s["observed_claims"], enq)
		}
		if s["fair"] != fair || num(t, s, "tenants") != 50 || num(t, s, "tenant_fairness_windows") < 1 {
			t.Errorf("fair=%v: summary %v", fair, s)
		}
		num(t, s, "small_tenant_p99_wait_seconds")
		num(t, s, "small_tenant_median_wait_seconds")
		t.Logf("fair=%v: Jain %.3f, small p99 %v claims (%.3fs), trickle median %v claims, %v trickle items", fair,
			s["tenant_fairness"], s["small_tenant_p99_wait_claims"], s["small_tenant_p99_wait_seconds"], s["trickle_median_wait_claims"], s["trickle_items"])
		runs[fair] = s
	}
	on, off := runs[true], runs[false]
	// With parts, service is even across the sessions too (spread by turn
	// and paced); the bound is loose for a load this small.
	if j := num(t, on, "tenant_fairness"); j < 0.6 {
		t.Errorf("fair queue: Jain's index %.3f, want at least 0.6", j)
	}
	if jOn, jOff := num(t, on, "tenant_fairness"), num(t, off, "tenant_fairness"); jOn < jOff+0.3 {
		t.Errorf("Jain's index %.3f fair, %.3f plain: want the fair one higher by 0.3 at least", jOn, jOff)
	}
	if a, b := num(t, on, "small_tenant_p99_wait_claims"), num(t, off, "small_tenant_p99_wait_claims"); a >= b {
		t.Errorf("small tenants' p99 wait: %v claims fair, %v plain; want fewer when fair", a, b)
	}
	if a, b := num(t, on, "small_tenant_median_wait_claims"), num(t, off, "small_tenant_median_wait_claims"); a >= b {
		t.Errorf("small tenants' median wait: %v claims fair, %v plain; want fewer when fair", a, b)
	}
}

// With --settle the drain starts once the workers own the parts evenly:
// the summary says so, and every item is still acked exactly once.
func TestFairnessExperimentSettles(t *testing.T) {
	s := runJSON(t, "fairness", "--tenants", "20", "--items", "600", "--workers", "3", "--parts", "8",
		"--concurrency", "8", "--trickle-rate", "0", "--settle")
	exactlyOnce(t, s, 600)
	if s["settled"] != true {
		t.Errorf("--settle: summary %v, want settled true", s)
	}
}

// TestOrderExperiment: the order experiment counts every claimed item's
// PEI. One worker with one handler claims one item at a time from all its
// parts, the strict order: the median PEI is 0. Two workers with the urgent
// lane report the urgent items apart, and the lane's threshold.
func TestOrderExperiment(t *testing.T) {
	s := runJSON(t, "order", "--items", "300", "--workers", "1", "--parts", "4", "--concurrency", "1")
	exactlyOnce(t, s, 300)
	if n := num(t, s, "pei_count"); n != 300 {
		t.Errorf("pei_count = %v; want every item (300)", n)
	}
	if e := num(t, s, "pei_errors"); e != 0 {
		t.Errorf("pei_errors = %v; want 0", e)
	}
	if m := num(t, s, "pei_median"); m != 0 {
		t.Errorf("pei_median = %v for a lone worker claiming one item at a time; want 0\nsummary: %v", m, s)
	}
	med, p90, p99, mx := num(t, s, "pei_median"), num(t, s, "pei_p90"), num(t, s, "pei_p99"), num(t, s, "pei_max")
	if med > p90 || p90 > p99 || p99 > mx || num(t, s, "pei_mean") > mx {
		t.Errorf("PEI figures out of order: %v", s)
	}

	s = runJSON(t, "order", "--items", "1000", "--workers", "2", "--parts", "8", "--concurrency", "4", "--urgent-priority", "99")
	exactlyOnce(t, s, 1000)
	if u := num(t, s, "urgent_priority"); u != 99 {
		t.Errorf("urgent_priority = %v; want 99", u)
	}
	if n := num(t, s, "pei_urgent_count"); n < 50 || n > 200 {
		t.Errorf("pei_urgent_count = %v; want about a tenth of 1000 items (priorities 0..999, urgent <= 99)", n)
	}
	if u, all := num(t, s, "pei_urgent_p99"), num(t, s, "pei_p99"); u > all {
		t.Errorf("urgent items' p99 PEI %v above all items' %v", u, all)
	}
}

func TestExperimentBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fairness", "--tenants", "100", "--items", "50"}, "--items 50 is fewer than --tenants 100"},
		{[]string{"fairness", "--trickle-rate", "-1"}, "--trickle-rate"},
		{[]string{"fairness", "--workers", "0"}, "--workers"},
		{[]string{"order", "--priorities", "0"}, "--priorities"},
		{[]string{"order", "extra"}, `unexpected argument "extra"`},
	} {
		err := run(context.Background(), c.args, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one with %q", c.args, err, c.want)
		}
	}
}

// Jain's index is 1 for round robin over the backlogged tenants and falls
// toward 1/m when one tenant takes the claims.
func TestJain(t *testing.T) {
	var rr []int
	for range 40 {
		for tn := range 10 {
			rr = append(rr, tn)
		}
	}
	if j, w := jain(rr, 10); j < 0.999 || w < 1 {
		t.Errorf("round robin: J = %.3f over %d windows, want 1", j, w)
	}
	// Tenant 0 holds 3600 items served first, then 9 tenants 40 items
	// each in turn: the first 90 windows serve only tenant 0 (J = 0.1 each),
	// the last 10 serve the 9 in turn (J = 1).
	var hog []int
	for range 3600 {
		hog = append(hog, 0)
	}
	for range 40 {
		for tn := 1; tn < 10; tn++ {
			hog = append(hog, tn)
		}
	}
	if j, _ := jain(hog, 10); j < 0.15 || j > 0.25 {
		t.Errorf("one tenant first: J = %.3f, want about 0.18", j)
	}
	if j, w := jain([]int{0, 0, 0}, 1); j != 0 || w != 0 {
		t.Errorf("one tenant: J = %v over %d windows, want no window", j, w)
	}
}

// The backlogs add up, each tenant has one, and they are skewed: the
// largest fifth of the tenants holds most items.
func TestParetoBacklogs(t *testing.T) {
	b := paretoBacklogs(rand.New(rand.NewPCG(1, 2)), 1000, 100_000)
	sum := 0
	for _, n := range b {
		if n < 1 {
			t.Fatalf("a tenant with %d items", n)
		}
		sum += n
	}
	if sum != 100_000 {
		t.Fatalf("backlogs add up to %d, want 100000", sum)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(b)))
	top := 0
	for _, n := range b[:200] {
		top += n
	}
	if top < 60_000 {
		t.Errorf("the largest 200 tenants hold %d of 100000 items, want most", top)
	}
	if q, p := quantile([]float64{5, 1, 4, 2, 3}, 0.5), quantile([]float64{5, 1, 4, 2, 3}, 0.99); q != 3 || p != 5 {
		t.Errorf("quantiles %v %v, want 3 5", q, p)
	}
}
