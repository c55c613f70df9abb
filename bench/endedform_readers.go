package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// readerSizes are the sizes of the readers' measurement.
type readerSizes struct {
	record, pending, checkBatch, checks, prune, rounds int
	// budget bounds the time of one case's checks in a round: a plan that
	// scans the record per id (seconds per batch) stops after the checks
	// that fit, and its figure is per id of those.
	budget time.Duration
}

// readerCase is one record the readers read: a form, with its transaction
// size for the per-transaction forms.
type readerCase struct {
	form  endedForm
	batch int // ids per row (per-transaction forms)
	table string
	name  string
	found [][16]byte // ids the record holds within the window
}

// recordSpan is how far back the readers' record reaches: its ids ended
// evenly over the last 30 hours, so that with the default window of 24
// hours the oldest fifth is expired (the prune's) and the rest is within
// the dedup window (the check's).
const recordSpan = `INTERVAL '30 hours'`

// readers builds, for each form, a record of s.record ended ids of the
// queue endedReadQueue and measures on it the dedup check of enqueue
// batches (the forms alternating, s.rounds rounds; form c with ids in its
// pending list, then after a cleanup) and the prune of expired ids with
// the VACUUM that follows, CPU per id of the measured connection's backend.
func (e *endedBench) readers(ctx context.Context, out io.Writer, forms []endedForm, batches []int, s readerSizes) error {
	var cases []*readerCase
	for _, f := range forms {
		switch {
		case f.key == "a":
			cases = append(cases, &readerCase{form: f, table: f.table(""), name: "a: per-item rows"})
		case f.gin:
			for _, b := range batches {
				cases = append(cases, &readerCase{form: f, batch: b, table: f.table(fmt.Sprint(b)), name: fmt.Sprintf("%s, %d ids a row", f.name, b)})
			}
		}
	}
	if len(cases) == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nreaders: a record of %d ended ids per form (ended over the last 30 hours: a fifth expired), load %s\n\n", s.record, loadavg())
	fmt.Fprintf(out, "| %-46s | %9s | %11s | %9s | %11s | %-60s |\n", "record", "build s", "table MB", "of TOAST", "indexes MB", "dedup check's plan (EXPLAIN, scans)")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 48), strings.Repeat("-", 11), strings.Repeat("-", 13), strings.Repeat("-", 11), strings.Repeat("-", 13), strings.Repeat("-", 62))
	for _, c := range cases {
		secs, err := e.buildRecord(ctx, c, s)
		if err != nil {
			return fmt.Errorf("building %s: %w", c.name, err)
		}
		var table, toast, indexes float64
		if err := e.setup.QueryRow(ctx, `SELECT pg_table_size($1::regclass) / 1e6,
       coalesce((SELECT pg_total_relation_size(reltoastrelid) FROM pg_class WHERE oid = $1::regclass AND reltoastrelid <> 0), 0) / 1e6,
       pg_indexes_size($1::regclass) / 1e6`, c.table).Scan(&table, &toast, &indexes); err != nil {
			return err
		}
		plan, err := e.checkPlan(ctx, c.form.dedupCheck(c.table))
		if err != nil {
			return err
		}
		if c.form.gin {
			overlap, err := e.checkPlan(ctx, dedupCheckOverlap(c.table))
			if err != nil {
				return err
			}
			plan = "probe: " + plan + "; overlap: " + overlap
		}
		fmt.Fprintf(out, "| %-46s | %9.1f | %11.1f | %9.1f | %11.1f | %-60s |\n", c.name, secs, table, toast, indexes, plan)
		need := s.checks * (s.checkBatch / 2)
		var rows pgx.Rows
		if c.form.gin {
			rows, err = e.setup.Query(ctx, `SELECT x FROM `+c.table+`, unnest(ids) AS x WHERE queue = $1 AND ended_at > now() - INTERVAL '23 hours' ORDER BY random() LIMIT $2`, endedReadQueue, need)
		} else {
			rows, err = e.setup.Query(ctx, `SELECT id FROM crdbwork_ended WHERE queue = $1 AND ended_at > now() - INTERVAL '23 hours' ORDER BY random() LIMIT $2`, endedReadQueue, need)
		}
		if err != nil {
			return err
		}
		if c.found, err = pgx.CollectRows(rows, pgx.RowTo[[16]byte]); err != nil {
			return err
		}
		if len(c.found) < need {
			return fmt.Errorf("%s: %d ids within the window, want %d", c.name, len(c.found), need)
		}
	}
	if err := e.measureChecks(ctx, out, cases, s, "form c with its pending list as built"); err != nil {
		return err
	}
	cleaned := false
	for _, c := range cases {
		if c.form.fastUpdate {
			if _, err := e.setup.Exec(ctx, `SELECT gin_clean_pending_list($1::regclass)`, c.table+"_ids"); err != nil {
				return err
			}
			cleaned = true
		}
	}
	if cleaned {
		if err := e.measureChecks(ctx, out, cases, s, "form c after gin_clean_pending_list"); err != nil {
			return err
		}
	}
	if s.prune == 0 {
		return nil
	}
	fmt.Fprintf(out, "\nprune of %d expired ids per record (1,000 a call, each call its own SERIALIZABLE transaction), then VACUUM of the table; backend CPU per id pruned:\n\n", s.prune)
	fmt.Fprintf(out, "| %-46s | %7s | %9s | %13s | %14s | %-17s |\n", "record", "calls", "ids", "prune µs/id", "VACUUM µs/id", "load")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 48), strings.Repeat("-", 9), strings.Repeat("-", 11), strings.Repeat("-", 15), strings.Repeat("-", 16), strings.Repeat("-", 19))
	for _, c := range cases {
		calls, pruned, prune, vacuum, err := e.measurePrune(ctx, c, s, false)
		if err != nil {
			return fmt.Errorf("pruning %s: %w", c.name, err)
		}
		fmt.Fprintf(out, "| %-46s | %7d | %9d | %13.2f | %14.2f | %-17s |\n", c.name, calls, pruned, prune, vacuum, loadavg())
		if c.form.gin {
			continue
		}
		// The per-item record pruned without the row locks of the
		// library's statement (its FOR UPDATE SKIP LOCKED writes each row
		// once before the delete writes it again): what a cheaper prune of
		// today's form would save. Half as many ids, of the expired ones left.
		calls, pruned, prune, vacuum, err = e.measurePrune(ctx, c, readerSizes{prune: s.prune / 2}, true)
		if err != nil {
			return fmt.Errorf("pruning %s without row locks: %w", c.name, err)
		}
		fmt.Fprintf(out, "| %-46s | %7d | %9d | %13.2f | %14.2f | %-17s |\n", c.name+", no row locks", calls, pruned, prune, vacuum, loadavg())
	}
	return nil
}

// pruneEndedUnlocked is the library's prune of per-item rows (store's
// pruneEndedSQL) without its locking CTE: the oldest expired rows are
// deleted by primary key; concurrent pruners would wait for each other's
// rows instead of skipping them.
const pruneEndedUnlocked = `DELETE FROM crdbwork_ended AS e
WHERE e.queue = $1 AND e.id IN (
    SELECT id FROM crdbwork_ended WHERE queue = $1 AND ended_at < now() - ` + keepWindowOf + ` ORDER BY ended_at LIMIT $2)
  AND e.ended_at < now() - ` + keepWindowOf + `
RETURNING e.id`

// buildRecord fills c's record with s.record ids of endedReadQueue, as
// its writers would have (in order of their end; form c's newest
// s.pending ids inserted after a cleanup, so that they are in its pending
// list), and returns the seconds it took.
func (e *endedBench) buildRecord(ctx context.Context, c *readerCase, s readerSizes) (float64, error) {
	start := time.Now()
	if !c.form.gin {
		if _, err := e.setup.Exec(ctx, `DELETE FROM crdbwork_ended WHERE queue = $1`, endedReadQueue); err != nil {
			return 0, err
		}
		// Oldest first, as acks write them; 100,000 ids a statement.
		for lo := s.record; lo > 0; lo -= 100_000 {
			if _, err := e.setup.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, ended_at, outcome, attempts, enqueued_at, started_at, session)
SELECT $1, gen_random_uuid(), now() - (g::FLOAT8 / $2::FLOAT8) * `+recordSpan+`, 'acked', 1,
       now() - INTERVAL '31 hours', now() - INTERVAL '31 hours', $3
FROM generate_series($4::BIGINT, $5::BIGINT, -1) AS g`, endedReadQueue, s.record, e.sid, lo-1, max(0, lo-100_000)); err != nil {
				return 0, err
			}
		}
		if _, err := e.setup.Exec(ctx, `VACUUM ANALYZE crdbwork_ended`); err != nil {
			return 0, err
		}
		return time.Now().Sub(start).Seconds(), nil
	}
	if err := c.form.createTxTable(ctx, e.setup, c.table); err != nil {
		return 0, err
	}
	// Row k holds ids k·batch … (k+1)·batch − 1, id g ending at
	// now() − g/record · span: the newest ids have the smallest g.
	insert := `INSERT INTO ` + c.table + ` (queue, ended_at, outcome, ids, attempts, enqueued_at, started_at, sessions)
SELECT $1, now() - (s.k::FLOAT8 * $3::FLOAT8 / $2::FLOAT8) * ` + recordSpan + `, 'acked', array_agg(gen_random_uuid()), array_agg(1::BIGINT),
       array_agg(now() - INTERVAL '31 hours'), array_agg(now() - INTERVAL '31 hours'), array_agg($4::UUID)
FROM (SELECT g / $3::BIGINT AS k FROM generate_series($5::BIGINT, $6::BIGINT) AS g) AS s
GROUP BY s.k
ORDER BY s.k DESC`
	pendingRows := 0
	if c.form.fastUpdate {
		pendingRows = (s.pending + c.batch - 1) / c.batch
	}
	split := pendingRows * c.batch // ids [0, split) go in last
	rowsTotal := (s.record + c.batch - 1) / c.batch
	step := max(1, 100_000/c.batch) * c.batch
	for hi := rowsTotal * c.batch; hi > split; hi -= step {
		lo := max(split, hi-step)
		if _, err := e.setup.Exec(ctx, insert, endedReadQueue, s.record, c.batch, e.sid, lo, min(hi, s.record)-1); err != nil {
			return 0, err
		}
	}
	if _, err := e.setup.Exec(ctx, `VACUUM ANALYZE `+c.table); err != nil { // also merges the pending list
		return 0, err
	}
	if split > 0 {
		for hi := split; hi > 0; hi -= step {
			lo := max(0, hi-step)
			if _, err := e.setup.Exec(ctx, insert, endedReadQueue, s.record, c.batch, e.sid, lo, min(hi, s.record)-1); err != nil {
				return 0, err
			}
		}
		if _, err := e.setup.Exec(ctx, `ANALYZE `+c.table); err != nil { // ANALYZE leaves the pending list (autovacuum's would not)
			return 0, err
		}
	}
	return time.Now().Sub(start).Seconds(), nil
}

// checkPlan returns the scans of a dedup check's plan.
func (e *endedBench) checkPlan(ctx context.Context, check string) (string, error) {
	rows, err := e.setup.Query(ctx, `EXPLAIN (COSTS OFF) `+check, endedReadQueue, [][16]byte{uuid.New()})
	if err != nil {
		return "", fmt.Errorf("EXPLAIN of the dedup check: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", err
	}
	var scans []string
	for _, l := range lines {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "->"))
		if strings.Contains(l, "Scan") && !strings.Contains(l, "Function Scan") {
			scans = append(scans, l)
		}
	}
	return strings.Join(scans, "; "), nil
}

// measureChecks runs s.checks dedup checks of s.checkBatch ids (half of
// them in the record, half new, shuffled) per case and round, the cases
// rotated every round, and prints the backend's CPU and the statement's
// execution time per id checked. A check that does not find exactly the
// record's ids fails the run.
func (e *endedBench) measureChecks(ctx context.Context, out io.Writer, cases []*readerCase, s readerSizes, state string) error {
	fmt.Fprintf(out, "\ndedup checks of %d-id enqueue batches (half in the record), %d per record and round, %s; µs per id checked\n", s.checkBatch, s.checks, state)
	fmt.Fprintf(out, "(probe: a subplan per id, as the insert's check; overlap: one read of the GIN index for the batch, ids && $2):\n\n")
	fmt.Fprintf(out, "| %-56s | %5s | %11s | %11s | %-17s |\n", "record, check", "round", "backend", "exec", "load")
	fmt.Fprintf(out, "|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 58), strings.Repeat("-", 7), strings.Repeat("-", 13), strings.Repeat("-", 13), strings.Repeat("-", 19))
	// Plans made in an earlier phase are dropped: a generic plan cached
	// while form c's pending list was full would keep its scan after the
	// cleanup (the planner prices the pending list into the GIN index's
	// cost when it plans, not when it runs).
	if err := e.conn.DeallocateAll(ctx); err != nil {
		return err
	}
	half := s.checkBatch / 2
	type shaped struct {
		c       *readerCase
		overlap bool
		noSeq   bool // enable_seqscan off: the probe forced onto the GIN index
	}
	var all []shaped
	for _, c := range cases {
		all = append(all, shaped{c: c})
		if c.form.gin {
			all = append(all, shaped{c: c, overlap: true})
		}
		if c.form.fastUpdate {
			all = append(all, shaped{c: c, noSeq: true})
		}
	}
	name := func(x shaped) string {
		switch {
		case x.overlap:
			return x.c.name + ", overlap"
		case x.noSeq:
			return x.c.name + ", probe, seqscan off"
		}
		return x.c.name + ", probe"
	}
	med := make(map[shaped][]float64)
	for r := range s.rounds {
		order := make([]shaped, len(all))
		for i := range all {
			order[i] = all[(i+r)%len(all)]
		}
		for _, x := range order {
			c := x.c
			batches := make([][][16]byte, s.checks)
			for i := range batches {
				b := make([][16]byte, 0, s.checkBatch)
				b = append(b, c.found[i*half:(i+1)*half]...)
				for len(b) < s.checkBatch {
					b = append(b, uuid.New())
				}
				rand.Shuffle(len(b), func(x, y int) { b[x], b[y] = b[y], b[x] })
				batches[i] = b
			}
			text := c.form.dedupCheck(c.table)
			if x.overlap {
				text = dedupCheckOverlap(c.table)
			}
			if x.noSeq {
				// its own prepared statement, planned with the setting
				text += " -- enable_seqscan off"
			}
			want := int64(s.checkBatch - half)
			check := func(b [][16]byte) error {
				var n int64
				if err := e.conn.QueryRow(ctx, text, endedReadQueue, b).Scan(&n); err != nil {
					return err
				}
				if n != want {
					return fmt.Errorf("%s: the dedup check let %d of %d ids through, want %d (the others are in the record)", c.name, n, len(b), want)
				}
				return nil
			}
			seq := "on"
			if x.noSeq {
				seq = "off"
			}
			if _, err := e.conn.Exec(ctx, `SET enable_seqscan = `+seq); err != nil {
				return err
			}
			if err := check(batches[0]); err != nil { // prepares the statement, untimed
				return err
			}
			_, _ = e.setup.Exec(ctx, `SELECT pg_stat_statements_reset()`)
			be0, err := e.backendCPU()
			if err != nil {
				return err
			}
			done, deadline := 0, time.Now().Add(s.budget)
			for _, b := range batches {
				if err := check(b); err != nil {
					return err
				}
				if done++; time.Now().After(deadline) {
					break
				}
			}
			be1, err := e.backendCPU()
			if err != nil {
				return err
			}
			ids := done * s.checkBatch
			cut := ""
			if done < s.checks {
				cut = fmt.Sprintf(" (%d checks in %s)", done, s.budget)
			}
			var ms float64
			_ = e.setup.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements WHERE query LIKE 'SELECT count(*) FROM %'`).Scan(&ms)
			per := perItem(be1-be0, ids)
			med[x] = append(med[x], per)
			fmt.Fprintf(out, "| %-56s | %5d | %11.2f | %11.2f | %-17s |%s\n", name(x), r+1, per, ms*1000/float64(ids), loadavg(), cut)
		}
	}
	fmt.Fprintf(out, "\nmedians (backend CPU µs per id checked), %s:\n", state)
	for _, x := range all {
		fmt.Fprintf(out, "  %-56s %7.2f\n", name(x), median(med[x]))
	}
	return nil
}

// measurePrune vacuums c's record (untimed: the visibility map set, form
// c's pending list merged), prunes s.prune of its expired ids in calls of
// about 1,000 ids, each in its own SERIALIZABLE transaction, with the
// library's statement (a; with unlocked, pruneEndedUnlocked) or its per-transaction form, then VACUUMs the
// table; it returns the calls, the ids pruned and the backend's CPU per id
// pruned for the prunes and for the VACUUM, and checks that exactly the
// pruned ids left the record.
func (e *endedBench) measurePrune(ctx context.Context, c *readerCase, s readerSizes, unlocked bool) (calls, pruned int, prune, vacuum float64, err error) {
	if _, err := e.setup.Exec(ctx, `VACUUM `+c.table); err != nil {
		return 0, 0, 0, 0, err
	}
	count := func() (int64, error) {
		_, all, err := c.form.recorded(ctx, e.setup, c.table, endedReadQueue, nil)
		return all, err
	}
	before, err := count()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	// About 1,000 ids a call, and no more than are left to prune.
	limit := func() int {
		n := min(1000, s.prune-pruned)
		if c.form.gin {
			return max(1, n/c.batch)
		}
		return n
	}
	be0, err := e.backendCPU()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	for pruned < s.prune {
		tx, err := e.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
		if err != nil {
			return 0, 0, 0, 0, err
		}
		n := 0
		if c.form.gin {
			rows, err := tx.Query(ctx, txPrune(c.table), endedReadQueue, limit())
			if err == nil {
				var sizes []int32
				sizes, err = pgx.CollectRows(rows, pgx.RowTo[int32])
				for _, k := range sizes {
					n += int(k)
				}
			}
			if err != nil {
				_ = tx.Rollback(ctx)
				return 0, 0, 0, 0, err
			}
		} else if unlocked {
			tag, err := tx.Exec(ctx, pruneEndedUnlocked, endedReadQueue, limit())
			if err != nil {
				_ = tx.Rollback(ctx)
				return 0, 0, 0, 0, err
			}
			n = int(tag.RowsAffected())
		} else {
			k, err := e.st.EndedPrune(ctx, tx, endedReadQueue, limit())
			if err != nil {
				_ = tx.Rollback(ctx)
				return 0, 0, 0, 0, err
			}
			n = int(k)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, 0, 0, 0, err
		}
		if n == 0 {
			return 0, 0, 0, 0, fmt.Errorf("a prune found nothing after %d of %d ids", pruned, s.prune)
		}
		calls++
		pruned += n
	}
	be1, err := e.backendCPU()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if _, err := e.conn.Exec(ctx, `VACUUM `+c.table); err != nil {
		return 0, 0, 0, 0, err
	}
	be2, err := e.backendCPU()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	after, err := count()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if before-after != int64(pruned) {
		return 0, 0, 0, 0, errors.New("the record lost other ids than those the prunes returned")
	}
	return calls, pruned, perItem(be1-be0, pruned), perItem(be2-be1, pruned), nil
}
