// Package retry runs statements and transactions again when the database
// reports a serialization failure (SQLSTATE 40001), on CockroachDB and
// PostgreSQL alike.
//
// Transactions are retried whole: begin, run the caller's function, commit,
// and check the commit's error. This is deliberately not
// crdbpgxv5.ExecuteTx, whose savepoint protocol ignores the commit's error and
// so, on PostgreSQL, can report success for a transaction that never
// committed. The retry loop itself is cockroach-go's crdb.ExecuteCtx.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxRetries bounds the retries of one statement or transaction.
const MaxRetries = 30

// ErrCommitUnknown marks a commit whose outcome is unknown: the connection
// failed while COMMIT was in flight, so the transaction may or may not have
// committed. Callers must not report such a transaction as committed.
var ErrCommitUnknown = errors.New("transaction outcome unknown: the connection failed during COMMIT")

// Beginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Retryable reports whether err is a serialization failure (40001) or a
// deadlock (PostgreSQL's 40P01) that a retry of the whole statement or
// transaction may resolve.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// deadlock carries a PostgreSQL deadlock error (40P01) through
// crdb.ExecuteCtx, which retries only SQLSTATE 40001: PostgreSQL aborts one
// transaction of a deadlock and, like a serialization failure, the
// transaction succeeds when run again. (CockroachDB reports its deadlocks as
// 40001 already.) The original error stays reachable through Unwrap.
type deadlock struct{ err error }

func (d deadlock) Error() string    { return d.err.Error() }
func (d deadlock) Unwrap() error    { return d.err }
func (d deadlock) SQLState() string { return "40001" }

// asRetryable makes a deadlock error retryable for crdb.ExecuteCtx.
func asRetryable(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
		return deadlock{err}
	}
	return err
}

// pause sleeps before retry number n (1-based) with jittered exponential
// growth, so that two conflicting transactions do not collide again at once.
func pause(ctx context.Context, n int) error {
	d := time.Millisecond << min(n-1, 7) // 1ms .. 128ms
	d = d/2 + rand.N(d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do runs fn, running it again while it fails with a retryable error (see
// Retryable), at most MaxRetries times. onRetry, if not nil, is called before
// each retry.
func Do(ctx context.Context, onRetry func(), fn func(ctx context.Context) error) error {
	attempt := 0
	err := crdb.ExecuteCtx(crdb.WithMaxRetries(ctx, MaxRetries), func(ctx context.Context, _ ...any) error {
		attempt++
		if attempt > 1 {
			if onRetry != nil {
				onRetry()
			}
			if err := pause(ctx, attempt-1); err != nil {
				return err
			}
		}
		return asRetryable(fn(ctx))
	})
	if d, ok := err.(deadlock); ok {
		return d.err // returned as it came (ctx ended before a retry)
	}
	return err
}

// Tx runs fn in a SERIALIZABLE transaction and commits it, retrying the whole
// transaction while it fails with a retryable error (including at COMMIT).
// It returns nil only if COMMIT succeeded. If fn returns an error, the
// transaction is rolled back and that error is returned (retried only when
// it is itself retryable). A commit that failed without a server response is
// reported as an error wrapping ErrCommitUnknown.
func Tx(ctx context.Context, db Beginner, onRetry func(), fn func(ctx context.Context, tx pgx.Tx) error) error {
	return TxWith(ctx, db, pgx.TxOptions{IsoLevel: pgx.Serializable}, onRetry, fn)
}

// TxWith is Tx with the caller's transaction options (an empty IsoLevel
// means the server's default isolation).
func TxWith(ctx context.Context, db Beginner, opts pgx.TxOptions, onRetry func(), fn func(ctx context.Context, tx pgx.Tx) error) error {
	return Do(ctx, onRetry, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr), errors.Is(err, pgx.ErrTxCommitRollback):
				// The server answered: the transaction did not commit.
				return fmt.Errorf("commit: %w", err)
			default:
				return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
			}
		}
		return nil
	})
}
