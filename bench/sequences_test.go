package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSequencesMeasuresBothQueues runs a tiny sequences experiment: every
// round drains the plain queue and the sequenced one (each run fails
// unless every item was acked once and, sequenced, each key's items in
// enqueue order), and the summary has both rates and their ratio.
func TestSequencesMeasuresBothQueues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"sequences", "--items", "300", "--keys", "7", "--rounds", "2", "--concurrency", "8", "--parts", "2", "--json"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var sum seqSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(sum.Runs) != 4 || sum.PlainJobsS <= 0 || sum.SeqJobsS <= 0 || sum.Ratio <= 0 || sum.Keys != 7 {
		t.Fatalf("summary %+v", sum)
	}
	seq := 0
	for _, r := range sum.Runs {
		if r.Sequenced {
			seq++
		}
	}
	if seq != 2 {
		t.Fatalf("%d sequenced runs of 4, want 2", seq)
	}
	for _, args := range [][]string{{"sequences", "--keys", "0"}, {"sequences", "extra"}, {"sequences", "--handler", "-1s"}} {
		if err := run(context.Background(), args, &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestSequencesInALivedDatabase runs a tiny sequences experiment in a
// database that has lived (--lived): the runs drain new queues whose items
// are in no statistics, every item acked once and in order, and each run
// reports its longest stretch without an ack.
func TestSequencesInALivedDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"sequences", "--lived", "--items", "300", "--keys", "7", "--rounds", "1", "--concurrency", "8", "--json"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var sum seqSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !sum.Lived || len(sum.Runs) != 2 || sum.SeqJobsS <= 0 {
		t.Fatalf("summary %+v", sum)
	}
	for _, r := range sum.Runs {
		if r.MaxGap <= 0 {
			t.Errorf("run %+v: no longest stretch without an ack", r)
		}
	}
}
