package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// growthQueue is the queue the growth command fills.
const growthQueue = "growth"

func growth(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("growth", out)
	var c commonFlags
	c.register(fs)
	backlogs := fs.String("backlogs", "10000,100000,1000000", "backlog sizes (items), comma-separated")
	sessionCounts := fs.String("sessions", "1,4,16", "numbers of concurrent sessions, comma-separated")
	batch := fs.Int("batch", 64, "items per claim")
	duration := fs.Duration("duration", 2*time.Second, "measuring time per cell (the backlog is topped up, untimed, whenever a tenth of it was consumed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	bs, err := intList(*backlogs)
	if err != nil {
		return fmt.Errorf("--backlogs: %w", err)
	}
	ss, err := intList(*sessionCounts)
	if err != nil {
		return fmt.Errorf("--sessions: %w", err)
	}
	if *batch < 1 || *duration <= 0 {
		return errors.New("--batch must be at least 1 and --duration positive")
	}
	url, stopServer, err := c.database(ctx, out)
	if err != nil {
		return err
	}
	defer stopServer()
	pool, err := newPool(ctx, url, slices.Max(ss)+4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setupCrdbwork(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, growthQueue); err != nil {
		return err
	}
	q, err := claim.New(pool, claim.Options{Queue: growthQueue})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "claims of %d items, then a batch ack (no record) of what they got; load %s\n\n", *batch, loadavg())
	fmt.Fprintf(out, "| %9s | %8s | %12s | %12s | %12s | %-17s |\n", "backlog", "sessions", "claim p50", "claim p99", "items/s", "load")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 11), strings.Repeat("-", 10), strings.Repeat("-", 14), strings.Repeat("-", 14), strings.Repeat("-", 14), strings.Repeat("-", 19))
	for _, b := range bs {
		for _, n := range ss {
			if err := topUp(ctx, pool, b, true); err != nil {
				return err
			}
			cell, err := measureClaims(ctx, pool, q, n, *batch, *duration, b)
			if err != nil {
				return fmt.Errorf("backlog %d, %d sessions: %w", b, n, err)
			}
			fmt.Fprintf(out, "| %9d | %8d | %12s | %12s | %12.0f | %-17s |\n", b, n,
				cell.p50.Round(10*time.Microsecond), cell.p99.Round(10*time.Microsecond), cell.rate, loadavg())
		}
	}
	return nil
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// topUp inserts items (in one statement per 100,000) until the growth queue
// holds backlog unclaimed items, then (with vacuum) vacuums and analyzes the
// table.
func topUp(ctx context.Context, pool *pgxpool.Pool, backlog int, vacuum bool) error {
	var have int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = $1`, growthQueue).Scan(&have); err != nil {
		return err
	}
	if have > backlog {
		if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE id IN (SELECT id FROM crdbwork_items WHERE queue = $1 LIMIT $2)`,
			growthQueue, have-backlog); err != nil {
			return err
		}
	}
	for have < backlog {
		n := min(backlog-have, 100_000)
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, payload)
SELECT gen_random_uuid(), $1, '\x'::BYTEA FROM generate_series(1, $2)`, growthQueue, n); err != nil {
			return fmt.Errorf("seeding %d items: %w", n, err)
		}
		have += n
	}
	if !vacuum {
		return nil
	}
	err := store.RefreshStats(ctx, pool, "crdbwork_items")
	return err
}

type growthCell struct {
	p50, p99 time.Duration
	rate     float64
}

// measureClaims runs sessions concurrent claim+ack loops for d in all, in
// segments that each take at most a tenth of the backlog, topping the
// backlog up (untimed) between segments, and reports the claim latencies and
// the items claimed and acked per second.
func measureClaims(ctx context.Context, pool *pgxpool.Pool, q *claim.Queue, sessions, batch int, d time.Duration, backlog int) (growthCell, error) {
	ss := make([]*session.Session, sessions)
	for i := range ss {
		s, err := session.Start(ctx, pool, session.Options{Tables: crsql.Tables{}})
		if err != nil {
			return growthCell{}, err
		}
		defer s.Close(context.WithoutCancel(ctx))
		ss[i] = s
	}
	var lat []time.Duration
	var items int64
	var elapsed time.Duration
	for elapsed < d {
		if elapsed > 0 {
			if err := topUp(ctx, pool, backlog, false); err != nil {
				return growthCell{}, err
			}
		}
		segLat, segItems, segTime, err := claimSegment(ctx, q, ss, batch, d-elapsed, int64(max(backlog/10, batch)))
		if err != nil {
			return growthCell{}, err
		}
		lat, items, elapsed = append(lat, segLat...), items+segItems, elapsed+segTime
	}
	slices.Sort(lat)
	return growthCell{
		p50:  lat[len(lat)/2],
		p99:  lat[min(len(lat)-1, len(lat)*99/100)],
		rate: float64(items) / elapsed.Seconds(),
	}, nil
}

// claimSegment runs one claim+ack loop per session until d passed or they
// took limit items.
func claimSegment(ctx context.Context, q *claim.Queue, ss []*session.Session, batch int, d time.Duration, limit int64) ([]time.Duration, int64, time.Duration, error) {
	var taken atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	errs := make(chan error, len(ss))
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			for time.Now().Before(deadline) && taken.Load() < limit {
				t0 := time.Now()
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: batch})
				mine = append(mine, time.Since(t0))
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					errs <- errors.New("a claim found nothing: the backlog ran out")
					return
				}
				reqs := make([]claim.AckRequest, len(got))
				for i, it := range got {
					reqs[i] = claim.AckRequest{Item: it}
				}
				if err := errors.Join(q.AckMany(ctx, reqs, claim.AckOptions{})...); err != nil {
					errs <- err
					return
				}
				taken.Add(int64(len(got)))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	return lat, taken.Load(), elapsed, <-errs
}
