package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// claimCostQueue is the queue the claimcost command fills.
const claimCostQueue = "claimcost"

// claimcostCmd measures the server CPU time of the claim alone, per claimed
// item: one session claims a seeded backlog through claim.Queue (batches of
// --batch, nothing acked) on a pool of one connection, and the command reads
// that connection's backend's CPU time (/proc/<pid>/stat) before and after.
// CPU time, not wall time, so that a busy machine slows the run but moves
// the figure little. It runs the plain claim (any part) and the parts-mode
// claim (--owned parts of the session), each with the foreign-key triggers
// on and, to show their share, off (session_replication_role = replica:
// the figure without the per-row foreign-key checks; a measurement only).
func claimcostCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("claimcost", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 50000, "items claimed per run")
	batch := fs.Int("batch", 256, "items per claim")
	owned := fs.Int("owned", 4, "parts the session owns in the parts-mode runs")
	rounds := fs.Int("rounds", 3, "rounds; each runs every case once")
	payload := fs.Int("payload", 0, "bytes of each item's payload (stored in the row up to about 2,000: a wider row the claim copies)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *items < 1 || *batch < 1 || *owned < 1 || *owned > store.MaxPartBranches || *rounds < 1 || *payload < 0 || *payload > 1<<20 {
		return fmt.Errorf("--items, --batch and --rounds must be at least 1, --owned 1 to %d, --payload 0 to 1 MiB", store.MaxPartBranches)
	}
	url, setup, done, err := c.crdbworkDatabase(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	s, err := session.Start(ctx, setup, session.Options{Tables: crsql.Tables{}})
	if err != nil {
		return err
	}
	defer s.Close(context.WithoutCancel(ctx))
	parts := make([]int, *owned)
	for i := range parts {
		parts[i] = i
		if _, err := setup.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, $2, $3)`,
			s.ID(), claimCostQueue, i); err != nil {
			return fmt.Errorf("owning part %d of queue %q (another live session of this database may own it): %w", i, claimCostQueue, err)
		}
	}
	type kase struct {
		name  string
		parts []int
		noFK  bool
	}
	cases := []kase{
		{"plain", nil, false},
		{"plain, FK triggers off", nil, true},
		{fmt.Sprintf("parts (%d owned)", *owned), parts, false},
		{fmt.Sprintf("parts (%d owned), FK triggers off", *owned), parts, true},
	}
	fmt.Fprintf(out, "claims of %d items of %d payload bytes in batches of %d, one connection, nothing acked; load %s\n\n", *items, *payload, *batch, loadavg())
	fmt.Fprintf(out, "| %-32s | %5s | %12s | %9s | %-17s |\n", "case", "round", "server CPU µs/item", "rows/call", "load")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 34), strings.Repeat("-", 7), strings.Repeat("-", 20), strings.Repeat("-", 11), strings.Repeat("-", 19))
	results := make([][]float64, len(cases))
	for r := range *rounds {
		for i, k := range cases {
			perItem, perCall, err := claimCostRun(ctx, url, setup, s.ID(), k.parts, k.noFK, *items, *batch, *payload)
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			results[i] = append(results[i], perItem)
			fmt.Fprintf(out, "| %-32s | %5d | %18.1f | %9.1f | %-17s |\n", k.name, r+1, perItem, perCall, loadavg())
		}
	}
	fmt.Fprintf(out, "\nmedians of %d rounds (server CPU µs per claimed item):\n", *rounds)
	for i, k := range cases {
		slices.Sort(results[i])
		fmt.Fprintf(out, "  %-32s %6.1f\n", k.name, results[i][len(results[i])/2])
	}
	return nil
}

// claimCostRun seeds n items of payload bytes (in the given parts, or part 0), claims them
// all in batches on a pool of one connection (with the foreign-key triggers
// off if noFK) and returns its backend's CPU time per claimed item in µs and
// the rows per claim statement.
func claimCostRun(ctx context.Context, url string, setup *pgxpool.Pool, sid [16]byte, parts []int, noFK bool, n, batch, payload int) (float64, float64, error) {
	if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, claimCostQueue); err != nil {
		return 0, 0, err
	}
	spread := max(1, len(parts))
	if _, err := setup.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload)
SELECT gen_random_uuid(), $1, g % $3, repeat('x', $4)::BYTEA FROM generate_series(1, $2) AS g`, claimCostQueue, n, spread, payload); err != nil {
		return 0, 0, fmt.Errorf("seeding: %w", err)
	}
	if err := store.RefreshStats(ctx, setup, "crdbwork_items"); err != nil {
		return 0, 0, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, 0, err
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "bench-claimcost"
	if noFK {
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, `SET session_replication_role = replica`)
			return err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: claimCostQueue, Lease: time.Hour})
	if err != nil {
		return 0, 0, err
	}
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, 0, err
	}
	// One claim first (untimed): the queue's settings read and the
	// statements' preparation are not the claim's cost.
	cl := q.Claimer(sid)
	got, err := cl.Claim(ctx, claim.ClaimRequest{Max: 1, Parts: parts})
	if err != nil {
		return 0, 0, err
	}
	claimed, calls := len(got), 0
	f0 := procStat(backend)
	if f0 == nil {
		return 0, 0, errors.New("cannot read the backend's /proc/<pid>/stat (is the server on this machine?)")
	}
	for claimed < n {
		got, err := cl.Claim(ctx, claim.ClaimRequest{Max: batch, Parts: parts})
		if err != nil {
			return 0, 0, err
		}
		calls++
		if len(got) == 0 {
			return 0, 0, fmt.Errorf("a claim found nothing after %d of %d items", claimed, n)
		}
		claimed += len(got)
	}
	f1 := procStat(backend)
	if f1 == nil {
		return 0, 0, errors.New("the backend went away")
	}
	cpu := ticks(f1, 13, 14) - ticks(f0, 13, 14)
	timed := claimed - 1
	return float64(cpu.Microseconds()) / float64(timed), float64(timed) / float64(calls), nil
}
