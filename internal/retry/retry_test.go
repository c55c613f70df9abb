package retry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Two transactions that lock two rows in opposite orders deadlock for real
// (PostgreSQL aborts one with 40P01 after deadlock_timeout; CockroachDB with
// 40001). Tx runs the victim again, so both commit, each exactly once.
func TestDeadlockedTransactionIsRetried(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (id INT PRIMARY KEY, n INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO counters VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	// Both transactions hold their first row before either asks for its
	// second one — on their first attempt only, or a retry would wait for a
	// transaction that has already committed.
	var firstLocks sync.WaitGroup
	firstLocks.Add(2)
	var retries atomic.Int64
	run := func(first, second int) error {
		attempt := 0
		return retry.Tx(ctx, pool, func() { retries.Add(1) }, func(ctx context.Context, tx pgx.Tx) error {
			attempt++
			if _, err := tx.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = $1`, first); err != nil {
				return err
			}
			if attempt == 1 {
				firstLocks.Done()
				firstLocks.Wait()
			}
			_, err := tx.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE id = $1`, second)
			return err
		})
	}
	errs := make(chan error, 2)
	go func() { errs <- run(1, 2) }()
	go func() { errs <- run(2, 1) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a transaction failed instead of being retried: %v", err)
		}
	}
	if retries.Load() == 0 {
		t.Fatal("no retry: the transactions did not conflict, so the test proves nothing")
	}
	rows, err := pool.Query(ctx, `SELECT n FROM counters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 2 || ns[0] != 2 || ns[1] != 2 {
		t.Fatalf("counters = %v, want [2 2]: each transaction must commit exactly once", ns)
	}
	t.Logf("retries: %d", retries.Load())
}

func TestRetryableCodes(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "23505": false, "57014": false} {
		if got := retry.Retryable(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("Retryable(%s) = %v, want %v", code, got, want)
		}
	}
	if retry.Retryable(errors.New("plain")) {
		t.Error("a plain error is retryable")
	}
}

// Do retries a retryable error until fn succeeds, gives up after MaxRetries,
// and returns any other error at once, unchanged.
func TestDoRetriesOnlyRetryableErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	err := retry.Do(ctx, nil, func(context.Context) error {
		calls++
		if calls < 3 {
			return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Do = %v after %d calls, want nil after 3", err, calls)
	}

	calls = 0
	unique := &pgconn.PgError{Code: "23505"}
	err = retry.Do(ctx, nil, func(context.Context) error { calls++; return unique })
	if calls != 1 || !errors.Is(err, unique) {
		t.Fatalf("Do = %v after %d calls, want the unique violation after 1", err, calls)
	}

	calls = 0
	err = retry.Do(ctx, nil, func(context.Context) error {
		calls++
		return &pgconn.PgError{Code: "40P01"}
	})
	var pgErr *pgconn.PgError
	if calls != retry.MaxRetries+1 || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("Do = %v after %d calls, want the deadlock after %d", err, calls, retry.MaxRetries+1)
	}
}

// CockroachDB's "result is ambiguous" (40003), raised for real by the server
// (PostgreSQL lets a function raise any SQLSTATE): from a statement run by
// Do, and from COMMIT (a deferred constraint trigger fires at COMMIT) in Tx.
// Both are outcome unknown and run exactly once, never retried.
func TestAmbiguousResultIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	if testdb.Kind(t) != "postgres" {
		t.Skip("raises 40003 with PL/pgSQL")
	}
	calls := 0
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		calls++
		_, err := pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'result is ambiguous' USING ERRCODE = '40003'; END $$`)
		return err
	})
	if !errors.Is(err, retry.ErrOutcomeUnknown) || calls != 1 {
		t.Fatalf("Do = %v after %d calls, want ErrOutcomeUnknown after 1", err, calls)
	}

	for _, q := range []string{
		`CREATE TABLE marks (id INT PRIMARY KEY)`,
		`CREATE FUNCTION ambiguous() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'result is ambiguous' USING ERRCODE = '40003'; END $$`,
		`CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON marks DEFERRABLE INITIALLY DEFERRED
		 FOR EACH ROW EXECUTE FUNCTION ambiguous()`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	calls = 0
	err = retry.Tx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		calls++
		_, err := tx.Exec(ctx, `INSERT INTO marks VALUES (1)`)
		return err
	})
	if !errors.Is(err, retry.ErrOutcomeUnknown) || calls != 1 {
		t.Fatalf("Tx = %v after %d runs, want ErrOutcomeUnknown after 1", err, calls)
	}
	// Retryable errors still retry, and plain ones are plain.
	if retry.LostInFlight(&pgconn.PgError{Code: "57P01"}) || !retry.Ambiguous(&pgconn.PgError{Code: "40003"}) {
		t.Fatal("classification of server errors")
	}
}

// A statement whose answer is lost (the connection drops after the server
// got it) is outcome unknown; one that never left (the database refuses
// connections) is a plain failure.
func TestLostConnectionOutcomes(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	p, purl, err := faultproxy.ForURL(url)
	if err != nil {
		t.Skipf("no fault proxy: %v", err)
	}
	defer p.Close()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE marks (id INT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	p.Arm(faultproxy.Rule{Match: faultproxy.Contains("INSERT INTO marks"), Action: faultproxy.DropAnswer})
	calls := 0
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		calls++
		_, err := pool.Exec(ctx, `INSERT INTO marks VALUES (1)`)
		return err
	})
	if !errors.Is(err, retry.ErrOutcomeUnknown) || calls != 1 {
		t.Fatalf("Do with the answer lost = %v after %d calls, want ErrOutcomeUnknown after 1", err, calls)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM marks`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v): the insert did run", n, err)
	}

	p.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: faultproxy.DropAnswer})
	err = retry.Tx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO marks VALUES (2)`)
		return err
	})
	if !errors.Is(err, retry.ErrOutcomeUnknown) {
		t.Fatalf("Tx with the COMMIT answer lost = %v, want ErrOutcomeUnknown", err)
	}

	p.Cut()
	pool.Reset()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = retry.Do(cctx, nil, func(ctx context.Context) error {
		_, err := pool.Exec(ctx, `INSERT INTO marks VALUES (3)`)
		return err
	})
	if err == nil || errors.Is(err, retry.ErrOutcomeUnknown) {
		t.Fatalf("Do with the database unreachable = %v, want a plain failure", err)
	}
	err = retry.Tx(cctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error { return nil })
	if err == nil || errors.Is(err, retry.ErrOutcomeUnknown) {
		t.Fatalf("Tx with the database unreachable = %v, want a plain failure", err)
	}
}
