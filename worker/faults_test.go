package worker_test

// The fault suite (issue 9, "Proof"): real faults — the database server
// restarted, connections cut by a proxy at chosen statements, handlers that
// misbehave — under in-process workers. Every case asserts the liveness and
// safety contract:
//
//   - every item ends, within the bound the case states: acked (exactly one
//     result row) or dead-lettered, never both;
//   - no result was written by a session that had lost the claim (the
//     record checks, inside the ack transaction, that its session row still
//     exists: a session that lost it lost its claims with it);
//   - no item stays claimed by a live session past its lease (sampled every
//     100 ms while the case runs).
//
// The processes' side (SIGKILL, SIGSTOP/SIGCONT of `demo work`, a restart
// under worker processes) is in cmd/demo/faults_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Timings of the fault suite on a quiet machine: short, so that each case
// takes seconds. A case reads them stretched with the machine's load, all
// from one reading (faultTimings).
const (
	// faultHeartbeat is the sessions' heartbeat in the cases where
	// connections are cut for less than the expiry, ten heartbeats.
	faultHeartbeat = 150 * time.Millisecond
	// faultLease is the item lease of the cases (the backstop for an item
	// whose worker forgot it).
	faultLease = 3 * time.Second
	// leaseSlack is how long past its lease an item may stay claimed by a
	// live session before the monitor counts it: the reaper's period and a
	// loaded machine's delays.
	leaseSlack = 3 * time.Second
	// cutOutage is how long a cut lasts: well under the sessions' expiry.
	cutOutage = 400 * time.Millisecond
)

// faultTiming is the fault suite's timings as one case uses them.
type faultTiming struct {
	session              session.Tuning
	lease, slack, outage time.Duration
}

// faultTimings returns the fault suite's timings stretched together with
// the machine's load (one await.Stretch): heartbeats delayed by a busy
// machine must not lose sessions, and leases must be extended in time;
// the outage of a cut stays well under the expiry.
func faultTimings() faultTiming {
	hb := await.Stretch(faultHeartbeat)
	f := float64(hb) / float64(faultHeartbeat)
	k := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	return faultTiming{session: session.Tuning{Heartbeat: hb, Expiry: 10 * hb}, lease: k(faultLease), slack: k(leaseSlack), outage: k(cutOutage)}
}

// faultEnv is one fault case: a database with the crdbwork schema, the
// enqueued items, and a monitor of overdue claims.
type faultEnv struct {
	t      *testing.T
	tm     faultTiming   // the case's timings, read once
	url    string        // the database, directly
	direct *pgxpool.Pool // for checks, never through a fault
	ids    map[uuid.UUID]bool

	stopMon  context.CancelFunc
	monDone  chan struct{}
	overdue  atomic.Int64 // most items seen claimed by a live session past lease+slack
	monErrs  atomic.Int64
	monFirst atomic.Value // string: the first overdue sighting
}

// newFaultEnv sets up the results table in the database at dbURL, which
// has crdbwork's schema (testschema.NewURL, or withSchema).
// withSchema applies crdbwork's schema to the database at dbURL (a
// database of a server of the test's own, which has no template) and
// returns dbURL.
func withSchema(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	return dbURL
}

func newFaultEnv(t *testing.T, dbURL string) *faultEnv {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	direct, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	// alive: the acking session's row existed inside the ack transaction.
	if _, err := direct.Exec(ctx, `CREATE TABLE results (
		row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
		item_id UUID NOT NULL, session_id UUID NOT NULL, attempt BIGINT NOT NULL, alive BOOL NOT NULL,
		tx_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	e := &faultEnv{t: t, tm: faultTimings(), url: dbURL, direct: direct, ids: map[uuid.UUID]bool{}}
	e.monFirst.Store("")
	return e
}

// enqueue adds n items (keyed, so that parts mode spreads them) with the
// given payload and max attempts (0: the default).
func (e *faultEnv) enqueue(n int, payload string, maxAttempts int) []uuid.UUID {
	e.t.Helper()
	q, err := claim.New(e.direct, claim.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(payload), Key: fmt.Sprint("k", i), MaxAttempts: maxAttempts}
	}
	var ids []uuid.UUID
	for len(items) > 0 {
		b := items[:min(len(items), 500)]
		items = items[len(b):]
		got, err := q.Enqueue(context.Background(), b...)
		if err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, got.IDs...)
	}
	for _, id := range ids {
		e.ids[id] = true
	}
	return ids
}

// monitor samples, every 100 ms until the case ends, the items claimed by a
// live session whose lease (or, without a lease column, claim time plus
// faultLease) lies more than leaseSlack in the past.
func (e *faultEnv) monitor() {
	ctx, cancel := context.WithCancel(context.Background())
	e.stopMon, e.monDone = cancel, make(chan struct{})
	// Without a lease column (schema v1), the lease is the claim time plus
	// faultLease.
	deadline, grace := "i.claimed_at", e.tm.lease+e.tm.slack
	if hasColumn(e.t, e.direct, "crdbwork_items", "lease_until") {
		deadline, grace = "i.lease_until", e.tm.slack
	}
	q := `SELECT count(*), COALESCE(max(i.id::TEXT), '') FROM crdbwork_items AS i JOIN crdbwork_sessions AS s ON s.id = i.claim
		WHERE ` + deadline + ` + $1::BIGINT * INTERVAL '1 microsecond' < now()`
	args := []any{grace.Microseconds()}
	go func() {
		defer close(e.monDone)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
			var n int64
			var id string
			err := e.direct.QueryRow(qctx, q, args...).Scan(&n, &id)
			qcancel()
			if err != nil {
				e.monErrs.Add(1) // the database may be down: that is the fault
				continue
			}
			if n > e.overdue.Load() {
				e.overdue.Store(n)
				if e.monFirst.Load() == "" {
					e.monFirst.Store(fmt.Sprintf("item %s (and %d more) claimed by a live session past its lease at %v", id, n-1, time.Now().Format("15:04:05.000")))
				}
			}
		}
	}()
	e.t.Cleanup(func() { e.stopMonitor() })
}

func (e *faultEnv) stopMonitor() {
	if e.stopMon != nil {
		e.stopMon()
		<-e.monDone
	}
}

func hasColumn(t testing.TB, db *pgxpool.Pool, table, column string) bool {
	t.Helper()
	var n int
	err := db.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.columns
		WHERE table_name = $1 AND column_name = $2`, table, column).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// record writes the item's result row, noting whether the acking session
// still existed inside the ack transaction.
func record(it claim.Item) worker.Record {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, attempt, alive)
			SELECT $1, $2, $3, EXISTS (SELECT 1 FROM crdbwork_sessions WHERE id = $2)`,
			it.ID, it.Session, int64(it.Attempt))
		return err
	}
}

// work is a handler that works for d (honouring ctx) and records the item.
func work(d time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return record(it), nil
	}
}

// pipelinedWork is work whose result goes to recordStatement (through
// RecordValue) instead of a Record.
func pipelinedWork(d time.Duration) worker.Handler {
	w := work(d)
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if _, err := w(ctx, it); err != nil {
			return nil, err
		}
		return nil, worker.RecordValue(ctx, it)
	}
}

// recordStatement is record for a whole ack transaction, as one statement.
func recordStatement(acked []claim.AckRequest) (string, []any) {
	ids := make([]uuid.UUID, len(acked))
	sessions := make([]uuid.UUID, len(acked))
	attempts := make([]int64, len(acked))
	for i, r := range acked {
		it := r.Value.(claim.Item)
		ids[i], sessions[i], attempts[i] = it.ID, it.Session, int64(it.Attempt)
	}
	return `INSERT INTO results (item_id, session_id, attempt, alive)
		SELECT i, s, a, EXISTS (SELECT 1 FROM crdbwork_sessions WHERE id = s) FROM unnest($1::UUID[], $2::UUID[], $3::BIGINT[]) AS u (i, s, a)`,
		[]any{ids, sessions, attempts}
}

// startWorkers starts n workers, each with its own pool on dbURL (as
// separate processes would have).
func (e *faultEnv) startWorkers(n int, dbURL string, h worker.Handler, opts worker.Options) []*running {
	e.t.Helper()
	return e.startWorkersOn(n, dbURL, claim.Options{}, h, opts)
}

// startWorkersOn is startWorkers on a queue with qopts (fault-test leases
// and backoffs unless qopts set theirs), one per pool.
func (e *faultEnv) startWorkersOn(n int, dbURL string, qopts claim.Options, h worker.Handler, opts worker.Options) []*running {
	e.t.Helper()
	if opts.Session.Heartbeat == 0 && opts.Session.Expiry == 0 {
		opts.Session = e.tm.session
	}
	if opts.RestartDelay == 0 {
		opts.RestartDelay = 100 * time.Millisecond
	}
	if qopts.Lease == 0 {
		qopts.Lease = e.tm.lease
	}
	if qopts.BackoffBase == 0 {
		qopts.BackoffBase, qopts.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	if opts.Partition.Poll == 0 {
		opts.Partition.Poll = 200 * time.Millisecond
	}
	var rs []*running
	for range n {
		cfg, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.MaxConns = int32(max(opts.Concurrency, worker.DefaultConcurrency) + 6)
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(pool.Close)
		rs = append(rs, startOn(e.t, newQueue(e.t, pool, qopts), h, opts))
	}
	return rs
}

// waitProgress waits until at least n results exist.
func (e *faultEnv) waitProgress(n int) {
	e.t.Helper()
	waitFor(e.t, fmt.Sprintf("%d results", n), time.Minute, func() bool {
		return count(e.t, e.direct, `SELECT count(*) FROM results`) >= n
	})
}

// assertEnded waits until no item is left, at most bound (stretched with
// the machine's load, as every await budget) from now, then checks the
// contract for every enqueued item. It returns how long after since (the
// fault's end) the last item ended.
func (e *faultEnv) assertEnded(since time.Time, bound time.Duration) time.Duration {
	e.t.Helper()
	t := e.t
	atFault := -1
	_ = e.direct.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_items`).Scan(&atFault)
	// The items claimed when the fault ended: the ones a fault can strand.
	// The time until the last of them ended is the recovery.
	var held []uuid.UUID
	if rows, err := e.direct.Query(context.Background(), `SELECT id FROM crdbwork_items WHERE claim IS NOT NULL`); err == nil {
		held, _ = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	var recovered time.Duration
	await.Until(t, "every item to end after the fault", func() (bool, string) {
		var left, heldLeft int
		err := e.direct.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE id = ANY($1)) FROM crdbwork_items`, held).Scan(&left, &heldLeft)
		if err == nil && heldLeft == 0 && recovered == 0 {
			recovered = time.Since(since)
		}
		if err == nil && left == 0 {
			return true, ""
		}
		var claimed, live int
		_ = e.direct.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE claim IS NOT NULL),
			count(*) FILTER (WHERE claim IN (SELECT id FROM crdbwork_sessions)) FROM crdbwork_items`).Scan(&claimed, &live)
		return false, fmt.Sprintf("%d items left %v after the fault (%d claimed, %d by a live session; last error %v); monitor: %d overdue claims (%s)",
			left, time.Since(since).Round(time.Millisecond), claimed, live, err, e.overdue.Load(), e.monFirst.Load())
	}, await.Within(bound), await.Every(50*time.Millisecond))
	took := time.Since(since)
	e.stopMonitor()
	e.checkOutcomes()
	t.Logf("every item ended %v after the fault (bound %v; %d items were left when the fault ended); the last of the %d items claimed then ended after %v",
		took.Round(time.Millisecond), bound, atFault, len(held), recovered.Round(time.Millisecond))
	return took
}

// checkOutcomes asserts: each enqueued item has exactly one result or is
// dead (not both), no result was written by a session that had lost its
// row, and the monitor saw no item overdue.
func (e *faultEnv) checkOutcomes() {
	t := e.t
	ctx := context.Background()
	results := map[uuid.UUID]int{}
	rows, err := e.direct.Query(ctx, `SELECT item_id, count(*), count(*) FILTER (WHERE NOT alive) FROM results GROUP BY item_id`)
	if err != nil {
		t.Fatal(err)
	}
	var dups, stale int
	for rows.Next() {
		var id uuid.UUID
		var n, notAlive int
		if err := rows.Scan(&id, &n, &notAlive); err != nil {
			t.Fatal(err)
		}
		results[id] = n
		if n > 1 {
			dups++
		}
		stale += notAlive
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	dead := map[uuid.UUID]bool{}
	drows, err := e.direct.Query(ctx, `SELECT id FROM crdbwork_dead_items`)
	if err != nil {
		t.Fatal(err)
	}
	for drows.Next() {
		var id uuid.UUID
		if err := drows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		dead[id] = true
	}
	var lost, both int
	for id := range e.ids {
		switch {
		case results[id] == 0 && !dead[id]:
			lost++
		case results[id] > 0 && dead[id]:
			both++
		}
	}
	if lost != 0 || dups != 0 || both != 0 || stale != 0 {
		t.Errorf("of %d items: %d lost (no result, not dead), %d with duplicate results, %d both acked and dead, %d results written by a session that had lost its row",
			len(e.ids), lost, dups, both, stale)
	}
	if n := e.overdue.Load(); n != 0 {
		t.Errorf("up to %d items were claimed by a live session more than %v past their lease: %s", n, e.tm.slack, e.monFirst.Load())
	}
}

// deadCount counts the dead items among ids.
func (e *faultEnv) deadCount(ids []uuid.UUID) int {
	return count(e.t, e.direct, `SELECT count(*) FROM crdbwork_dead_items WHERE id = ANY($1)`, ids)
}

// resultCount counts the result rows of ids.
func (e *faultEnv) resultCount(ids []uuid.UUID) int {
	return count(e.t, e.direct, `SELECT count(*) FROM results WHERE item_id = ANY($1)`, ids)
}

// stopAll stops the workers gracefully.
func stopAll(t *testing.T, rs []*running) {
	t.Helper()
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() { defer wg.Done(); r.Stop(t) }()
	}
	wg.Wait()
}

// TestFaultDatabaseRestart restarts the database server under three
// workers (parts mode) in the two ways an operator does: `pg_ctl restart -m
// fast`, and stop, 3 s down, start. The sessions' expiry (5 s) outlives the
// restart, so the sessions survive it: an item whose ack, nack or release
// failed during the restart must still end. Bound: 60 s after the server is
// back.
func TestFaultDatabaseRestart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		down time.Duration // 0: pg_ctl restart -m fast
	}{{"restart-fast", 0}, {"stop-3s-start", 3 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv, dbURL := testdb.NewServer(t)
			e := newFaultEnv(t, withSchema(t, dbURL))
			ctx := context.Background()
			if err := partition.SetParts(ctx, e.direct, crsql.Tables{}, "default", 8); err != nil {
				t.Fatal(err)
			}
			const n = 1500
			e.enqueue(n, "", 0)
			e.monitor()
			// Half the items fail once, so that nacks run during the restart too.
			h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
				if it.Attempt == 1 && it.ID[0]%2 == 0 {
					return nil, errors.New("first attempts of even items fail")
				}
				return work(3*time.Millisecond)(ctx, it)
			}
			rs := e.startWorkers(3, dbURL, h, worker.Options{Parts: 8, Concurrency: 6,
				Session: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 5 * time.Second}})
			// Late in the run, so that the time to the last item is mostly
			// the recovery, not the remaining work.
			e.waitProgress(n * 3 / 5)
			if c.down == 0 {
				if err := srv.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := srv.RestartAfter(ctx, c.down); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			e.assertEnded(back, time.Minute)
			stopAll(t, rs)
		})
	}
}

// Statement matchers for the proxy, on the SQL text with quotes removed.
func stmt(pred func(s string) bool) func(string) bool {
	return func(sql string) bool {
		s := strings.ToLower(strings.Join(strings.Fields(strings.ReplaceAll(sql, `"`, "")), " "))
		return pred(s)
	}
}

var (
	isClaim = stmt(func(s string) bool {
		return strings.Contains(s, "update crdbwork_items") && strings.Contains(s, "skip locked")
	})
	isAck = stmt(func(s string) bool {
		return strings.HasPrefix(s, "delete from crdbwork_items") ||
			(strings.Contains(s, "delete from crdbwork_items") && !strings.Contains(s, "dead_items"))
	})
	isNack = stmt(func(s string) bool {
		return strings.Contains(s, "update crdbwork_items") && strings.Contains(s, "last_error =") && !strings.Contains(s, "skip locked")
	})
	isRelease = stmt(func(s string) bool {
		return strings.Contains(s, "update crdbwork_items") && strings.Contains(s, "claim = null") &&
			!strings.Contains(s, "last_error =") && !strings.Contains(s, "skip locked")
	})
)

// TestFaultConnectionCut cuts the workers' connections, through a proxy,
// for less than the session expiry, at chosen statements: the claim (its
// answer lost: the items are claimed in the database and unknown to the
// worker), the ack, the COMMIT (forwarded, its answer dropped: the outcome
// is unknown to the worker), the nack and the release; and answers COMMITs
// with 40003 after forwarding them or in place of them. Every rule must fire
// (else the case proves nothing), and every item must end within 30 s of the
// last cut.
func TestFaultConnectionCut(t *testing.T) {
	t.Parallel()
	type cut struct {
		match  func(string) bool
		action faultproxy.Action
		times  int
	}
	cases := []struct {
		name string
		cuts []cut
		// failFirst: every item's first attempt fails, so nacks run.
		failFirst bool
		// shutdown: one worker is stopped mid-run with handlers in flight,
		// so releases run.
		shutdown bool
		// pipelined: results are recorded by Options.BatchStatement, so
		// each ack transaction is one pipelined batch (claim.AckOptions.Statement).
		pipelined bool
	}{
		{name: "claim-answer-lost", cuts: []cut{{isClaim, faultproxy.DropAnswer, 3}}},
		{name: "claim-cut", cuts: []cut{{isClaim, faultproxy.DropStatement, 2}}},
		{name: "ack-cut", cuts: []cut{{isAck, faultproxy.DropAnswer, 3}}},
		{name: "commit-answer-lost", cuts: []cut{{faultproxy.IsCommit, faultproxy.DropAnswer, 5}}},
		{name: "nack-cut", failFirst: true, cuts: []cut{{isNack, faultproxy.DropAnswer, 3}, {isNack, faultproxy.DropStatement, 2}}},
		{name: "release-cut", shutdown: true, cuts: []cut{{isRelease, faultproxy.DropStatement, 1}}},
		{name: "pipelined-ack-answer-lost", pipelined: true, cuts: []cut{{isAck, faultproxy.DropAnswer, 3}}},
		{name: "pipelined-ack-cut", pipelined: true, cuts: []cut{{isAck, faultproxy.DropStatement, 2}}},
		{name: "pipelined-commit-answer-lost", pipelined: true, cuts: []cut{{faultproxy.IsCommit, faultproxy.DropAnswer, 5}}},
		// CockroachDB's 40003 ("result is ambiguous") to a COMMIT that
		// committed, and to one that did not: the connection stays.
		{name: "commit-ambiguous-committed", cuts: []cut{{faultproxy.IsCommit, faultproxy.AmbiguousForward, 5}}},
		{name: "commit-ambiguous-rolled-back", cuts: []cut{{faultproxy.IsCommit, faultproxy.AmbiguousDrop, 5}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, testschema.NewURL(t))
			p, proxied, err := faultproxy.ForURL(e.url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			const n = 600
			e.enqueue(n, "", 0)
			e.monitor()
			h := work(5 * time.Millisecond)
			opts := worker.Options{Concurrency: 8, ShutdownTimeout: 100 * time.Millisecond}
			if c.pipelined {
				h, opts.BatchStatement = pipelinedWork(5*time.Millisecond), recordStatement
			}
			var armed atomic.Bool
			if c.failFirst {
				h = func(ctx context.Context, it claim.Item) (worker.Record, error) {
					if it.Attempt == 1 && armed.Load() {
						return nil, errors.New("every first attempt fails once the cuts are armed")
					}
					return work(5*time.Millisecond)(ctx, it)
				}
			}
			// The rules are armed once the workers have their sessions (a
			// worker that cannot start its first session stops: that is
			// not the fault under test), before the first nacks.
			var fired []<-chan struct{}
			want := int64(0)
			rs := e.startWorkers(2, proxied, h, opts)
			waitSessions(t, rs)
			if !c.shutdown {
				for _, k := range c.cuts {
					fired = append(fired, p.Arm(faultproxy.Rule{Match: k.match, Action: k.action, Outage: e.tm.outage, Times: k.times}))
					want += int64(k.times)
				}
				armed.Store(true)
			}
			if c.shutdown {
				// A third worker is stopped while its handlers run: it
				// releases their items, through the cuts.
				// Its handlers take 300 ms, so that it holds items when stopped.
				extra := e.startWorkers(1, proxied, work(300*time.Millisecond), worker.Options{Concurrency: 8, ShutdownTimeout: 100 * time.Millisecond})
				waitSessions(t, extra)
				waitFor(t, "the extra worker to hold items", time.Minute, func() bool { return extra[0].w.Stats().InFlight > 0 })
				for _, k := range c.cuts {
					fired = append(fired, p.Arm(faultproxy.Rule{Match: k.match, Action: k.action, Outage: e.tm.outage, Times: k.times}))
					want += int64(k.times)
				}
				go extra[0].Stop(t)
				rs = append(rs, extra...)
			}
			for i, f := range fired {
				await.Recv(t, fmt.Sprintf("cut %d to fire (the workers to run a matching statement)", i), f)
			}
			// Let the rules that fire more than once do so (a cut can make
			// the next matching statements fail before they reach the proxy):
			// a best-effort wait of at most 10 s, not an assertion.
			for end := time.Now().Add(10 * time.Second); p.Fired() < want && time.Now().Before(end) && e.remaining() > 0; {
				time.Sleep(20 * time.Millisecond)
			}
			p.Disarm()
			lastCut := time.Now()
			e.assertEnded(lastCut, 30*time.Second)
			stopAll(t, rs)
			// Invariant 7: no ack reported that did not commit. An ack
			// reported after an unknown outcome that had not committed
			// would run its item again, and that item's one result would
			// then be reported twice.
			var reported int64
			for _, r := range rs {
				reported += r.w.Stats().Acked
			}
			if results := int64(count(t, e.direct, `SELECT count(*) FROM results`)); reported > results {
				t.Errorf("the workers reported %d acks, and %d results committed", reported, results)
			}
			t.Logf("the proxy fired %d cuts", p.Fired())
		})
	}
}

// waitSessions waits until every worker has started its first session.
func waitSessions(t *testing.T, rs []*running) {
	t.Helper()
	waitFor(t, "the workers' sessions", time.Minute, func() bool {
		for _, r := range rs {
			if r.w.Stats().Sessions == 0 {
				return false
			}
		}
		return true
	})
}

func (e *faultEnv) remaining() int {
	return count(e.t, e.direct, `SELECT count(*) FROM crdbwork_items`)
}

// TestFaultHandlers runs handlers that misbehave. Each kind has its own
// items among normal ones; the bound is stated per kind.
func TestFaultHandlers(t *testing.T) {
	t.Parallel()
	const itemTimeout = 500 * time.Millisecond
	hung := make(chan struct{}) // never closed before the test ends
	t.Cleanup(func() { close(hung) })
	var maxSeen sync.Map // item kind -> highest Attempt a handler saw (int)
	seen := func(kind string, attempt int) {
		for {
			old, loaded := maxSeen.LoadOrStore(kind, attempt)
			if !loaded || old.(int) >= attempt || maxSeen.CompareAndSwap(kind, old, attempt) {
				return
			}
		}
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		kind := string(it.Payload)
		seen(kind, it.Attempt)
		switch kind {
		case "panic-once":
			if it.Attempt == 1 {
				panic("handler panics on the first attempt")
			}
		case "panic-always":
			panic("handler panics on every attempt")
		case "record-panics-once":
			if it.Attempt == 1 {
				return func(context.Context, pgx.Tx) error { panic("record panics on the first attempt") }, nil
			}
		case "record-panics-always":
			return func(context.Context, pgx.Tx) error { panic("record panics on every attempt") }, nil
		case "hang-once":
			if it.Attempt == 1 {
				<-hung // ignores ctx
			}
		case "binary-error-once":
			if it.Attempt == 1 {
				return nil, errors.New("payload \x00\xff\xfe\x80 quoted in the error")
			}
		case "binary-error-always":
			return nil, fmt.Errorf("bad bytes %q then raw \x00\xc3\x28", "x")
		case "permanent":
			return nil, claim.Permanent(errors.New("cannot ever work"))
		case "fail-always":
			return nil, errors.New("fails on every attempt")
		}
		return work(time.Millisecond)(ctx, it)
	}
	const maxAttempts = 3
	cases := []struct {
		kind     string
		wantDead bool
		bound    time.Duration
	}{
		{"panic-once", false, 20 * time.Second},
		{"panic-always", true, 20 * time.Second},
		{"record-panics-once", false, 20 * time.Second},
		{"record-panics-always", true, 20 * time.Second},
		// The hung handler's item comes back when its lease runs out.
		{"hang-once", false, itemTimeout + faultLease + leaseSlack + 20*time.Second},
		{"binary-error-once", false, 20 * time.Second},
		{"binary-error-always", true, 20 * time.Second},
		{"permanent", true, 20 * time.Second},
		{"fail-always", true, 20 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, testschema.NewURL(t))
			normal := e.enqueue(50, "ok", maxAttempts)
			bad := e.enqueue(4, c.kind, maxAttempts)
			e.monitor()
			begin := time.Now()
			rs := e.startWorkers(2, e.url, h, worker.Options{Concurrency: 4, ItemTimeout: itemTimeout, ShutdownTimeout: 200 * time.Millisecond})
			e.assertEnded(begin, c.bound)
			stopAll(t, rs)
			if got := e.resultCount(normal); got != len(normal) {
				t.Errorf("%d results for the %d normal items", got, len(normal))
			}
			if c.wantDead {
				if d := e.deadCount(bad); d != len(bad) {
					t.Errorf("%d of the %d %s items are dead, want all", d, len(bad), c.kind)
				}
				var over int
				if err := e.direct.QueryRow(context.Background(),
					`SELECT count(*) FROM crdbwork_dead_items WHERE id = ANY($1) AND attempts > max_attempts`, bad).Scan(&over); err != nil {
					t.Fatal(err)
				}
				if over != 0 {
					t.Errorf("%d dead items used more than their max attempts", over)
				}
			} else if got := e.resultCount(bad); got != len(bad) {
				t.Errorf("%d results for the %d %s items, want one each", got, len(bad), c.kind)
			}
			if v, ok := maxSeen.Load(c.kind); ok && v.(int) > maxAttempts {
				t.Errorf("a %s handler ran attempt %d, past max attempts %d", c.kind, v.(int), maxAttempts)
			}
			if strings.HasPrefix(c.kind, "binary") && c.wantDead {
				var lastErr string
				if err := e.direct.QueryRow(context.Background(),
					`SELECT last_error FROM crdbwork_dead_items WHERE id = $1`, bad[0]).Scan(&lastErr); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(lastErr, "bad bytes") {
					t.Errorf("dead item's last error %q does not keep the readable part of the handler's error", lastErr)
				}
			}
		})
	}
}
