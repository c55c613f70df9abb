package main

import (
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

// TestRunMeasureOrder: --measure-order counts every claimed item's PEI. One
// worker with one handler claims one item at a time from all its parts,
// the strict order: the median PEI is 0 (only claims made while the
// rebalancer was still acquiring the parts may stray). Two workers with the
// urgent lane report the urgent items apart, and the lane's threshold.
func TestRunMeasureOrder(t *testing.T) {
	url := testdb.NewURL(t)
	r := demo(t, 2*time.Minute, nil, "run", "--database-url", url, "--items", "300", "--workers", "1", "--parts", "4",
		"--concurrency", "1", "--measure-order", "--json")
	s := checkSummary(t, r, 300)
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

	url = testdb.NewURL(t)
	r = demo(t, 2*time.Minute, nil, "run", "--database-url", url, "--items", "1000", "--workers", "2", "--parts", "8",
		"--concurrency", "4", "--measure-order", "--urgent-priority", "99", "--json")
	s = checkSummary(t, r, 1000)
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
