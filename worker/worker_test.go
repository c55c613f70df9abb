package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// fastSession returns the short session intervals of the tests' workers:
// a heartbeat of 100 ms and an expiry of 7 heartbeats on a quiet machine,
// stretched together with the machine's load (one await.Stretch), so that
// heartbeats delayed by a busy scheduler (each gives up after two
// intervals) do not lose the session. A test that derives a duration from
// them (an outage of 3 expiries) calls it once and uses that value.
func fastSession() session.Tuning {
	hb := await.Stretch(100 * time.Millisecond)
	return session.Tuning{Heartbeat: hb, Expiry: 7 * hb}
}

// setup returns a pool on a fresh database of the test with crdbwork's
// schema and the results table of recordHandler: a copy of a template
// built once per test binary (testdb.NewFromTemplate).
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return testdb.NewFromTemplate(t, "worker: crdbwork schema and results", func(ctx context.Context, pool *pgxpool.Pool) error {
		if err := testschema.Apply(ctx, pool); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE results (
			row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
			item_id UUID NOT NULL, session_id UUID NOT NULL, part BIGINT NOT NULL, owned BOOL NOT NULL,
			tx_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
		return err
	})
}

func count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor is await.Until with a budget of d (stretched with the machine's
// load, as every await budget).
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	return await.Until(t, what, cond, await.Within(d))
}

// longSession returns a session that a busy machine does not lose: a
// heartbeat of 100 ms stretched with the machine's load, and an expiry of
// 100 heartbeats.
func longSession() session.Tuning {
	hb := await.Stretch(100 * time.Millisecond)
	return session.Tuning{Heartbeat: hb, Expiry: 100 * hb}
}

// recordHandler records, inside the ack transaction, which session acked the
// item and whether that session owned the item's part at that moment.
func recordHandler(work time.Duration) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if work > 0 {
			select {
			case <-time.After(work):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id, part, owned)
				SELECT $1, $2, $3, EXISTS (SELECT 1 FROM crdbwork_session_parts WHERE session_id = $2 AND queue = $4 AND part = $3)`,
				it.ID, it.Session, int64(it.Part), it.Queue)
			return err
		}, nil
	}
}

type running struct {
	w    *worker.Worker
	stop context.CancelFunc
	done chan error
	once sync.Once
}

// start starts a worker on the default queue of pool (fast sessions unless
// opts set theirs).
func start(t testing.TB, pool *pgxpool.Pool, h worker.Handler, opts worker.Options) *running {
	t.Helper()
	return startOn(t, newQueue(t, pool, claim.Options{}), h, opts)
}

// newQueue returns a queue on pool with opts.
func newQueue(t testing.TB, pool *pgxpool.Pool, opts claim.Options) *claim.Queue {
	t.Helper()
	q, err := claim.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// startOn starts a worker on q (fast sessions unless opts set theirs).
func startOn(t testing.TB, q *claim.Queue, h worker.Handler, opts worker.Options) *running {
	t.Helper()
	if opts.Session.Heartbeat == 0 && opts.Session.Expiry == 0 {
		opts.Session = fastSession()
	}
	w, err := worker.New(q, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Stop shuts the worker down gracefully and waits for Run to return.
func (r *running) Stop(t testing.TB) {
	r.once.Do(func() {
		r.stop()
		if err := await.Recv(t, "the worker to stop", r.done); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func enqueue(t testing.TB, pool *pgxpool.Pool, queue string, n int, keyed bool) {
	t.Helper()
	q, err := claim.New(pool, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i].Payload = []byte(fmt.Sprint(i))
		if keyed {
			items[i].Key = fmt.Sprint("key-", i%997)
		}
	}
	if _, err := q.Enqueue(context.Background(), items...); err != nil {
		t.Fatal(err)
	}
}

func assertExactlyOnce(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	if got := count(t, pool, `SELECT count(*) FROM results`); got != n {
		t.Errorf("%d results, want %d", got, n)
	}
	if d := count(t, pool, `SELECT count(*) FROM (SELECT item_id FROM results GROUP BY item_id HAVING count(*) > 1) AS d`); d != 0 {
		t.Errorf("%d items with duplicate results", d)
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 {
		t.Errorf("%d items left", left)
	}
}

func TestWorkersProcessEveryItemOnce(t *testing.T) {
	t.Parallel()
	type variant struct {
		parts    bool
		ackBatch int
	}
	for _, v := range []variant{{false, 0}, {true, 0}, {false, 1}, {true, 1}} {
		parts := v.parts
		t.Run(fmt.Sprintf("parts=%v/ack-batch=%d", parts, v.ackBatch), func(t *testing.T) {
			t.Parallel()
			const n = 2000
			pool := setup(t)
			ctx := context.Background()
			if parts {
				if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 16); err != nil {
					t.Fatal(err)
				}
			}
			enqueue(t, pool, "default", n, parts)
			nParts := 0
			if parts {
				nParts = 16
			}
			var workers []*running
			for range 3 {
				workers = append(workers, start(t, pool, recordHandler(0), worker.Options{
					Parts: nParts, Concurrency: 8, MaxAckBatch: v.ackBatch, Partition: partition.Tuning{Poll: 200 * time.Millisecond},
				}))
			}
			waitFor(t, "the queue to drain", 2*time.Minute, func() bool {
				return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
			})
			var acked int64
			for _, r := range workers {
				r.Stop(t)
				acked += r.w.Stats().Acked
			}
			assertExactlyOnce(t, pool, n)
			if acked != n {
				t.Errorf("workers reported %d acks, want %d", acked, n)
			}
			if parts {
				if bad := count(t, pool, `SELECT count(*) FROM results WHERE NOT owned`); bad != 0 {
					t.Errorf("%d results recorded by a session that did not own the item's part", bad)
				}
			}
			if s := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); s != 0 {
				t.Errorf("%d sessions left after graceful stops", s)
			}
			// now() is the transaction's time: the distinct values count the
			// ack transactions that wrote results.
			txs := count(t, pool, `SELECT count(DISTINCT tx_at) FROM results`)
			t.Logf("%d items acked in %d transactions", n, txs)
			if v.ackBatch == 0 && txs > n*3/4 {
				t.Errorf("%d ack transactions for %d items: handlers that finish together should share one", txs, n)
			}
		})
	}
}

func TestHandlerFailuresPanicsAndTimeouts(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ids := map[string]uuid.UUID{}
	for _, kind := range []string{"ok", "fail-once", "panic-once", "slow-once", "permanent"} {
		got, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(kind), MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		ids[kind] = got.IDs[0]
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		switch kind := string(it.Payload); {
		case kind == "fail-once" && it.Attempt == 1:
			return nil, errors.New("transient")
		case kind == "panic-once" && it.Attempt == 1:
			panic("boom")
		case kind == "slow-once" && it.Attempt == 1:
			<-ctx.Done() // honours the per-item timeout
			return nil, ctx.Err()
		case kind == "permanent":
			return nil, claim.Permanent(errors.New("cannot ever work"))
		}
		return recordHandler(0)(ctx, it)
	}
	r := startOn(t, newQueue(t, pool, claim.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}), h, worker.Options{
		ItemTimeout: 300 * time.Millisecond})
	waitFor(t, "the queue to drain", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	r.Stop(t)
	for _, kind := range []string{"ok", "fail-once", "panic-once", "slow-once"} {
		if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, ids[kind]); n != 1 {
			t.Errorf("%s: %d results, want 1", kind, n)
		}
	}
	var lastErr string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM crdbwork_dead_items WHERE id = $1`, ids["permanent"]).Scan(&lastErr); err != nil || lastErr != "cannot ever work" {
		t.Errorf("permanent item: dead row (%q, %v)", lastErr, err)
	}
	st := r.w.Stats()
	if st.Panics != 1 || st.Timeouts != 1 || st.Nacked != 3 || st.Dead != 1 || st.Acked != 4 {
		t.Errorf("stats %+v: want 1 panic, 1 timeout, 3 nacks, 1 dead, 4 acks", st)
	}
}

func TestSessionLossCancelsHandlersAndStartsNewSession(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 1, false)
	var calls atomic.Int32
	cancelled := make(chan struct{}, 1)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // the first run waits until its session is lost
			cancelled <- struct{}{}
			return nil, ctx.Err()
		}
		return recordHandler(0)(ctx, it)
	}
	r := start(t, pool, h, worker.Options{RestartDelay: 50 * time.Millisecond})
	waitFor(t, "the handler to start", 30*time.Second, func() bool { return calls.Load() == 1 })
	first := r.w.Stats().Session
	if _, err := pool.Exec(context.Background(), `DELETE FROM crdbwork_sessions WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	await.Recv(t, "the handler's context to be cancelled when its session was lost", cancelled)
	waitFor(t, "the item to be handled by a new session", time.Minute, func() bool {
		return count(t, pool, `SELECT count(*) FROM results`) == 1
	})
	var by string
	if err := pool.QueryRow(context.Background(), `SELECT session_id::TEXT FROM results`).Scan(&by); err != nil {
		t.Fatal(err)
	}
	st := r.w.Stats()
	if by == first || st.Sessions < 2 || st.SessionsLost < 1 {
		t.Fatalf("result by %s (first session %s), stats %+v: want a new session", by, first, st)
	}
}

func TestGracefulShutdownFinishesOrReleases(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	enqueue(t, pool, "default", 4, false)
	var started atomic.Int32
	release := make(chan struct{})
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started.Add(1)
		if string(it.Payload) == "0" || string(it.Payload) == "1" {
			time.Sleep(200 * time.Millisecond) // finishes within the shutdown timeout
			return recordHandler(0)(ctx, it)
		}
		select { // outlives the shutdown timeout: cancelled, then released
		case <-release:
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}
	r := start(t, pool, h, worker.Options{ShutdownTimeout: time.Second, Concurrency: 4})
	waitFor(t, "all four handlers to start", 30*time.Second, func() bool { return started.Load() == 4 })
	r.Stop(t)
	close(release)
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 2 {
		t.Errorf("%d results, want the 2 items that finished within the shutdown timeout", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL AND attempts = 0`); n != 2 {
		t.Errorf("%d released items with no attempt counted, want 2", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Errorf("%d session rows after shutdown, want 0", n)
	}
}

func TestMissingSchemaStopsRun(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	w, err := worker.New(newQueue(t, pool, claim.Options{}), recordHandler(0), worker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Run without schema = %v, want ErrSchemaMissing", err)
	}
}
