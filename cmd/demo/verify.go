package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// verdict is the exactly-once check of the demo's results against what was
// enqueued.
type verdict struct {
	Enqueued   int64 `json:"enqueued"`
	Acked      int64 `json:"acked"`      // distinct items with a result
	Duplicates int64 `json:"duplicates"` // items with more than one result
	Lost       int64 `json:"lost"`       // no result, not pending, not dead
	Pending    int64 `json:"pending"`    // no result, still in the items table
	Dead       int64 `json:"dead"`       // no result, in the dead-items table
	// Claimed counts the pending items claimed by a session now; of them,
	// PastLease those whose lease has run out (a reaper releases them).
	Claimed   int64 `json:"claimed"`
	PastLease int64 `json:"claimed_past_lease"`
	// OldestClaimSeconds is the age of the oldest claim (0: none), so that
	// an item stuck in a claim shows.
	OldestClaimSeconds float64 `json:"oldest_claim_age_seconds"`
}

// ok reports exactly-once: nothing lost, nothing acknowledged twice.
func (v verdict) ok() bool { return v.Lost == 0 && v.Duplicates == 0 }

// check compares demo_results with demo_enqueued, for one run or (with
// runID nil) for every run.
func check(ctx context.Context, db crsql.DB, runID *uuid.UUID) (verdict, error) {
	q := fmt.Sprintf(`SELECT
    count(*),
    count(*) FILTER (WHERE r.n >= 1),
    count(*) FILTER (WHERE r.n > 1),
    count(*) FILTER (WHERE r.n IS NULL AND i.id IS NULL AND d.id IS NULL),
    count(*) FILTER (WHERE r.n IS NULL AND i.id IS NOT NULL),
    count(*) FILTER (WHERE r.n IS NULL AND i.id IS NULL AND d.id IS NOT NULL),
    count(*) FILTER (WHERE i.claim IS NOT NULL),
    count(*) FILTER (WHERE i.claim IS NOT NULL AND i.lease_until < now()),
    COALESCE(EXTRACT(EPOCH FROM now() - min(i.claimed_at) FILTER (WHERE i.claim IS NOT NULL)), 0)::FLOAT8
FROM demo_enqueued AS e
LEFT JOIN (SELECT item_id, count(*) AS n FROM demo_results GROUP BY item_id) AS r ON r.item_id = e.item_id
LEFT JOIN %s AS i ON i.id = e.item_id
LEFT JOIN %s AS d ON d.id = e.item_id
WHERE $1::UUID IS NULL OR e.run_id = $1::UUID`, tables.Table("items"), tables.Table("dead_items"))
	var v verdict
	err := db.QueryRow(ctx, q, runID).Scan(&v.Enqueued, &v.Acked, &v.Duplicates, &v.Lost, &v.Pending, &v.Dead,
		&v.Claimed, &v.PastLease, &v.OldestClaimSeconds)
	if err != nil {
		return v, fmt.Errorf("verifying the results: %w", crsql.Classify(err))
	}
	return v, nil
}

type verifyConfig struct {
	common
	runID string
}

func cmdVerify(ctx context.Context, name string, args []string, out *console) error {
	var c verifyConfig
	f := newFlagSet(name, `Checks exactly-once: every item recorded in demo_enqueued (by "demo run" or
"demo enqueue") must have exactly one row in demo_results, unless it is still
pending in the items table or was moved to the dead-items table.

Prints enqueued, acked (items with a result), duplicates (items with more than
one result), lost (no result, not pending, not dead), pending and dead, and of
the pending items those claimed by a session now (claimed), those claimed past
their lease, and the age of the oldest claim: an item stuck in a claim shows
there. Exits 1 if any item is lost or duplicated; pending items are not lost.`)
	c.register(f, urlRequired)
	f.stringVar(&c.runID, "run-id", "", "UUID", "check only the items of this run (default: all runs)", func(s string) error {
		if s == "" {
			return nil
		}
		_, err := uuid.Parse(s)
		if err != nil {
			return fmt.Errorf("not a UUID")
		}
		return nil
	})
	if err := f.parse(args, out.stdout); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := connect(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireSchema(ctx, pool); err != nil {
		return err
	}
	if err := requireDemoTables(ctx, pool); err != nil {
		return err
	}
	var runID *uuid.UUID
	if c.runID != "" {
		id := uuid.MustParse(c.runID)
		runID = &id
	}
	v, err := check(ctx, pool, runID)
	if err != nil {
		return failf(1, "%v", err)
	}
	if c.json {
		type result struct {
			verdict
			OK bool `json:"ok"`
		}
		if err := printJSON(out, result{v, v.ok()}); err != nil {
			return err
		}
	} else {
		var b strings.Builder
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "enqueued\t%d\n", v.Enqueued)
		fmt.Fprintf(tw, "acked\t%d\n", v.Acked)
		fmt.Fprintf(tw, "duplicates\t%d\n", v.Duplicates)
		fmt.Fprintf(tw, "lost\t%d\n", v.Lost)
		fmt.Fprintf(tw, "pending\t%d\n", v.Pending)
		fmt.Fprintf(tw, "dead\t%d\n", v.Dead)
		fmt.Fprintf(tw, "claimed\t%d (%d past their lease; oldest claim %s old)\n", v.Claimed, v.PastLease, round(v.oldestClaim()))
		tw.Flush()
		b.WriteString(verdictLine(v) + "\n")
		out.printf("%s", b.String())
	}
	if !v.ok() {
		return exitCode(1)
	}
	return nil
}

// oldestClaim is OldestClaimSeconds as a duration.
func (v verdict) oldestClaim() time.Duration {
	return time.Duration(v.OldestClaimSeconds * float64(time.Second))
}

// verdictLine sums up a verdict in words.
func verdictLine(v verdict) string {
	if !v.ok() {
		return fmt.Sprintf("FAIL: %d items lost, %d items acknowledged more than once", v.Lost, v.Duplicates)
	}
	s := "OK: no item lost, none acknowledged twice"
	if v.Pending > 0 {
		s += fmt.Sprintf(" (%d still pending, %d of them claimed, the oldest claim %s old)", v.Pending, v.Claimed, round(v.oldestClaim()))
	}
	return s
}

// printJSON prints v as one line of JSON on stdout.
func printJSON(out *console, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return failf(1, "encoding JSON: %v", err)
	}
	out.writeStdout(append(b, '\n'))
	return nil
}

// round shortens a duration for people.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}
