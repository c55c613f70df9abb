package worker_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func TestBadOptionsAreRefused(t *testing.T) {
	t.Parallel()
	pool := testschema.New(t) // worker.New reads nothing: any database
	for _, tc := range []struct {
		opts worker.Options
		want string
	}{
		{worker.Options{Poll: math.MaxInt64}, "Poll 2562047h47m16.854775807s is too long"},
		{worker.Options{ItemTimeout: math.MaxInt64}, "ItemTimeout"},
		{worker.Options{ShutdownTimeout: worker.MaxDuration + 1}, "ShutdownTimeout"},
		{worker.Options{HangGrace: -time.Second}, "HangGrace -1s is negative"},
		{worker.Options{Poll: -time.Second}, "negative"},
		{worker.Options{Concurrency: -1}, "concurrency -1 is negative"},
		{worker.Options{Ackers: 1000}, "Ackers 1000"},
		{worker.Options{Session: session.Tuning{ReapEvery: math.MaxInt64}}, "ReapEvery"},
	} {
		_, err := worker.New(newQueue(t, pool, claim.Options{}), recordHandler(0), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
	// A huge session heartbeat is refused by Run, with the session's error.
	w, err := worker.New(newQueue(t, pool, claim.Options{}), recordHandler(0), worker.Options{Session: session.Tuning{Heartbeat: math.MaxInt64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("Run with a huge heartbeat = %v, want a clear error", err)
	}
}

func TestConnectionCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts       worker.Options
		pool, conn int
	}{
		{worker.Options{}, 5, 7},
		{worker.Options{Parts: 16}, 6, 8},
		{worker.Options{Parts: 16, Concurrency: 1000}, 6, 8},
		{worker.Options{Ackers: 4}, 7, 9},
		{worker.Options{NoWake: true}, 5, 6},
		{worker.Options{Parts: 16, NoWake: true}, 6, 7},
	} {
		if p, c := worker.PoolConns(tc.opts), worker.Connections(tc.opts); p != tc.pool || c != tc.conn {
			t.Errorf("PoolConns, Connections(%+v) = %d, %d; want %d, %d", tc.opts, p, c, tc.pool, tc.conn)
		}
	}
}

// proxied returns a pool to the test database through a proxy that the test
// can cut.
func proxied(t *testing.T, direct *pgxpool.Pool, maxConns int32) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	p, pu, err := faultproxy.ForURL(direct.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg, err := pgxpool.ParseConfig(pu)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// Cancelling Run during a network partition (nothing answers, nothing
// fails): Run still returns, each step of the shutdown bounded by
// ShutdownTimeout.
func TestShutdownIsBoundedDuringAnOutage(t *testing.T) {
	t.Parallel()
	direct := setup(t)
	enqueue(t, direct, "default", 4, false)
	pool, p := proxied(t, direct, 0)
	started := make(chan struct{}, 4)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	w, err := worker.New(newQueue(t, pool, claim.Options{}), h, worker.Options{
		ShutdownTimeout: 300 * time.Millisecond, HangGrace: 100 * time.Millisecond,
		Session: session.Tuning{Heartbeat: time.Second, Expiry: time.Minute}, // the session outlives the test
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-started
	p.Stall() // connections neither fail nor answer
	defer p.Restore()
	cancel()
	cancelled := time.Now()
	// Waiting, cancelling, closing, each bounded by 300 ms.
	if err := await.Recv(t, "Run to return after its context ended while the database was unreachable", done); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("Run returned %v after its context ended", time.Since(cancelled))
}

// A session start stuck on a partitioned database ends when ctx does.
func TestCancelStopsAStuckSessionStart(t *testing.T) {
	t.Parallel()
	direct := setup(t)
	pool, p := proxied(t, direct, 0)
	p.Stall()
	defer p.Restore()
	w, err := worker.New(newQueue(t, pool, claim.Options{}), recordHandler(0), worker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if err := await.Recv(t, "Run to stop trying to start a session after its context ended", done); err != nil {
		t.Fatalf("Run stopped while starting its first session = %v, want nil (a requested stop)", err)
	}
}

// The connections to the database drop while handlers finish: their acks
// fail and are retried until they commit — no result thrown away, no item
// nacked or left claimed, and the session (which survives the short cut)
// not lost.
func TestDatabaseBlipDuringAcksLosesNoResult(t *testing.T) {
	t.Parallel()
	const n = 40
	direct := setup(t)
	enqueue(t, direct, "default", n, false)
	pool, p := proxied(t, direct, 0)
	release := make(chan struct{})
	var started atomic.Int32
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started.Add(1)
		<-release
		return recordHandler(0)(ctx, it)
	}
	r := start(t, pool, h, worker.Options{Concurrency: n,
		Session: session.Tuning{Heartbeat: 200 * time.Millisecond, Expiry: time.Minute}})
	waitFor(t, "every handler to start", time.Minute, func() bool { return started.Load() == n })
	p.Cut()
	close(release) // the handlers finish during the outage
	waitFor(t, "acks to fail and be retried", time.Minute, func() bool { return r.w.Stats().SettleRetries > 0 })
	p.Restore()
	waitFor(t, "every item to be acked", time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	r.Stop(t)
	assertExactlyOnce(t, direct, n)
	st := r.w.Stats()
	if st.Acked != n || st.Nacked != 0 || st.SessionsLost != 0 || st.Unknown != 0 {
		t.Errorf("stats %+v: want %d acks, no nack, no session lost, no unknown outcome", st, n)
	}
	t.Logf("%d settle retries during the outage", st.SettleRetries)
}

// A Record that panics is recovered: the item is nacked with the panic's
// text, counted as a panic, and the next attempt succeeds.
func TestRecordPanicIsNackedAndCounted(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 1, false)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if it.Attempt == 1 {
			return func(context.Context, pgx.Tx) error { panic("record blew up") }, nil
		}
		if !strings.Contains(it.LastError, "record blew up") {
			return nil, claim.Permanent(errors.New("the last error does not name the record's panic: " + it.LastError))
		}
		return recordHandler(0)(ctx, it)
	}
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), h, worker.Options{})
	waitFor(t, "the item to be done", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	r.Stop(t)
	assertExactlyOnce(t, pool, 1)
	if st := r.w.Stats(); st.Panics != 1 || st.Nacked != 1 || st.Acked != 1 {
		t.Errorf("stats %+v: want 1 panic, 1 nack, 1 ack", st)
	}
}

// A handler that ignores its context and never returns does not hold its
// item: after ItemTimeout plus HangGrace the worker stops waiting, nacks the
// item as timed out and frees the slot; the next attempt acks it.
func TestHungHandlerIsAbandoned(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 1, false)
	hang := make(chan struct{})
	defer close(hang)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if it.Attempt == 1 {
			<-hang // ignores ctx
			return nil, errors.New("too late")
		}
		return recordHandler(0)(ctx, it)
	}
	// The timeout and the grace stretch with the machine's load: the
	// handler context's deadline fires on a goroutine of its own, which a
	// loaded machine may run after the supervisor's sweep a grace later
	// (the abandonment is then not counted as a timeout).
	d := await.Stretch(100 * time.Millisecond)
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), h, worker.Options{Concurrency: 1, ItemTimeout: d, HangGrace: d})
	waitFor(t, "the item to be done", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	assertExactlyOnce(t, pool, 1)
	st := r.w.Stats()
	if st.Abandoned != 1 || st.AbandonedRunning != 1 || st.Timeouts != 1 || st.Nacked != 1 {
		t.Errorf("stats %+v: want 1 abandoned (still running), 1 timeout, 1 nack", st)
	}
	r.Stop(t)
}

// Handlers that never return are abandoned, but their goroutines are
// bounded: the worker claims no more than Concurrency + MaxAbandoned
// handlers whose goroutines have not returned.
func TestAbandonedHandlersAreBounded(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 20, false)
	hang := make(chan struct{})
	var calls atomic.Int32
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		calls.Add(1)
		<-hang
		return recordHandler(0)(ctx, it)
	}
	sess := fastSession()
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}), h, worker.Options{Session: sess, Concurrency: 2, MaxAbandoned: 1, Poll: 20 * time.Millisecond,
		ItemTimeout: 50 * time.Millisecond, HangGrace: 50 * time.Millisecond})
	waitFor(t, "three handlers to be abandoned", time.Minute, func() bool { return r.w.Stats().Abandoned == 3 })
	// The abandoned items vest again at once; the worker does not claim them.
	waitFor(t, "the abandoned items to be claimable again", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL AND attempts = 1 AND vesting_at <= now()`) == 3
	})
	claimedBefore := r.w.Stats().Claimed
	// Several more polls pass (each reads the budget); count them by the
	// database's view of the worker's session heartbeats.
	sid := r.w.Stats().Session
	var hb0 time.Time
	if err := pool.QueryRow(context.Background(), `SELECT heartbeat_at FROM crdbwork_sessions WHERE id = $1`, sid).Scan(&hb0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a few heartbeats", time.Minute, func() bool {
		var hb time.Time
		if err := pool.QueryRow(context.Background(), `SELECT heartbeat_at FROM crdbwork_sessions WHERE id = $1`, sid).Scan(&hb); err != nil {
			t.Fatal(err)
		}
		return hb.Sub(hb0) >= 3*sess.Heartbeat
	})
	if c, st := calls.Load(), r.w.Stats(); c != 3 || st.Claimed != claimedBefore || st.AbandonedRunning != 3 {
		t.Fatalf("%d handler calls, stats %+v: want 3 calls (2 + 1 abandoned) and no further claim", c, st)
	}
	close(hang) // the goroutines return: the worker works again
	waitFor(t, "the queue to drain", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	r.Stop(t)
	if st := r.w.Stats(); st.AbandonedRunning != 0 {
		t.Errorf("%d abandoned handlers still counted as running after they returned", st.AbandonedRunning)
	}
}

// 4 workers × 1000 handlers each, every pool capped at PoolConns: every item
// is acked exactly once, and the server never sees more than 4 ×
// Connections connections from them.
func TestConnectionsBoundedWhateverTheConcurrency(t *testing.T) {
	t.Parallel()
	const n, workers, concurrency = 8000, 4, 1000
	direct := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, direct, crsql.Tables{}, "default", 16); err != nil {
		t.Fatal(err)
	}
	enqueue(t, direct, "default", n, true)
	opts := worker.Options{Parts: 16, Concurrency: concurrency, Partition: partition.Tuning{Poll: 200 * time.Millisecond}}
	var rs []*running
	// The workers' connections carry an application name of their own (the
	// listener's and the probe's copy their pool's settings), so that the
	// server's count is of theirs only.
	const app = "crdbwork-bounded-connections"
	for range workers {
		cfg := direct.Config().Copy()
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = int32(worker.PoolConns(opts))
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		rs = append(rs, start(t, pool, recordHandler(time.Millisecond), opts))
	}
	var mu sync.Mutex
	peak := 0
	waitFor(t, "the queue to drain", 5*time.Minute, func() bool {
		c := count(t, direct, connectionsStatement(t), app)
		mu.Lock()
		peak = max(peak, c)
		mu.Unlock()
		return count(t, direct, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	for _, r := range rs {
		r.Stop(t)
	}
	assertExactlyOnce(t, direct, n)
	limit := workers * worker.Connections(opts)
	t.Logf("peak %d connections to the database (limit %d: %d workers × %d)", peak, limit, workers, worker.Connections(opts))
	if peak == 0 || peak > limit {
		t.Errorf("peak %d connections, want at most %d", peak, limit)
	}
}

// Acks that keep every settle goroutine's connection busy (each
// transaction outlasts the session expiry) do not starve the heartbeat: the
// session is not lost.
func TestHeartbeatSurvivesSaturatedAcks(t *testing.T) {
	t.Parallel()
	const n = 200
	direct := setup(t)
	enqueue(t, direct, "default", n, false)
	opts := worker.Options{Concurrency: 64}
	cfg := direct.Config().Copy()
	cfg.MaxConns = int32(worker.PoolConns(opts))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		rec, _ := recordHandler(0)(ctx, it)
		return func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.03)`); err != nil {
				return err
			}
			return rec(ctx, tx)
		}, nil
	}
	// A heartbeat of 100 ms (stretched with the load) and an expiry of 15
	// heartbeats: still shorter than an ack transaction of a full batch
	// (64 records of 30 ms), and room for a machine whose load rises after
	// the stretch was read (beside eight burners and other work, a
	// 7-heartbeat expiry was once missed). The test is about the pool: busy
	// settle connections must not hold up the heartbeat, which has its own.
	// Overload itself is issue 32's (bench) business.
	hb := await.Stretch(100 * time.Millisecond)
	opts.Session = session.Tuning{Heartbeat: hb, Expiry: 15 * hb}
	r := start(t, pool, h, opts)
	waitFor(t, "the queue to drain", 5*time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	r.Stop(t)
	assertExactlyOnce(t, direct, n)
	if st := r.w.Stats(); st.SessionsLost != 0 || st.Sessions != 1 {
		t.Errorf("stats %+v: want one session, never lost", st)
	}
}

// A handler that runs longer than its item's lease keeps the item: the
// worker extends the lease while it runs (here a peer reaps expired leases
// all the time), so the item is claimed once and acked once.
func TestLeaseExtendedWhileHandlerRuns(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 1, false)
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The lease stretches with the machine's load: its extensions must
	// come in time on a busy machine (the peer's reaper releases a lapsed
	// claim at once). An extension is due at half the lease, so a stall
	// of the worker longer than a second (stretched) would lose the
	// claim: that is the lease doing its job, not what this test is about.
	lease := await.Stretch(2 * time.Second)
	var ran atomic.Int32
	var started atomic.Pointer[running]
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		ran.Add(1)
		// The handler runs until its lease was extended three times,
		// well past the lease it was claimed with.
		for r := started.Load(); r == nil || r.w.Stats().LeasesExtended < 3; r = started.Load() {
			select {
			case <-time.After(20 * time.Millisecond): // a poll of the worker's counters, not a wait
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return recordHandler(0)(ctx, it)
	}
	r := startOn(t, newQueue(t, pool, claim.Options{Lease: lease}), h, worker.Options{})
	started.Store(r)
	done := make(chan struct{})
	reaped := make(chan int, 1)
	go func() { // a peer's reaper, as often as it gets
		n := 0
		for {
			select {
			case <-done:
				reaped <- n
				return
			default:
			}
			st, err := queuemaint.For(q).Reap(context.Background())
			if err == nil {
				n += st.Released
			}
			time.Sleep(50 * time.Millisecond) // a peer's reaper period, not a wait
		}
	}()
	waitFor(t, "the item to be acked", time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM results`) == 1 })
	close(done)
	r.Stop(t)
	assertExactlyOnce(t, pool, 1)
	st := r.w.Stats()
	if n := <-reaped; n != 0 || st.Claimed != 1 || ran.Load() != 1 || st.LostClaims != 0 || st.LeasesExtended < 2 {
		t.Errorf("reaped %d, handler ran %d times, stats %+v: want the one claim kept, extended at least twice", n, ran.Load(), st)
	}
}

// Handlers hand their results to a BatchRecord, which writes each ack
// transaction's results in one statement: every item is recorded exactly
// once, in far fewer statements than items; a batch that fails is retried
// item by item, so only the item it cannot record is nacked.
func TestBatchRecordWritesResultsInOneStatement(t *testing.T) {
	t.Parallel()
	const n = 1000
	pool := setup(t)
	enqueue(t, pool, "default", n, false)
	var calls, bad atomic.Int64
	batch := func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		calls.Add(1)
		ids := make([]uuid.UUID, 0, len(acked))
		sessions := make([]uuid.UUID, 0, len(acked))
		for _, r := range acked {
			if r.Value == "refuse" {
				bad.Add(1)
				return errors.New("this result cannot be recorded")
			}
			ids = append(ids, r.Value.(claim.Item).ID)
			sessions = append(sessions, r.Item.Session)
		}
		_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, part, owned)
			SELECT i, s, 0, true FROM unnest($1::UUID[], $2::UUID[]) AS u(i, s)`, ids, sessions)
		return err
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		v := any(it)
		if string(it.Payload) == "7" && it.Attempt == 1 {
			v = "refuse"
		}
		return nil, worker.RecordValue(ctx, v)
	}
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), h, worker.Options{Concurrency: 64, BatchRecord: batch})
	waitFor(t, "the queue to drain", 2*time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	r.Stop(t)
	assertExactlyOnce(t, pool, n)
	st := r.w.Stats()
	txs := count(t, pool, `SELECT count(DISTINCT tx_at) FROM results`)
	t.Logf("%d items recorded in %d transactions, %d batch calls", n, txs, calls.Load())
	if st.Acked != n || st.Nacked != 1 || bad.Load() < 1 {
		t.Errorf("stats %+v, refused batches %d: want %d acks and the one refused item nacked once", st, bad.Load(), n)
	}
	if txs > n/2 {
		t.Errorf("%d ack transactions for %d items: results should be written a batch at a time", txs, n)
	}
	if err := worker.RecordValue(context.Background(), 1); err == nil {
		t.Error("RecordValue outside a handler accepted")
	}
}

// Handlers hand their results to a BatchStatement: each ack transaction
// goes to PostgreSQL as one pipelined batch. Every item is recorded exactly
// once; a statement that fails (a result row that exists already) rolls its
// transaction back and the items are acked again one by one, so only the
// item it cannot record is nacked, and recorded at its next attempt.
func TestBatchStatementRecordsExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 1000
	pool := setup(t)
	enqueue(t, pool, "default", n, false)
	var calls atomic.Int64
	stmt := func(acked []claim.AckRequest) (string, []any) {
		calls.Add(1)
		ids := make([]uuid.UUID, len(acked))
		sessions := make([]uuid.UUID, len(acked))
		for i, r := range acked {
			ids[i], sessions[i] = r.Value.(claim.Item).ID, r.Item.Session
		}
		// The item with payload 7 is refused at its first attempt: its
		// row conflicts with the one planted below, until it is removed.
		return `INSERT INTO results (item_id, session_id, part, owned)
			SELECT i, s, 0, true FROM unnest($1::UUID[], $2::UUID[]) AS u(i, s)`, []any{ids, sessions}
	}
	if _, err := pool.Exec(context.Background(), `CREATE UNIQUE INDEX results_once ON results (item_id)`); err != nil {
		t.Fatal(err)
	}
	var planted uuid.UUID
	if err := pool.QueryRow(context.Background(), `INSERT INTO results (item_id, session_id, part, owned)
		SELECT id, gen_random_uuid(), -1, false FROM crdbwork_items WHERE payload = '7' RETURNING item_id`).Scan(&planted); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if it.ID == planted && it.Attempt > 1 {
			if _, err := pool.Exec(ctx, `DELETE FROM results WHERE item_id = $1 AND part = -1`, it.ID); err != nil {
				return nil, err
			}
		}
		return nil, worker.RecordValue(ctx, it)
	}
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}), h, worker.Options{Concurrency: 64, BatchStatement: stmt})
	waitFor(t, "the queue to drain", 2*time.Minute, func() bool { return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 })
	r.Stop(t)
	assertExactlyOnce(t, pool, n)
	st := r.w.Stats()
	txs := count(t, pool, `SELECT count(DISTINCT tx_at) FROM results`)
	t.Logf("%d items recorded in %d transactions, %d statement calls", n, txs, calls.Load())
	if st.Acked != n || st.Nacked != 1 {
		t.Errorf("stats %+v: want %d acks and the one refused item nacked once", st, n)
	}
	if txs > n/2 {
		t.Errorf("%d ack transactions for %d items: results should be written a batch at a time", txs, n)
	}
}

// A database that cannot be reached when Run starts (here: a proxy that
// refuses connections) is retried within StartTimeout; once it is back the
// worker works. Past StartTimeout, Run returns the error.
func TestFirstStartWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	direct := setup(t)
	enqueue(t, direct, "default", 1, false)
	pool, p := proxied(t, direct, 0)
	p.Cut()
	core, logs := observer.New(zap.WarnLevel)
	r := start(t, pool, recordHandler(0), worker.Options{RestartDelay: 50 * time.Millisecond, StartTimeout: time.Minute, Logger: zap.New(core)})
	waitFor(t, "a failed start to be retried", time.Minute, func() bool {
		return logs.FilterMessageSnippet("retrying").Len() > 0
	})
	p.Restore()
	waitFor(t, "the item to be done", time.Minute, func() bool { return count(t, direct, `SELECT count(*) FROM results`) == 1 })
	r.Stop(t)

	p.Cut()
	w, err := worker.New(newQueue(t, pool, claim.Options{}), recordHandler(0), worker.Options{RestartDelay: 50 * time.Millisecond, StartTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	if err := await.Recv(t, "Run to give up past its StartTimeout", done); err == nil {
		t.Fatal("Run returned nil without ever reaching the database")
	}
}

// connectionsStatement counts the server's connections whose application
// name is $1: PostgreSQL's pg_stat_activity (of this database), or
// CockroachDB's SHOW CLUSTER SESSIONS (its pg_stat_activity is an empty
// table kept for compatibility, cockroachdb/docs#18264; "SHOW SESSIONS"
// lists the open sessions with their application_name and status).
func connectionsStatement(t *testing.T) string {
	if testdb.Kind(t) == "postgres" {
		return `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`
	}
	return `SELECT count(*) FROM [SHOW CLUSTER SESSIONS] WHERE application_name = $1 AND upper(status) <> 'CLOSED'`
}
