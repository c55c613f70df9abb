package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// idleCmd measures what idle workers cost when nothing changes: N sessions
// on one queue of P parts, then M queues with one session each, every
// worker with the default options and a pool of its own (as separate
// processes would have; the process's wake-up listener is shared, as it is
// by the workers of one process). Once the fleet has settled (every part
// owned, no part moving), it counts for --measure the statements the server
// ran (pg_stat_statements, BEGIN and COMMIT included), the server's and
// this process's CPU time and the workers' connections.
func idleCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("idle", out)
	var c commonFlags
	c.register(fs)
	sessions := fs.Int("sessions", 128, "sessions (workers) on the one queue with parts; 0: skip that scenario")
	parts := fs.Int("parts", 256, "parts of the one queue")
	queues := fs.Int("queues", 100, "idle queues with one worker each (no parts); 0: skip that scenario")
	measure := fs.Duration("measure", 20*time.Second, "how long each scenario is measured once settled")
	wakeMode := fs.String("wake", "auto", "the workers' wake-ups: auto (LISTEN on PostgreSQL), probe (the idle probe, as on CockroachDB) or none (poll alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *sessions < 0 || *queues < 0 || *parts < 1 || *parts > partition.MaxParts:
		return fmt.Errorf("--sessions and --queues must not be negative, --parts between 1 and %d", partition.MaxParts)
	case *measure <= 0:
		return errors.New("--measure must be positive")
	}
	opts := worker.Options{}
	switch *wakeMode {
	case "auto":
	case "probe":
		opts.Wake = worker.WakeProbe
	case "none":
		opts.NoWake = true
	default:
		return fmt.Errorf("--wake: unknown mode %q (want auto, probe or none)", *wakeMode)
	}
	c.statements = true // the measurement itself
	serverMaxConns = 2000
	url, setup, done, err := c.prepare(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	st := newStatements(ctx, setup)
	if !st.on {
		return errors.New("pg_stat_statements is not available: idle counts statements with it")
	}
	fmt.Fprintf(out, "idle fleets: default worker options (wake %s), one pool per worker; measured %v once settled; load %s\n",
		*wakeMode, *measure, loadavg())
	if *sessions > 0 {
		o := opts
		o.Parts = *parts
		if err := idleScenario(ctx, out, url, setup, st, fmt.Sprintf("%d sessions, one queue of %d parts", *sessions, *parts),
			[]string{"idle_one"}, *sessions, o, *measure); err != nil {
			return err
		}
	}
	if *queues > 0 {
		names := make([]string, *queues)
		for i := range names {
			names[i] = fmt.Sprintf("idle_q%03d", i)
		}
		if err := idleScenario(ctx, out, url, setup, st, fmt.Sprintf("%d queues, one session each, no parts", *queues),
			names, 1, opts, *measure); err != nil {
			return err
		}
	}
	return nil
}

// idleScenario runs per workers on each of queues, waits until they have
// settled, and measures them for d.
func idleScenario(ctx context.Context, out io.Writer, url string, setup *pgxpool.Pool, st statements, label string,
	queues []string, per int, opts worker.Options, d time.Duration) error {
	for _, q := range queues {
		if _, err := setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, q); err != nil {
			return err
		}
		if err := partition.SetParts(ctx, setup, crsql.Tables{}, q, max(opts.Parts, 1)); err != nil {
			return fmt.Errorf("setting the parts of %s: %w", q, err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type running struct {
		w    *worker.Worker
		pool *pgxpool.Pool
		done chan error
	}
	var ws []running
	defer func() {
		cancel()
		for _, r := range ws {
			<-r.done
			r.pool.Close()
		}
	}()
	for _, qn := range queues {
		for range per {
			pool, err := newPool(ctx, url, worker.PoolConns(opts))
			if err != nil {
				return err
			}
			q, err := claim.New(pool, claim.Options{Queue: qn})
			if err != nil {
				pool.Close()
				return err
			}
			w, err := worker.New(q, func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }, opts)
			if err != nil {
				pool.Close()
				return err
			}
			r := running{w: w, pool: pool, done: make(chan error, 1)}
			go func() { r.done <- w.Run(runCtx) }()
			ws = append(ws, r)
		}
	}
	// Settled: every part owned, and no part moved for 3 s.
	owned := func() (int64, int64) {
		var held, moves int64
		for _, r := range ws {
			p := r.w.Stats().Parts
			held += p.Acquired - p.Released
			moves += p.Acquired + p.Released
		}
		return held, moves
	}
	want := int64(len(queues) * max(opts.Parts, 1))
	if opts.Parts == 0 {
		want = 0
	}
	start := time.Now()
	var lastMoves int64 = -1
	stableSince := time.Now()
	for {
		held, moves := owned()
		if moves != lastMoves {
			lastMoves, stableSince = moves, time.Now()
		}
		if held >= want && time.Since(stableSince) >= 3*time.Second {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("%s: not settled after 5 minutes (%d of %d parts owned)", label, held, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, r := range ws {
		select {
		case err := <-r.done:
			return fmt.Errorf("%s: a worker stopped: %v", label, err)
		default:
		}
	}
	settled := time.Since(start)
	var lostBefore int64
	for _, r := range ws {
		lostBefore += r.w.Stats().SessionsLost
	}
	st.reset(ctx, setup)
	cpu0, t0 := readCPU(postmaster), time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	cpu1, elapsed := readCPU(postmaster), time.Since(t0)
	var conns int
	if err := setup.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&conns); err != nil {
		return err
	}
	// Every statement but the bench's own (its reset and reads of
	// pg_stat_statements and pg_stat_activity): the workers' reads of the
	// tables' statistics (pg_stat_user_tables) count.
	rows, err := setup.Query(ctx, `SELECT calls, regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements
WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_activity%'`)
	if err != nil {
		return fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	type stmt struct {
		calls int64
		q     string
	}
	var all []stmt
	var total int64
	for rows.Next() {
		var s stmt
		if err := rows.Scan(&s.calls, &s.q); err != nil {
			rows.Close()
			return err
		}
		all = append(all, s)
		total += s.calls
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var moves, lost int64
	for _, r := range ws {
		s := r.w.Stats()
		lost += s.SessionsLost
		moves += s.Parts.Acquired + s.Parts.Released
	}
	n := len(ws)
	secs := elapsed.Seconds()
	fmt.Fprintf(out, "\n%s: %d workers, settled in %v, measured %.1f s, load %s\n", label, n, settled.Round(time.Second), secs, loadavg())
	fmt.Fprintf(out, "  statements/s: %.1f in all, %.2f per session\n", float64(total)/secs, float64(total)/secs/float64(n))
	fmt.Fprintf(out, "  CPU, fraction of a core: server %.3f, client (this process) %.3f\n",
		(cpu1.server-cpu0.server).Seconds()/secs, (cpu1.client-cpu0.client).Seconds()/secs)
	fmt.Fprintf(out, "  connections of the workers: %d (%.1f per worker)\n", conns, float64(conns)/float64(n))
	fmt.Fprintf(out, "  sessions lost while measured: %d; part moves since the start: %d\n", lost-lostBefore, moves)
	sort.Slice(all, func(i, j int) bool { return all[i].calls > all[j].calls })
	fmt.Fprintf(out, "  %12s  %s\n", "per session/s", "statement")
	for i, s := range all {
		if i == 30 || float64(s.calls)/secs/float64(n) < 0.005 {
			break
		}
		q := strings.TrimSpace(s.q)
		if len(q) > 140 {
			q = q[:140] + "…"
		}
		fmt.Fprintf(out, "  %12.3f  %s\n", float64(s.calls)/secs/float64(n), q)
	}
	return nil
}
