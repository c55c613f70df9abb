package main

import (
	"math"
	"testing"
	"time"
)

// TestThroughput checks the watch's rate over sessions that come and go:
// a killed session keeps the acks it reported, a new one counts from zero,
// and samples older than the window drop out.
func TestThroughput(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	st := func(acked map[string]int64) []sessionStatus {
		var s []sessionStatus
		for id, n := range acked {
			s = append(s, sessionStatus{ID: id, Acked: n})
		}
		return s
	}
	var tp throughput
	if r := tp.add(t0, st(map[string]int64{"a": 100, "b": 50})); r != -1 {
		t.Fatalf("first sample: rate %v, want -1 (unknown)", r)
	}
	// 2 s later: a did 200 more; b was killed after 40 more (its last
	// report); c started and did 60.
	tp.add(t0.Add(time.Second), st(map[string]int64{"a": 200, "b": 90}))
	r := tp.add(t0.Add(2*time.Second), st(map[string]int64{"a": 300, "c": 60}))
	if want := (200.0 + 40 + 60) / 2; math.Abs(r-want) > 1e-9 {
		t.Errorf("rate %v, want %v", r, want)
	}
	// Much later, only the last window counts: a did 100 in 10 s.
	tp.add(t0.Add(20*time.Second), st(map[string]int64{"a": 1000, "c": 60}))
	r = tp.add(t0.Add(30*time.Second), st(map[string]int64{"a": 1100, "c": 60}))
	if want := 10.0; math.Abs(r-want) > 1e-9 {
		t.Errorf("rate over the last window %v, want %v", r, want)
	}
	if d := tp.describe(r); d == "" {
		t.Error("no description of a known rate")
	}
}

func TestRanges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{3}, "3"},
		{[]int{0, 1, 2, 3, 8}, "0-3,8"},
		{[]int{9, 1, 0, 5, 6, 12}, "0-1,5-6,9,12"},
	} {
		if got := ranges(c.in); got != c.want {
			t.Errorf("ranges(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	t.Parallel()
	names := []string{"demo", "emails", "reports", "q"}
	for in, want := range map[string]string{"deom": "demo", "emials": "emails", "report": "reports", "email": "emails",
		"zzzzzz": "", "x": "", "q": "q", "qq": ""} {
		if got := suggest(in, names); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
