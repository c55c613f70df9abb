package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestLivedDrainsEveryFeature runs a tiny lived experiment: every feature
// drains on a fresh database and on a lived one (each drain fails unless
// every item ended exactly once), and the report has a ratio per feature.
func TestLivedDrainsEveryFeature(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"lived", "--items", "200", "--rows", "4000", "--concurrency", "16", "--json"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep livedReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rep.Runs) != 2*len(livedFeatures) || len(rep.Features) != len(livedFeatures) {
		t.Fatalf("%d runs and %d features, want %d and %d: %+v", len(rep.Runs), len(rep.Features), 2*len(livedFeatures), len(livedFeatures), rep)
	}
	for _, f := range rep.Features {
		if !f.ExactlyOnce || f.Ratio <= 0 || f.FreshSeconds <= 0 || f.LivedSeconds <= 0 {
			t.Errorf("feature %+v", f)
		}
	}
	for _, args := range [][]string{{"lived", "--items", "10"}, {"lived", "--features", "plain,nope"}, {"lived", "extra"}} {
		if err := run(context.Background(), args, &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
