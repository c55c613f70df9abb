package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/bench/internal/order"
	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The order experiment (go -C bench run . order): how relaxed the claim
// order is. For each claimed item it counts, right after its claim, the
// claimable items before it in the queue's strict order (priority, turn,
// id): its popped element index (PEI), 0 for the strict order's own pick
// (bench/internal/order). It was `demo run --measure-order`.

// orderResult is the order experiment's JSON line: the run, and the PEI
// figures over every claimed item (PEI*) and over the urgent ones
// (PEIUrgent*, with --urgent-priority).
type orderResult struct {
	expOutcome
	Priorities      int     `json:"priorities"`
	PEICount        int     `json:"pei_count"`
	PEIMedian       int64   `json:"pei_median"`
	PEIMean         float64 `json:"pei_mean"`
	PEIP90          int64   `json:"pei_p90"`
	PEIP99          int64   `json:"pei_p99"`
	PEIMax          int64   `json:"pei_max"`
	PEIErrors       int     `json:"pei_errors"` // claims whose count failed (their items have no PEI)
	UrgentPriority  *int    `json:"urgent_priority,omitempty"`
	PEIUrgentCount  *int    `json:"pei_urgent_count,omitempty"`
	PEIUrgentMedian *int64  `json:"pei_urgent_median,omitempty"`
	PEIUrgentP99    *int64  `json:"pei_urgent_p99,omitempty"`
}

// orderCmd runs the order experiment.
func orderCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("order", out)
	var c expConfig
	c.register(fs, 10_000)
	priorities := fs.Int("priorities", 1000, "give items uniformly random priorities in [0, N) (1: all 0)")
	urgent := fs.Int("urgent-priority", -1, "turn the urgent lane on: items with priority <= N are claimed by any worker with a free handler (negative: off)")
	anyPart := fs.Bool("any-part", false, "the workers claim in any part (no part ownership) instead of their own parts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("order: unexpected argument %q", fs.Arg(0))
	}
	if err := c.validate(); err != nil {
		return err
	}
	if *priorities < 1 || *priorities > 1<<30 {
		return fmt.Errorf("--priorities %d: must be between 1 and %d", *priorities, 1<<30)
	}
	c.anyPart = *anyPart
	if *urgent >= 0 {
		c.urgentLane, c.urgentPriority = true, *urgent
	}
	var meter *order.Meter
	o, err := runExperiment(ctx, &c, expHooks{
		enqueue: func(ctx context.Context, _ *pgxpool.Pool, q *claim.Queue) (int, error) {
			items := make([]claim.NewItem, c.items)
			for i := range items {
				items[i] = claim.NewItem{Payload: []byte(strconv.Itoa(i)), Key: fmt.Sprintf("key-%d", i%1000)}
				if *priorities > 1 {
					items[i].Priority = rand.IntN(*priorities)
				}
			}
			return len(items), enqueueChunks(ctx, q, items)
		},
		meter: func(ctx context.Context, url string) (func(), error) {
			// Its own connections: counting must not take the workers'.
			mpool, err := openPool(ctx, url, min(c.workers, 8), "bench-order")
			if err != nil {
				return nil, err
			}
			if meter, err = order.NewMeter(mpool, crsql.Tables{}, expQueue); err != nil {
				mpool.Close()
				return nil, err
			}
			c.onClaim = func(ctx context.Context, items []claim.Item) {
				// A failed count (a stopping worker) leaves its items
				// out of the figures; PEIErrors says how many.
				_, _ = meter.Observe(ctx, items)
			}
			return mpool.Close, nil
		},
	}, out)
	if err != nil {
		return err
	}
	a := meter.Summary()
	r := orderResult{expOutcome: o, Priorities: *priorities, PEICount: a.Count, PEIMedian: a.Median, PEIMean: a.Mean,
		PEIP90: a.P90, PEIP99: a.P99, PEIMax: a.Max, PEIErrors: meter.Errors()}
	if c.urgentLane {
		u := meter.SummaryWhere(func(p int) bool { return p <= c.urgentPriority })
		r.UrgentPriority, r.PEIUrgentCount, r.PEIUrgentMedian, r.PEIUrgentP99 = &c.urgentPriority, &u.Count, &u.Median, &u.P99
	}
	if c.json {
		return printJSON(out, r)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	printOutcome(tw, o)
	fmt.Fprintf(tw, "  order (PEI)\tmedian %d, mean %.1f, p90 %d, p99 %d, max %d over %d claimed items (priorities 0..%d)\n",
		r.PEIMedian, r.PEIMean, r.PEIP90, r.PEIP99, r.PEIMax, r.PEICount, r.Priorities-1)
	if r.UrgentPriority != nil {
		fmt.Fprintf(tw, "  urgent (PEI)\tmedian %d, p99 %d over %d urgent items (priority <= %d)\n", *r.PEIUrgentMedian, *r.PEIUrgentP99, *r.PEIUrgentCount, *r.UrgentPriority)
	}
	if r.PEIErrors > 0 {
		fmt.Fprintf(tw, "  order errors\t%d claims not counted\n", r.PEIErrors)
	}
	tw.Flush()
	_, err = io.WriteString(out, b.String())
	return err
}
