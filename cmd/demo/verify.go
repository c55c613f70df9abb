package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// verdict is the exactly-once check of the demo's results against what was
// enqueued.
type verdict struct {
	Enqueued   int64 `json:"enqueued"`
	Acked      int64 `json:"acked"`      // distinct items with a result
	Duplicates int64 `json:"duplicates"` // items with more than one result
	Lost       int64 `json:"lost"`       // no result, not pending, not dead, not cancelled
	Pending    int64 `json:"pending"`    // no result, still in the items table
	Dead       int64 `json:"dead"`       // no result, in the dead-items table
	// Cancelled counts the items without a result that an operator
	// cancelled (claim.Queue.CancelItem; known while the queue's dedup window
	// remembers them): ended on purpose, not lost.
	Cancelled int64 `json:"cancelled"`
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

// checkFilter selects the recorded items check looks at: one run's (runID
// not nil), one queue's (queue not empty), or all.
type checkFilter struct {
	runID *uuid.UUID
	queue string
}

// checkCounts counts the recorded items, those with a result and those
// with more than one, from the demo's own tables.
const checkCounts = `SELECT count(*), count(*) FILTER (WHERE r.n >= 1), count(*) FILTER (WHERE r.n > 1)
FROM demo_enqueued AS e
LEFT JOIN (SELECT item_id, count(*) AS n FROM demo_results GROUP BY item_id) AS r ON r.item_id = e.item_id
WHERE ($1::UUID IS NULL OR e.run_id = $1::UUID) AND ($2::TEXT = '' OR e.queue = $2::TEXT)`

// checkMissing pages through the recorded items without a result, by id.
const checkMissing = `SELECT e.queue, e.item_id FROM demo_enqueued AS e
WHERE ($1::UUID IS NULL OR e.run_id = $1::UUID) AND ($2::TEXT = '' OR e.queue = $2::TEXT) AND e.item_id > $3::UUID
    AND NOT EXISTS (SELECT 1 FROM demo_results AS r WHERE r.item_id = e.item_id)
ORDER BY e.item_id LIMIT $4`

// checkPage is the number of items without a result check classifies per
// read of crdbwork's tables.
const checkPage = 5000

// check compares demo_results with demo_enqueued for the items filter
// selects. The items without a result are classified by the library's read
// of where they are (pending, dead or cancelled: store.Store.VerifyItemFates); the
// others are lost. Everything is read in one read-only transaction, one
// snapshot of both the demo's tables and crdbwork's, so that an item acked
// between two reads is not taken for lost. CockroachDB accepts ISOLATION
// LEVEL REPEATABLE READ and READ ONLY (docs: "SET TRANSACTION"; a cluster
// without repeatable read runs it as SERIALIZABLE, a snapshot too).
func check(ctx context.Context, pool *pgxpool.Pool, filter checkFilter) (verdict, error) {
	var v verdict
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		v = verdict{}
		if err := tx.QueryRow(ctx, checkCounts, filter.runID, filter.queue).Scan(&v.Enqueued, &v.Acked, &v.Duplicates); err != nil {
			return err
		}
		var missing int64
		var oldest time.Duration
		after := uuid.Nil
		for {
			rows, err := tx.Query(ctx, checkMissing, filter.runID, filter.queue, after, checkPage)
			if err != nil {
				return err
			}
			var page []store.ItemRef
			var ref store.ItemRef
			if _, err := pgx.ForEachRow(rows, []any{&ref.Queue, &ref.ID}, func() error {
				page = append(page, ref)
				return nil
			}); err != nil {
				return err
			}
			if len(page) == 0 {
				break
			}
			f, err := stmts.VerifyItemFates(ctx, tx, page)
			if err != nil {
				return err
			}
			missing += int64(len(page))
			v.Pending += f.Pending
			v.Claimed += f.Claimed
			v.PastLease += f.PastLease
			v.Dead += f.Dead
			v.Cancelled += f.Cancelled
			oldest = max(oldest, f.OldestClaim)
			if len(page) < checkPage {
				break
			}
			after = page[len(page)-1].ID
		}
		v.Lost = missing - v.Pending - v.Dead - v.Cancelled
		v.OldestClaimSeconds = oldest.Seconds()
		return nil
	})
	if err != nil {
		return v, fmt.Errorf("verifying the results: %w", store.Classify(err))
	}
	return v, nil
}

type verifyConfig struct {
	common
	runID string
}

func cmdVerify(ctx context.Context, name string, args []string, out *cli.Console) error {
	var c verifyConfig
	f := prog.NewFlagSet(name, `Checks exactly-once: every item recorded in demo_enqueued (by "demo run" or
"demo enqueue") must have exactly one row in demo_results, unless it is still
pending in the items table, was moved to the dead-items table, or was
cancelled by an operator. With --queue, only that demo queue's items are
checked; without it, every demo queue's.

Prints enqueued, acked (items with a result), duplicates (items with more than
one result), lost (no result, not pending, not dead, not cancelled), pending,
dead and cancelled, and of the pending items those claimed by a session now
(claimed), those claimed past their lease, and the age of the oldest claim: an
item stuck in a claim shows there. Exits 1 if any item is lost or duplicated;
pending, dead and cancelled items are not lost (a cancelled item is known as
such while its queue's dedup window remembers it, 24 hours by default).`)
	c.register(f, urlRequired)
	f.StringVar(&c.runID, "run-id", "", "UUID", "check only the items of this run (default: all runs)", func(s string) error {
		if s == "" {
			return nil
		}
		_, err := uuid.Parse(s)
		if err != nil {
			return fmt.Errorf("not a UUID")
		}
		return nil
	})
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	if err := c.requireURL(f); err != nil {
		return err
	}
	pool, err := cli.Connect(ctx, c.databaseURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := cli.RequireSchema(ctx, pool, tables); err != nil {
		return err
	}
	own, err := demoQueues(ctx, pool)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `SELECT 1 FROM demo_enqueued LIMIT 1`); err != nil {
		if errors.Is(store.Classify(err), crsql.ErrSchemaMissing) {
			return cli.Failf(2, "the demo's tables are not in this database: nothing to verify (`demo run` and `demo enqueue` record what they enqueue)")
		}
		return cli.Failf(1, "reading demo_enqueued: %v", err)
	}
	// The tables are the demo's: bring those of an earlier demo up to date
	// (the queue of each recorded item).
	if err := createDemoTables(ctx, pool); err != nil {
		return err
	}
	var filter checkFilter
	if c.runID != "" {
		id := uuid.MustParse(c.runID)
		filter.runID = &id
	}
	if f.IsSet("queue") {
		if !slices.Contains(own, c.queue) {
			return cli.Failf(2, "queue %q is not one the demo created: nothing of it to verify (the demo's queues: %s)", c.queue, orNone(quoteList(own, 10)))
		}
		filter.queue = c.queue
	}
	v, err := check(ctx, pool, filter)
	if err != nil {
		return cli.Failf(1, "%v", err)
	}
	if c.json {
		type result struct {
			verdict
			OK bool `json:"ok"`
		}
		if err := cli.PrintJSON(out, result{v, v.ok()}); err != nil {
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
		fmt.Fprintf(tw, "cancelled\t%d\n", v.Cancelled)
		fmt.Fprintf(tw, "claimed\t%d (%d past their lease; oldest claim %s old)\n", v.Claimed, v.PastLease, round(v.oldestClaim()))
		tw.Flush()
		b.WriteString(verdictLine(v) + "\n")
		out.Printf("%s", b.String())
	}
	if !v.ok() {
		return cli.ExitCode(1)
	}
	return nil
}

// orNone is s, or "none" when it is empty.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
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
	if v.Cancelled > 0 {
		s += fmt.Sprintf(" (%d cancelled by an operator)", v.Cancelled)
	}
	if v.Pending > 0 {
		s += fmt.Sprintf(" (%d still pending, %d of them claimed, the oldest claim %s old)", v.Pending, v.Claimed, round(v.oldestClaim()))
	}
	return s
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
