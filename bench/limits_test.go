package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestLimitsMeasuresEveryCell runs a tiny limits experiment: a row per
// cell (1, 2, 4 workers and churn, with and without parts), each within
// its bounds (the run fails otherwise), then the hand-over variant.
func TestLimitsMeasuresEveryCell(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, c := range []struct {
		args []string
		rows int
	}{
		{[]string{"limits", "--items", "60", "--rate-items", "30", "--json"}, 8},
		{[]string{"limits", "--handover", "--handover-items", "12", "--handover-time", "500ms", "--json"}, 2},
	} {
		var out strings.Builder
		if err := run(ctx, c.args, &out); err != nil {
			t.Fatalf("%q: %v\n%s", c.args, err, out.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var rep limitsReport
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
			t.Fatalf("%q: %v\n%s", c.args, err, out.String())
		}
		if len(rep.Rows) != c.rows {
			t.Fatalf("%q: %d rows, want %d: %+v", c.args, len(rep.Rows), c.rows, rep)
		}
		for _, r := range rep.Rows {
			if r.Most < 1 || r.Mean <= 0 || (!rep.Handover && r.Achieved <= 0) {
				t.Errorf("%q: row %+v", c.args, r)
			}
		}
	}
	for _, args := range [][]string{{"limits", "--limit", "0"}, {"limits", "--item-time", "0s"}, {"limits", "extra"}} {
		if err := run(context.Background(), args, &strings.Builder{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
