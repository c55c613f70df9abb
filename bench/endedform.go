package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// endedform measures the forms the ended-id record could take (issue #32,
// goal 2: "ended ids recorded per ack transaction instead of per item"),
// writers and readers, on one PostgreSQL server, without changing the
// library:
//
//	a  today's: one crdbwork_ended row per item (the real table, its
//	   primary key (queue, id), crdbwork_ended_by_age and the partial
//	   index of cancels), written by the ack's real statement;
//	b  one row per ack transaction in a table of the bench's own
//	   (bench_ended_tx_*): the ids and the per-item history columns as
//	   arrays, primary key (queue, ended_at, tx) — which is also the
//	   prune's order, so no second B-tree — and a GIN index on ids with
//	   fastupdate off;
//	c  the same with fastupdate on (inserts go to the GIN pending list,
//	   which every lookup scans until a cleanup merges it);
//	d  no record (the floor): the ack's statement without its ended CTE.
//
// The ack is the library's own statement (store.ItemsAckPipeline: BEGIN,
// the claim-checked delete that fails unless it deleted every item asked
// for, COMMIT, one round trip), its ended CTE replaced for b, c and d, run
// on one connection; the CPU is that connection's backend's
// (/proc/<pid>/stat) and, on the throwaway server, the whole server's
// (readCPU: autovacuum, the WAL writer and the rest included).
//
// On CockroachDB, form b's index would be a multi-column inverted index
// with the queue first, CREATE INVERTED INDEX … (queue, ids): its docs
// (inverted-indexes, "Multi-column GIN indexes") require the inverted
// column last and a query that constrains every column, which the
// lookups below do (queue = …, ids @> ARRAY[id]); PostgreSQL 15 has no
// btree_gin here, so its GIN index is on ids alone and the queue is a
// filter. Not run on CockroachDB: no server here.

// endedFormQueue and endedReadQueue are the queues the drains and the
// readers' record use.
const (
	endedFormQueue = "endedform"
	endedReadQueue = "endedform-read"
)

// endedForm is one form of the ended record.
type endedForm struct {
	key  string // a, b, c, d
	name string
	// gin: the form is one row per transaction with a GIN index; fastUpdate
	// its fastupdate storage parameter.
	gin, fastUpdate bool
}

var endedForms = []endedForm{
	{key: "a", name: "a: per-item rows (today)"},
	{key: "b", name: "b: per-tx row, GIN fastupdate off", gin: true},
	{key: "c", name: "c: per-tx row, GIN fastupdate on", gin: true, fastUpdate: true},
	{key: "d", name: "d: no record (floor)"},
}

// table is the form's record table for the given suffix (a: the library's
// crdbwork_ended; d: none).
func (f endedForm) table(suffix string) string {
	switch {
	case f.gin:
		return "bench_ended_tx_" + f.key + "_" + suffix
	case f.key == "a":
		return "crdbwork_ended"
	}
	return ""
}

// createTxTable (re)creates a per-transaction record table and its GIN
// index, autovacuum off (the command vacuums where it measures).
func (f endedForm) createTxTable(ctx context.Context, db *pgxpool.Pool, table string) error {
	fast := "off"
	if f.fastUpdate {
		fast = "on"
	}
	_, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+table+`;
CREATE TABLE `+table+` (
    queue       TEXT        NOT NULL,
    ended_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    tx          UUID        NOT NULL DEFAULT gen_random_uuid(),
    outcome     TEXT        NOT NULL,
    ids         UUID[]      NOT NULL,
    attempts    BIGINT[],
    enqueued_at TIMESTAMPTZ[],
    started_at  TIMESTAMPTZ[],
    sessions    UUID[],
    kinds       TEXT[],
    PRIMARY KEY (queue, ended_at, tx)
) WITH (autovacuum_enabled = off);
CREATE INDEX `+table+`_ids ON `+table+` USING GIN (ids) WITH (fastupdate = `+fast+`)`)
	if err != nil {
		return fmt.Errorf("creating %s: %w", table, err)
	}
	return nil
}

// endedAckStatements returns the ack's statement as the library sends it
// in a pipelined ack (a), and its forms b/c (into table) and d.
func endedAckStatement(f endedForm, table string) (string, error) {
	b := store.New(crsql.Tables{}).ItemsAckPipeline([]store.ClaimKey{{}}, nil)
	real := b.QueuedQueries[1].SQL
	start := strings.Index(real, ",\nended AS (")
	if start < 0 {
		return "", errors.New("the ack statement has no ended CTE after gone: its shape changed, update endedform")
	}
	end := closingParen(real, start+len(",\nended AS ("))
	if end < 0 {
		return "", errors.New("the ack statement's ended CTE is not closed")
	}
	cte := real[start : end+1]
	k0, k1 := strings.Index(cte, "WHERE NOT "), strings.Index(cte, "\n    ON CONFLICT")
	if k0 < 0 || k1 < k0 {
		return "", errors.New("the ended CTE has no window check before ON CONFLICT: its shape changed, update endedform")
	}
	keeps := cte[k0:k1] // WHERE NOT <the queue keeps nothing>
	switch {
	case f.key == "a":
		return real, nil
	case f.key == "d":
		return real[:start] + real[end+1:], nil
	case f.gin:
		tx := `,
ended AS (
    INSERT INTO ` + table + ` (queue, ended_at, outcome, ids, attempts, enqueued_at, started_at, sessions, kinds)
    SELECT g.queue, now(), 'acked', array_agg(g.id), array_agg(g.attempts), array_agg(g.enqueued_at),
           array_agg(g.claimed_at), array_agg(g.claim), array_agg(g.kind)
    FROM gone AS g
    ` + keeps + `
    GROUP BY g.queue
    RETURNING 1)`
		return real[:start] + tx + real[end+1:], nil
	}
	return "", fmt.Errorf("form %q", f.key)
}

// closingParen returns the index of the parenthesis that closes the one
// opened just before i in s (-1: none). The statement's text has no
// parentheses in string literals.
func closingParen(s string, i int) int {
	depth := 1
	for ; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// dedupWindowOf is the queue $1's dedup window as the library reads it
// (store's dedupWindow).
const dedupWindowOf = `COALESCE((SELECT dedup_window FROM crdbwork_queues WHERE name = $1), INTERVAL '24 hours')`

// keepWindowOf is the window of a queue's ended records (store's
// keepWindow): the prune's.
const keepWindowOf = `COALESCE((SELECT GREATEST(dedup_window, history_window) FROM crdbwork_queues WHERE name = $1), INTERVAL '24 hours')`

// dedupCheck returns the form's dedup check of an enqueue batch in the
// shape of the insert's (store's postgresDedupCheck: a subplan per row,
// the queue hidden from the planner): $1 queue, $2 ids → how many of them
// the record does not hold within the window (the rows an insert adds).
func (f endedForm) dedupCheck(table string) string {
	probe := `e.queue = (SELECT $1::TEXT) AND e.id = v.id`
	if f.gin {
		probe = `e.ids @> ARRAY[v.id] AND e.queue = (SELECT $1::TEXT)`
	}
	return `SELECT count(*) FROM (SELECT ` + dedupWindowOf + ` AS win) AS n, unnest($2::UUID[]) AS v (id)
WHERE NOT EXISTS (SELECT 1 FROM ` + table + ` AS e WHERE ` + probe + ` AND e.ended_at > now() - n.win OFFSET 0)`
}

// dedupCheckOverlap is the per-transaction form's dedup check in one read
// of the GIN index for the whole batch ($2 ids overlap a row's: &&), the
// rows found unnested into a hashed NOT IN, instead of a subplan per id.
func dedupCheckOverlap(table string) string {
	return `SELECT count(*) FROM unnest($2::UUID[]) AS v (id)
WHERE v.id NOT IN (SELECT x FROM ` + table + ` AS e, unnest(e.ids) AS x
    WHERE e.ids && $2::UUID[] AND e.queue = (SELECT $1::TEXT) AND e.ended_at > now() - ` + dedupWindowOf + `)`
}

// prune returns the per-transaction form's prune (store's pruneEndedSQL in
// that form): up to $2 of queue $1's records older than its window,
// oldest first, skipping those another pruner holds → each pruned row's
// number of ids.
func txPrune(table string) string {
	return `WITH old AS MATERIALIZED (
    SELECT ended_at, tx FROM ` + table + `
    WHERE queue = $1 AND ended_at < now() - ` + keepWindowOf + `
    ORDER BY ended_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM ` + table + ` AS e
WHERE e.queue = $1 AND (e.ended_at, e.tx) IN (SELECT ended_at, tx FROM old) AND e.ended_at < now() - ` + keepWindowOf + `
RETURNING cardinality(e.ids)`
}

// recorded returns how many distinct ids of ids the form's record holds
// for queue, and how many ids it holds for queue in all.
func (f endedForm) recorded(ctx context.Context, db *pgxpool.Pool, table, queue string, ids [][16]byte) (found, all int64, err error) {
	switch {
	case f.key == "d":
		return 0, 0, nil
	case f.gin:
		err = db.QueryRow(ctx, `SELECT (SELECT count(DISTINCT x) FROM `+table+`, unnest(ids) AS x WHERE queue = $1 AND x = ANY($2::UUID[])),
       (SELECT coalesce(sum(cardinality(ids)), 0) FROM `+table+` WHERE queue = $1)`, queue, ids).Scan(&found, &all)
	default:
		err = db.QueryRow(ctx, `SELECT (SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND id = ANY($2::UUID[])),
       (SELECT count(*) FROM crdbwork_ended WHERE queue = $1)`, queue, ids).Scan(&found, &all)
	}
	return found, all, err
}

// notFound runs the form's dedup check over ids in batches of 1,000 and
// returns how many it did not find.
func (f endedForm) notFound(ctx context.Context, db *pgxpool.Pool, table, queue string, ids [][16]byte) (int64, error) {
	var n int64
	for i := 0; i < len(ids); i += 1000 {
		var k int64
		if err := db.QueryRow(ctx, f.dedupCheck(table), queue, ids[i:min(i+1000, len(ids))]).Scan(&k); err != nil {
			return 0, fmt.Errorf("dedup check: %w", err)
		}
		n += k
	}
	return n, nil
}

// endedformCmd is the endedform command.
func endedformCmd(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("endedform", out)
	var c commonFlags
	c.register(fs)
	items := fs.Int("items", 50000, "items acked per drain (0: no drains, the readers only)")
	batchList := fs.String("batches", "64,250", "items per ack transaction, comma-separated")
	rounds := fs.Int("rounds", 3, "rounds; each drains once per form and batch size, the order of the forms rotated every round")
	formList := fs.String("forms", "a,b,c,d", "forms of the ended record, comma-separated: a (today's per-item rows), b (a row per transaction, GIN fastupdate off), c (the same, fastupdate on), d (no record)")
	record := fs.Int("record", 1_000_000, "ended ids in each form's record for the readers' measurement (0: skip the readers)")
	pending := fs.Int("pending", 50_000, "of those, ids inserted last into form c's GIN pending list (it holds them until a cleanup)")
	checkBatch := fs.Int("check-batch", 100, "ids per dedup check (half of them in the record, half new)")
	checks := fs.Int("checks", 200, "dedup checks per form and round")
	prune := fs.Int("prune", 100_000, "expired ids pruned per form (1,000 per prune call), then a VACUUM")
	budget := fs.Duration("check-budget", 20*time.Second, "most time spent on one record's dedup checks in a round (a plan that scans the record per id stops early; its figure is per id checked)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var batches []int
	for _, s := range strings.Split(*batchList, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || b < 1 {
			return fmt.Errorf("--batches: %q is not a positive number", s)
		}
		batches = append(batches, b)
	}
	var forms []endedForm
	for _, s := range strings.Split(*formList, ",") {
		i := slices.IndexFunc(endedForms, func(f endedForm) bool { return f.key == strings.TrimSpace(s) })
		if i < 0 {
			return fmt.Errorf("--forms: unknown form %q (want a, b, c, d)", s)
		}
		forms = append(forms, endedForms[i])
	}
	switch {
	case *items < 0 || *rounds < 1 || (*items == 0 && *record == 0):
		return errors.New("--items must be at least 0, --rounds at least 1, and --items or --record above 0")
	case *record < 0 || *pending < 0 || *checkBatch < 2 || *checks < 1 || *prune < 0 || *budget <= 0 ||
		(*record > 0 && (*pending > *record/2 || *prune > *record/8)):
		return errors.New("--record must be at least 0, --pending at most half of it, --check-batch at least 2, --checks at least 1, --prune at most an eighth of --record (a fifth is expired, and the per-item record is pruned twice), --check-budget positive")
	}
	c.preload = true
	url, setup, done, err := c.crdbworkDatabase(ctx, out)
	if err != nil {
		return err
	}
	defer done()
	stmts := newStatements(ctx, setup)
	e, err := newEndedBench(ctx, url, setup)
	if err != nil {
		return err
	}
	defer e.close(context.WithoutCancel(ctx))

	if *items > 0 {
		fmt.Fprintf(out, "endedform: %d items per drain, ack transactions of %v items, %d rounds, one connection; load %s\n\n", *items, batches, *rounds, loadavg())
		type key struct {
			form  string
			batch int
		}
		results := make(map[key][]drainFigures)
		fmt.Fprintf(out, "| %-36s | %5s | %5s | %14s | %14s | %14s | %13s | %-17s |\n", "form", "batch", "round", "backend µs/it", "server µs/it", "ack stmt µs/it", "flush µs/it", "load")
		fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 38), strings.Repeat("-", 7), strings.Repeat("-", 7), strings.Repeat("-", 16), strings.Repeat("-", 16), strings.Repeat("-", 16), strings.Repeat("-", 15), strings.Repeat("-", 19))
		var reports strings.Builder
		for r := range *rounds {
			order := slices.Clone(forms)
			for range r % len(order) {
				order = append(order[1:], order[0])
			}
			for _, b := range batches {
				for _, f := range order {
					fig, err := e.drain(ctx, f, *items, b, stmts, r == 0 && c.statements, &reports)
					if err != nil {
						return fmt.Errorf("%s, batch %d, round %d: %w", f.name, b, r+1, err)
					}
					results[key{f.key, b}] = append(results[key{f.key, b}], fig)
					flush := "—"
					if f.fastUpdate {
						flush = fmt.Sprintf("%.1f", fig.flush)
					}
					fmt.Fprintf(out, "| %-36s | %5d | %5d | %14.1f | %14.1f | %14.1f | %13s | %-17s |\n", f.name, b, r+1, fig.backend, fig.server, fig.ackExec, flush, loadavg())
				}
			}
		}
		fmt.Fprint(out, reports.String())
		fmt.Fprintf(out, "\nmedians of %d rounds, µs per item acked (backend: the acking connection's CPU, GIN cleanup included; server: the whole server's CPU; ack stmt: its execution time, pg_stat_statements):\n\n", *rounds)
		fmt.Fprintf(out, "| %-36s | %5s | %11s | %11s | %11s | %16s |\n", "form", "batch", "backend", "server", "ack stmt", "backend − floor")
		fmt.Fprintf(out, "|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 38), strings.Repeat("-", 7), strings.Repeat("-", 13), strings.Repeat("-", 13), strings.Repeat("-", 13), strings.Repeat("-", 18))
		for _, b := range batches {
			floor, hasFloor := results[key{"d", b}]
			for _, f := range forms {
				rs := results[key{f.key, b}]
				pick := func(g func(drainFigures) float64) float64 {
					xs := make([]float64, len(rs))
					for i, x := range rs {
						xs[i] = g(x)
					}
					return median(xs)
				}
				above := "—"
				if hasFloor && len(floor) == len(rs) {
					// the median of the same-round differences
					d := make([]float64, len(rs))
					for i := range rs {
						d[i] = rs[i].backend - floor[i].backend
					}
					above = fmt.Sprintf("%.1f", median(d))
				}
				fmt.Fprintf(out, "| %-36s | %5d | %11.1f | %11.1f | %11.1f | %16s |\n", f.name, b,
					pick(func(x drainFigures) float64 { return x.backend }), pick(func(x drainFigures) float64 { return x.server }),
					pick(func(x drainFigures) float64 { return x.ackExec }), above)
			}
		}
	}
	if *record == 0 {
		return nil
	}
	return e.readers(ctx, out, forms, batches, readerSizes{record: *record, pending: *pending, checkBatch: *checkBatch, checks: *checks, prune: *prune, rounds: *rounds, budget: *budget})
}

// endedBench holds what the measurements share: the measured connection
// (one backend), the setup pool and the session the items are claimed by.
type endedBench struct {
	setup   *pgxpool.Pool
	conn    *pgx.Conn
	backend int
	sid     uuid.UUID
	st      *store.Store
	// acked are the ids the last drain acked.
	acked [][16]byte
}

func newEndedBench(ctx context.Context, url string, setup *pgxpool.Pool) (*endedBench, error) {
	e := &endedBench{setup: setup, st: store.New(crsql.Tables{})}
	// A session row of its own, with no heartbeat or reaper running: the
	// items' claims point at it (their foreign key), and nothing else
	// runs on the server while the drains are measured.
	if err := setup.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, name) VALUES (INTERVAL '1 day', 'bench endedform') RETURNING id`).Scan(&e.sid); err != nil {
		return nil, fmt.Errorf("the bench's session: %w", err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "bench-endedform"
	if e.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := e.conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&e.backend); err != nil {
		return nil, err
	}
	if procStat(e.backend) == nil {
		return nil, errors.New("cannot read the backend's /proc/<pid>/stat (is the server on this machine?)")
	}
	return e, nil
}

func (e *endedBench) close(ctx context.Context) {
	e.conn.Close(ctx)
	_, _ = e.setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, endedFormQueue)
	_, _ = e.setup.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, e.sid)
}

// backendCPU is the measured connection's backend's CPU time so far:
// /proc/<pid>/schedstat's time on a CPU, in nanoseconds (the clock ticks
// of /proc/<pid>/stat, 10 ms, are too coarse for the readers' short
// runs), or the ticks where the kernel keeps no schedstat.
func (e *endedBench) backendCPU() (time.Duration, error) {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(e.backend) + "/schedstat"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), nil
			}
		}
	}
	f := procStat(e.backend)
	if f == nil {
		return 0, errors.New("the backend went away")
	}
	return ticks(f, 13, 14), nil
}

// drainFigures are one drain's figures, µs per item acked.
type drainFigures struct {
	backend float64 // the acking backend's CPU, the GIN cleanup included
	server  float64 // the whole server's CPU (0 with --database-url)
	ackExec float64 // the ack statement's execution time (pg_stat_statements)
	flush   float64 // form c: the backend's CPU for the cleanup of the pending list after the drain
}

// drain empties the form's record, seeds n items claimed by the bench's
// session and acks them all in transactions of b items with the form's
// statement on the measured connection, then checks that the form's record
// holds every acked id (and that its dedup check finds each one).
func (e *endedBench) drain(ctx context.Context, f endedForm, n, b int, stmts statements, show bool, report io.Writer) (drainFigures, error) {
	table := f.table("drain")
	// The library's record is emptied of the queue's ids for every form
	// (those of the forms that do not write it must stay empty).
	if _, err := e.setup.Exec(ctx, `DELETE FROM crdbwork_ended WHERE queue = $1`, endedFormQueue); err != nil {
		return drainFigures{}, err
	}
	if _, err := e.setup.Exec(ctx, `VACUUM crdbwork_ended`); err != nil {
		return drainFigures{}, err
	}
	if f.gin {
		if err := f.createTxTable(ctx, e.setup, table); err != nil {
			return drainFigures{}, err
		}
	}
	stmt, err := endedAckStatement(f, table)
	if err != nil {
		return drainFigures{}, err
	}
	if _, err := e.setup.Exec(ctx, `DELETE FROM crdbwork_items WHERE queue = $1`, endedFormQueue); err != nil {
		return drainFigures{}, err
	}
	rows, err := e.setup.Query(ctx, `INSERT INTO crdbwork_items (id, queue, payload, attempts, claim, claimed_at, claim_token, lease_until)
SELECT gen_random_uuid(), $1, '\x'::BYTEA, 1, $2, now(), 7, now() + INTERVAL '1 hour' FROM generate_series(1, $3)
RETURNING id`, endedFormQueue, e.sid, n)
	if err != nil {
		return drainFigures{}, fmt.Errorf("seeding: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return drainFigures{}, fmt.Errorf("seeding: %w", err)
	}
	if err := store.RefreshStats(ctx, e.setup, "crdbwork_items"); err != nil {
		return drainFigures{}, err
	}
	ack := func(part [][16]byte) error {
		keys := make([]store.ClaimKey, len(part))
		for i, id := range part {
			keys[i] = store.ClaimKey{ID: uuid.UUID(id), Session: e.sid, Token: 7}
		}
		batch := e.st.ItemsAckPipeline(keys, nil)
		batch.QueuedQueries[1].SQL = stmt
		br := e.conn.SendBatch(ctx, batch)
		_, err := store.ReadAckPipeline(br, batch)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = store.RollbackPipeline(ctx, e.conn)
			return fmt.Errorf("ack of %d items: %w", len(part), err)
		}
		return nil
	}
	// The first transaction untimed: the statement's preparation is not
	// the record's cost.
	first := min(b, len(ids))
	if err := ack(ids[:first]); err != nil {
		return drainFigures{}, err
	}
	timed := len(ids) - first
	if timed == 0 {
		return drainFigures{}, errors.New("--items must exceed the batch: the first transaction is not timed")
	}
	stmts.reset(ctx, e.setup)
	srv0 := readCPU(postmaster)
	be0, err := e.backendCPU()
	if err != nil {
		return drainFigures{}, err
	}
	for i := first; i < len(ids); i += b {
		if err := ack(ids[i:min(i+b, len(ids))]); err != nil {
			return drainFigures{}, err
		}
	}
	beAcks, err := e.backendCPU()
	if err != nil {
		return drainFigures{}, err
	}
	// Form c's acks left ids in the pending list, which a later insert,
	// vacuum or this function merges into the index: work the acks owe.
	if f.fastUpdate {
		if _, err := e.conn.Exec(ctx, `SELECT gin_clean_pending_list($1::regclass)`, table+"_ids"); err != nil {
			return drainFigures{}, fmt.Errorf("cleaning the pending list: %w", err)
		}
	}
	be1, err := e.backendCPU()
	if err != nil {
		return drainFigures{}, err
	}
	srv := readCPU(postmaster).sub(srv0)
	fig := drainFigures{
		backend: perItem(be1-be0, timed),
		server:  perItem(srv.server, timed),
		flush:   perItem(be1-beAcks, timed),
	}
	if stmts.on {
		var ms float64
		if err := e.setup.QueryRow(ctx, `SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements WHERE query LIKE 'WITH gone AS%'`).Scan(&ms); err != nil {
			return drainFigures{}, err
		}
		fig.ackExec = ms * 1000 / float64(timed)
		if show {
			if err := stmts.print(ctx, report, e.setup, fmt.Sprintf("%s, batch %d", f.name, b), timed, srv.server); err != nil {
				return drainFigures{}, err
			}
		}
	}
	e.acked = ids
	// Every acked id is recorded, once, and the form's dedup check finds it.
	var left int64
	if err := e.setup.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = $1`, endedFormQueue).Scan(&left); err != nil {
		return drainFigures{}, err
	}
	if left != 0 {
		return drainFigures{}, fmt.Errorf("%d of %d items left after the drain", left, len(ids))
	}
	if f.key != "a" {
		var stray int64
		if err := e.setup.QueryRow(ctx, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1`, endedFormQueue).Scan(&stray); err != nil {
			return drainFigures{}, err
		}
		if stray != 0 {
			return drainFigures{}, fmt.Errorf("crdbwork_ended holds %d of the acked ids: this form must not write it", stray)
		}
	}
	if f.key == "d" {
		return fig, nil
	}
	found, all, err := f.recorded(ctx, e.setup, table, endedFormQueue, ids)
	if err != nil {
		return drainFigures{}, err
	}
	if found != int64(len(ids)) || all != int64(len(ids)) {
		return drainFigures{}, fmt.Errorf("the record holds %d of the %d acked ids, %d ids in all", found, len(ids), all)
	}
	missed, err := f.notFound(ctx, e.setup, table, endedFormQueue, ids)
	if err != nil {
		return drainFigures{}, err
	}
	if missed != 0 {
		return drainFigures{}, fmt.Errorf("the dedup check does not find %d of the %d acked ids", missed, len(ids))
	}
	return fig, nil
}
