package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// setup returns a pool on a fresh database holding only a results table: no
// crdbwork schema, which Work must apply itself.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.New(t)
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE results (item_id UUID NOT NULL PRIMARY KEY, greeting TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func count(t *testing.T, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// record writes the item's greeting into results.
func record(it claim.Item) worker.Record {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results (item_id, greeting) VALUES ($1, $2)`, it.ID, "Hello, "+string(it.Payload)+"!")
		return err
	}
}

// work runs Work and fails the test on an error of Work itself.
func work(t *testing.T, pool *pgxpool.Pool, h worker.Handler, item claim.NewItem, opts workertest.Options) workertest.Result {
	t.Helper()
	opts.DB = pool
	return workOn(t, nil, h, item, opts)
}

// workOn runs Work on q (nil: a fresh queue on opts.DB) and fails t on an
// error.
func workOn(t *testing.T, q *claim.Queue, h worker.Handler, item claim.NewItem, opts workertest.Options) workertest.Result {
	t.Helper()
	res, err := workertest.Work(context.Background(), q, h, item, opts)
	if err != nil {
		t.Fatalf("Work: %v", err)
	}
	return res
}

// newQueue returns a queue on pool with opts.
func newQueue(t *testing.T, pool *pgxpool.Pool, opts claim.Options) *claim.Queue {
	t.Helper()
	q, err := claim.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// assertNoSession checks that Work closed its session.
func assertNoSession(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Errorf("%d session rows left behind, want 0", n)
	}
}

func TestAckedRecordCommitsOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	calls := 0
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		calls++
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("the handler's context has no deadline (item timeout)")
		}
		return record(it), nil
	}
	res := work(t, pool, h, claim.NewItem{Payload: []byte("ada"), Key: "k", Priority: 3, Delay: time.Hour}, workertest.Options{})
	if res.Outcome != claim.Acked || res.Err != nil {
		t.Fatalf("outcome %v, err %v; want acked, nil", res.Outcome, res.Err)
	}
	if calls != 1 {
		t.Errorf("handler ran %d times, want 1", calls)
	}
	it := res.Item
	if it.Attempt != 1 || string(it.Payload) != "ada" || it.Key != "k" || it.Priority != 3 ||
		!strings.HasPrefix(it.Queue, "workertest-") || it.Session == uuid.Nil {
		t.Errorf("item %+v: want attempt 1, payload ada, key k, priority 3, a workertest- queue, a session", it)
	}
	if n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1 AND greeting = 'Hello, ada!'`, it.ID); n != 1 {
		t.Errorf("%d results for the item, want exactly 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 1 {
		t.Errorf("%d results in all, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Errorf("%d items left after the ack, want 0", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); n != 0 {
		t.Errorf("%d dead items, want 0", n)
	}
	assertNoSession(t, pool)
}

func TestHandlerErrorRetries(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		// The Record returned beside an error must not run.
		return record(it), errors.New("smtp: 421 try again later")
	}
	// The queue's first backoff is an hour, not the default second: the item
	// must still wait when the test reads it below, however long Work's
	// cleanup takes on a busy machine.
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "retries", BackoffBase: time.Hour, BackoffMax: time.Hour})
	res := workOn(t, q, h, claim.NewItem{Payload: []byte("bob")}, workertest.Options{})
	if res.Outcome != claim.Retried || res.Err == nil || res.Err.Error() != "smtp: 421 try again later" {
		t.Fatalf("outcome %v, err %v; want retried with the handler's error", res.Outcome, res.Err)
	}
	var attempts int
	var lastErr string
	var claimed bool
	var vestsLater bool
	err := pool.QueryRow(context.Background(),
		`SELECT attempts, last_error, claim IS NOT NULL, vesting_at > now() FROM crdbwork_items WHERE id = $1`, res.Item.ID).
		Scan(&attempts, &lastErr, &claimed, &vestsLater)
	if err != nil {
		t.Fatalf("the retried item is not in the items table: %v", err)
	}
	if attempts != 1 || lastErr != "smtp: 421 try again later" || claimed || !vestsLater {
		t.Errorf("item: attempts %d, last error %q, claimed %v, vests later %v; want 1, the handler's error, unclaimed, after a backoff",
			attempts, lastErr, claimed, vestsLater)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Errorf("%d results written by a failed handler, want 0", n)
	}
	assertNoSession(t, pool)
}

// A handler that asks for a retry delay (claim.RetryAfter) is nacked with
// it: the test reads the delay back from Result.Err with claim.RetryDelay,
// and the item vests that late.
func TestRetryAfterSetsTheDelay(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, claim.RetryAfter(time.Hour, errors.New("rate limited"))
	}
	res := work(t, pool, h, claim.NewItem{Payload: []byte("bob")}, workertest.Options{})
	if d, ok := claim.RetryDelay(res.Err); res.Outcome != claim.Retried || !ok || d != time.Hour {
		t.Fatalf("outcome %v, retry delay %v, %v (err %v); want retried after 1h", res.Outcome, d, ok, res.Err)
	}
	var inHour bool
	if err := pool.QueryRow(context.Background(),
		`SELECT vesting_at BETWEEN now() + INTERVAL '59 minutes' AND now() + INTERVAL '61 minutes' FROM crdbwork_items WHERE id = $1`,
		res.Item.ID).Scan(&inHour); err != nil {
		t.Fatalf("the retried item is not in the items table: %v", err)
	}
	if !inHour {
		t.Error("the retried item does not vest in about an hour")
	}
	assertNoSession(t, pool)
}

func TestPermanentErrorIsDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, claim.Permanent(errors.New("invalid address"))
	}
	res := work(t, pool, h, claim.NewItem{Payload: []byte("eve")}, workertest.Options{})
	if res.Outcome != claim.Dead || !claim.IsPermanent(res.Err) {
		t.Fatalf("outcome %v, err %v; want dead with the permanent error", res.Outcome, res.Err)
	}
	q, err := claim.New(pool, claim.Options{Queue: res.Item.Queue})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := deadList(q.DeadItems(context.Background(), claim.DeadQuery{Limit: 10}))
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != res.Item.ID || dead[0].LastError != "invalid address" || dead[0].Attempts != 1 {
		t.Fatalf("dead items %+v: want the item, with its error and 1 attempt", dead)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Errorf("%d items left, want 0", n)
	}
	assertNoSession(t, pool)
}

func TestLastAttemptIsDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return nil, errors.New("still failing")
	}
	q := newQueue(t, pool, claim.Options{Queue: "once", MaxAttempts: 1})
	res := workOn(t, q, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{})
	if res.Outcome != claim.Dead || res.Item.MaxAttempts != 1 {
		t.Fatalf("outcome %v (max attempts %d); want dead after the only attempt", res.Outcome, res.Item.MaxAttempts)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND last_error = 'still failing'`, res.Item.ID); n != 1 {
		t.Errorf("%d dead rows for the item, want 1", n)
	}
}

func TestPanicIsAnError(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		panic("kaboom")
	}
	res := work(t, pool, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{})
	if res.Outcome != claim.Retried || res.Err == nil || !strings.Contains(res.Err.Error(), "handler panic: kaboom") {
		t.Fatalf("outcome %v, err %v; want retried with the panic", res.Outcome, res.Err)
	}
	var lastErr string
	if err := pool.QueryRow(context.Background(), `SELECT last_error FROM crdbwork_items WHERE id = $1`, res.Item.ID).Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(lastErr, "handler panic: kaboom") {
		t.Errorf("last error %q, want the panic", lastErr)
	}
	assertNoSession(t, pool)
}

func TestTimeoutCancelsTheHandler(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var seen error
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		select {
		case <-ctx.Done():
			seen = ctx.Err()
			return nil, ctx.Err()
		case <-time.After(30 * time.Second):
			return record(it), nil
		}
	}
	// (Without the timeout the handler would end after 30 s and ack: seen
	// and the outcome below tell, with no timing asserted.)
	res := work(t, pool, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{ItemTimeout: 200 * time.Millisecond})
	if !errors.Is(seen, context.DeadlineExceeded) {
		t.Errorf("the handler saw %v, want its context's deadline exceeded", seen)
	}
	if res.Outcome != claim.Retried || !errors.Is(res.Err, context.DeadlineExceeded) ||
		!strings.Contains(res.Err.Error(), "timed out after 200ms") {
		t.Fatalf("outcome %v, err %v; want retried with a timeout", res.Outcome, res.Err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Errorf("%d results, want 0", n)
	}
	assertNoSession(t, pool)
}

func TestRecordErrorRetries(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := record(it)(ctx, tx); err != nil {
				return err
			}
			return errors.New("result rejected")
		}, nil
	}
	res := work(t, pool, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{})
	if res.Outcome != claim.Retried || res.Err == nil || !strings.Contains(res.Err.Error(), "result rejected") {
		t.Fatalf("outcome %v, err %v; want retried with the record's error", res.Outcome, res.Err)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 0 {
		t.Errorf("%d results after a failed record, want 0 (rolled back with the ack)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND attempts = 1`, res.Item.ID); n != 1 {
		t.Errorf("the item is not back with one attempt counted")
	}
}

func TestCancelledContextReleasesTheItem(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	h := func(hctx context.Context, it claim.Item) (worker.Record, error) {
		cancel()
		<-hctx.Done()
		return nil, hctx.Err()
	}
	res, err := workertest.Work(ctx, nil, h, claim.NewItem{Payload: []byte("x")}, workertest.Options{DB: pool})
	if err == nil || !errors.Is(err, context.Canceled) || res.Outcome != 0 {
		t.Fatalf("Work = (%v, %v); want an error wrapping context.Canceled and no outcome", res.Outcome, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NULL AND attempts = 0`, res.Item.ID); n != 1 {
		t.Errorf("the item was not released with its attempt uncounted")
	}
	assertNoSession(t, pool)
}

func TestQueueAndTables(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tables := crsql.Tables{Schema: "jobs", Prefix: "wt_"}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) { return record(it), nil }
	q := newQueue(t, pool, claim.Options{Queue: "emails", Tables: tables})
	res := workOn(t, q, h, claim.NewItem{Payload: []byte("ada")}, workertest.Options{})
	if res.Outcome != claim.Acked || res.Item.Queue != "emails" {
		t.Fatalf("outcome %v in queue %q; want acked in emails", res.Outcome, res.Item.Queue)
	}
	if n := count(t, pool, `SELECT count(*) FROM jobs.wt_sessions`); n != 0 {
		t.Errorf("%d sessions left, want 0", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename LIKE 'crdbwork\_%'`); n != 0 {
		t.Errorf("%d tables with the default names, want none", n)
	}

	// Another item waiting in the queue is claimed first: Work refuses, and
	// leaves the queue as it was.
	if _, err := q.Enqueue(context.Background(), claim.NewItem{Payload: []byte("first"), Priority: -1}); err != nil {
		t.Fatal(err)
	}
	if _, err := workertest.Work(context.Background(), q, h, claim.NewItem{Payload: []byte("bob")}, workertest.Options{}); err == nil ||
		!strings.Contains(err.Error(), "holds other items") {
		t.Fatalf("Work on a busy queue: %v, want a refusal", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM jobs.wt_items WHERE claim IS NULL AND attempts = 0 AND payload = 'first'`); n != 1 {
		t.Errorf("the waiting item was not given back untouched")
	}
	if n := count(t, pool, `SELECT count(*) FROM jobs.wt_items`); n != 1 {
		t.Errorf("%d items in the queue, want only the waiting one", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 1 {
		t.Errorf("%d results, want 1", n)
	}
}

// Parallel tests share a database: each call gets its own queue, and the
// first calls race to apply the schema.
func TestConcurrentWork(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) { return record(it), nil }
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := workertest.Work(context.Background(), nil, h, claim.NewItem{Payload: []byte(fmt.Sprint(i))}, workertest.Options{DB: pool})
			if err == nil && res.Outcome != claim.Acked {
				err = fmt.Errorf("outcome %v: %v", res.Outcome, res.Err)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Work %d: %v", i, err)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM results`); got != n {
		t.Errorf("%d results, want %d", got, n)
	}
	assertNoSession(t, pool)
}

func TestBadArguments(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	ctx := context.Background()
	if _, err := workertest.Work(ctx, nil, nil, claim.NewItem{}, workertest.Options{DB: pool}); err == nil {
		t.Error("Work with a nil handler succeeded")
	}
	if _, err := workertest.Work(ctx, nil, h, claim.NewItem{}, workertest.Options{}); err == nil {
		t.Error("Work with neither a queue nor Options.DB succeeded")
	}
	q := newQueue(t, pool, claim.Options{Queue: "small", MaxPayload: 5})
	for _, opts := range []workertest.Options{{DB: pool}, {Tables: crsql.Tables{Prefix: "x_"}}, {Cleanup: t.Cleanup}} {
		if _, err := workertest.Work(ctx, q, h, claim.NewItem{}, opts); err == nil {
			t.Errorf("Work with a queue and Options %+v (for a fresh queue) succeeded", opts)
		}
	}
	if _, err := workertest.Work(ctx, nil, h, claim.NewItem{}, workertest.Options{DB: pool, ItemTimeout: -time.Second}); err == nil {
		t.Error("Work with a negative timeout succeeded")
	}
	if _, err := workertest.Work(ctx, q, h, claim.NewItem{Payload: make([]byte, 10)}, workertest.Options{}); !errors.Is(err, claim.ErrPayloadTooLarge) {
		t.Errorf("Work with a payload too large = %v, want ErrPayloadTooLarge", err)
	}
	assertNoSession(t, pool)
}

// With Cleanup, what Work left in the queue it made is there while the test
// runs and gone when it ends.
func TestCleanupRemovesTheQueuesRows(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var res workertest.Result
	t.Run("work", func(t *testing.T) {
		var err error
		res, err = workertest.Work(context.Background(), nil, func(context.Context, claim.Item) (worker.Record, error) {
			return nil, claim.Permanent(errors.New("gone for good"))
		}, claim.NewItem{Payload: []byte("x")}, workertest.Options{DB: pool, Cleanup: t.Cleanup})
		if err != nil || res.Outcome != claim.Dead {
			t.Fatalf("Work = %v, %v; want dead", res.Outcome, err)
		}
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`, res.Item.Queue); n != 1 {
			t.Fatalf("%d dead items in %s during the test, want 1", n, res.Item.Queue)
		}
	})
	for _, table := range []string{"crdbwork_items", "crdbwork_dead_items"} {
		if n := count(t, pool, `SELECT count(*) FROM `+table+` WHERE queue = $1`, res.Item.Queue); n != 0 {
			t.Errorf("%d rows of %s left in %s after the test", n, res.Item.Queue, table)
		}
	}
}
