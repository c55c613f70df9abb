package main

import (
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

// A fair queue serves small tenants ahead of the big tenants' backlogs, and
// serves the backlogged tenants evenly; a plain one does neither. The
// assertions count claims (how many items were claimed before a small
// tenant's), not seconds, so they do not depend on the machine's speed.
func TestRunTenantsFairness(t *testing.T) {
	runs := map[bool]map[string]any{}
	for _, fair := range []bool{true, false} {
		url := testdb.NewURL(t)
		r := demo(t, 3*time.Minute, nil, "run", "--database-url", url, "--tenants", "50", "--items", "3000",
			"--workers", "2", "--concurrency", "8", "--trickle-rate", "100", "--json", map[bool]string{true: "--fair", false: "--fair=false"}[fair])
		if r.code != 0 {
			t.Fatalf("fair=%v: exit status %d\nstdout:\n%s\nstderr:\n%s", fair, r.code, r.stdout, r.stderr)
		}
		s := lastJSON(t, r)
		enq := num(t, s, "enqueued")
		if enq < 3000 || num(t, s, "acked") != enq || num(t, s, "lost") != 0 || num(t, s, "duplicates") != 0 {
			t.Fatalf("fair=%v: not every item acked exactly once: %v", fair, s)
		}
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
	// With parts, service is even within each session's parts, and across
	// the two sessions only as even as their backlogs (see the README).
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

func TestTenantFlagsBadInput(t *testing.T) {
	url := testdb.NewURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--database-url", url, "--fair"}, "--fair needs --tenants"},
		{[]string{"run", "--database-url", url, "--trickle-rate", "5"}, "--trickle-rate needs --tenants"},
		{[]string{"run", "--database-url", url, "--tenants", "100", "--items", "50"}, "--items 50 is fewer than --tenants 100"},
		{[]string{"run", "--database-url", url, "--tenants", "10", "--kill-every", "1s"}, "--kill-every"},
		{[]string{"run", "--database-url", url, "--any-part", "--kill-every", "1s"}, "--kill-every"},
		{[]string{"run", "--database-url", url, "--tenants", "10", "--measure-order"}, "--measure-order"},
		{[]string{"fair", "--database-url", url, "maybe"}, `unexpected argument "maybe"`},
	} {
		r := demo(t, time.Minute, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("demo %s: exit status %d, stderr %q; want 2 and %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
	}
}

// demo fair shows and changes the queue's setting, keeping the others.
func TestFairCommand(t *testing.T) {
	url := testdb.NewURL(t)
	if r := demo(t, time.Minute, nil, "migrate", "--database-url", url); r.code != 0 {
		t.Fatalf("migrate: %d\n%s", r.code, r.stderr)
	}
	state := func(args ...string) map[string]any {
		t.Helper()
		r := demo(t, time.Minute, nil, append([]string{"fair", "--database-url", url, "--queue", "q1", "--json"}, args...)...)
		if r.code != 0 {
			t.Fatalf("demo fair %v: exit status %d\n%s", args, r.code, r.stderr)
		}
		return lastJSON(t, r)
	}
	if s := state(); s["fair"] != false {
		t.Fatalf("a new queue: %v, want not fair", s)
	}
	if s := state("on"); s["fair"] != true || s["was_fair"] != false {
		t.Fatalf("fair on: %v", s)
	}
	if s := state(); s["fair"] != true {
		t.Fatalf("after on: %v", s)
	}
	// The other queue is untouched; the queue got the default parts.
	r := demo(t, time.Minute, nil, "fair", "--database-url", url, "--queue", "q2")
	if r.code != 0 || !strings.Contains(r.stdout, "plain") {
		t.Fatalf("queue q2: %d %q", r.code, r.stdout)
	}
	r = demo(t, time.Minute, nil, "parts", "--database-url", url, "--queue", "q1", "--json")
	if r.code != 0 || num(t, lastJSON(t, r), "parts") != defaultParts {
		t.Fatalf("parts of q1 after fair on: %d %s", r.code, r.stdout)
	}
	if s := state("off"); s["fair"] != false || s["was_fair"] != true {
		t.Fatalf("fair off: %v", s)
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
