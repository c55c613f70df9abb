package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// ackCostQueue is the queue the ackcost command fills.
const ackCostQueue = "ackcost"

// ackcostCmd measures the server CPU time of the ack alone, per acked item:
// a seeded backlog is claimed whole on another connection (untimed), then
// acked through claim.Queue.AckMany in batches of --batch, no record, on a
// pool of one connection, and the command reads that connection's
// backend's CPU time (/proc/<pid>/stat) before and after: the ack's
// transaction whole (BEGIN, the fenced delete with its ended record,
// COMMIT). CPU time, not wall time, so that a busy machine slows the run
// but moves the figure little. It runs items without a kind and items of
// kind --kind, alternating, --rounds times.
func ackcostCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("ackcost", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 50000, "items acked per run")
	batch := fs.Int("batch", 64, "items per ack transaction")
	kind := fs.String("kind", "send_mail", "the kind of the items of the second case")
	rounds := fs.Int("rounds", 3, "rounds; each runs every case once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *items < 2 || *batch < 1 || *rounds < 1 || *kind == "" {
		return errors.New("--items must be at least 2, --batch and --rounds at least 1, --kind not empty")
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
	cases := []string{"", *kind}
	name := func(k string) string {
		if k == "" {
			return "no kind"
		}
		return "kind " + k
	}
	fmt.Fprintf(out, "acks of %d claimed items in transactions of %d, one connection, no record; load %s\n\n", *items, *batch, loadavg())
	fmt.Fprintf(out, "| %-24s | %5s | %18s | %-17s |\n", "case", "round", "server CPU µs/item", "load")
	fmt.Fprintf(out, "|%s|%s|%s|%s|\n", strings.Repeat("-", 26), strings.Repeat("-", 7), strings.Repeat("-", 20), strings.Repeat("-", 19))
	results := make([][]float64, len(cases))
	for r := range *rounds {
		for i, k := range cases {
			perItem, err := ackCostRun(ctx, url, setup, s.ID(), k, *items, *batch)
			if err != nil {
				return fmt.Errorf("%s: %w", name(k), err)
			}
			results[i] = append(results[i], perItem)
			fmt.Fprintf(out, "| %-24s | %5d | %18.1f | %-17s |\n", name(k), r+1, perItem, loadavg())
		}
	}
	fmt.Fprintf(out, "\nmedians of %d rounds (server CPU µs per acked item):\n", *rounds)
	for i, k := range cases {
		slices.Sort(results[i])
		fmt.Fprintf(out, "  %-24s %6.1f\n", name(k), results[i][len(results[i])/2])
	}
	return nil
}

// ackCostRun seeds n items of kind k ("": none), claims them all for
// session sid on the setup pool, acks them in transactions of batch items
// on a pool of one connection and returns its backend's CPU time per acked
// item in µs (the first transaction, which prepares the statements, is not
// timed).
func ackCostRun(ctx context.Context, url string, setup *pgxpool.Pool, sid [16]byte, k string, n, batch int) (float64, error) {
	if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, ackCostQueue); err != nil {
		return 0, err
	}
	if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_ended WHERE queue = $1`, ackCostQueue); err != nil {
		return 0, err
	}
	var kind *string
	if k != "" {
		kind = &k
	}
	if _, err := setup.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload, kind)
SELECT gen_random_uuid(), $1, 0, '\x'::BYTEA, $3 FROM generate_series(1, $2) AS g`, ackCostQueue, n, kind); err != nil {
		return 0, fmt.Errorf("seeding: %w", err)
	}
	if err := store.RefreshStats(ctx, setup, "crdbwork_items"); err != nil {
		return 0, err
	}
	q, err := claim.New(setup, claim.Options{Queue: ackCostQueue, Lease: time.Hour})
	if err != nil {
		return 0, err
	}
	var held []claim.Item
	for len(held) < n {
		got, err := q.Claimer(sid).Claim(ctx, claim.ClaimRequest{Max: 1000})
		if err != nil {
			return 0, err
		}
		if len(got) == 0 {
			return 0, fmt.Errorf("a claim found nothing after %d of %d items", len(held), n)
		}
		held = append(held, got...)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, err
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "bench-ackcost"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	aq, err := claim.New(pool, claim.Options{Queue: ackCostQueue, Lease: time.Hour})
	if err != nil {
		return 0, err
	}
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, err
	}
	ack := func(items []claim.Item) error {
		reqs := make([]claim.AckRequest, len(items))
		for i, it := range items {
			reqs[i] = claim.AckRequest{Item: it}
		}
		return errors.Join(aq.AckMany(ctx, reqs, claim.AckOptions{})...)
	}
	// One ack first (untimed): the queue's settings read and the
	// statements' preparation are not the ack's cost.
	if err := ack(held[:1]); err != nil {
		return 0, err
	}
	f0 := procStat(backend)
	if f0 == nil {
		return 0, errors.New("cannot read the backend's /proc/<pid>/stat (is the server on this machine?)")
	}
	for i := 1; i < len(held); i += batch {
		if err := ack(held[i:min(i+batch, len(held))]); err != nil {
			return 0, err
		}
	}
	f1 := procStat(backend)
	if f1 == nil {
		return 0, errors.New("the backend went away")
	}
	var ended int64
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND outcome = 'acked'`, ackCostQueue).Scan(&ended); err != nil {
		return 0, err
	}
	if ended != int64(n) {
		return 0, fmt.Errorf("%d ended records of %d items acked", ended, n)
	}
	cpu := ticks(f1, 13, 14) - ticks(f0, 13, 14)
	return float64(cpu.Microseconds()) / float64(n-1), nil
}
