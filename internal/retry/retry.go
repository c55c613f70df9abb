// Package retry runs statements and transactions again when the database
// reports a serialization failure (SQLSTATE 40001), on CockroachDB and
// PostgreSQL alike, and tells outcomes that are unknown from failures.
//
// An outcome is unknown when the database may or may not have applied the
// work: CockroachDB answered SQLSTATE 40003 ("result is ambiguous") to a
// statement or to COMMIT, or the connection was lost while a statement that
// commits by itself, or a COMMIT, was in flight. Such errors wrap
// ErrOutcomeUnknown and are never retried: running the work again blindly
// could apply it twice, and reporting it as failed would be a lie. A failure
// before anything was sent (the pool could not connect, the context ended
// while waiting for a connection) is a plain failure.
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
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// MaxRetries bounds the retries of one statement or transaction.
const MaxRetries = 30

// ErrOutcomeUnknown marks work whose outcome is unknown: it may or may not
// have been applied (see the package comment). Callers must report it as
// neither done nor failed, and anything they retry after it must be
// idempotent.
var ErrOutcomeUnknown = errors.New("outcome unknown: the database may or may not have applied it")

// ErrCommitUnknown is the former name of ErrOutcomeUnknown (the same value).
var ErrCommitUnknown = ErrOutcomeUnknown

// Ambiguous reports whether err is CockroachDB's "result is ambiguous"
// (SQLSTATE 40003).
func Ambiguous(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40003"
}

// LostInFlight reports whether err says the connection failed after the
// statement (or COMMIT) was sent, before its answer came: its outcome is
// unknown. Errors the server answered, failures to connect, and failures
// that pgconn marks as safe to retry (nothing was sent) are not — except
// pgconn's "conn closed": pgx reports it, marked safe, also when the
// connection broke while it was reading the answer (seen with a COMMIT
// whose answer was lost), so it is taken as lost in flight.
func LostInFlight(err error) bool {
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	switch {
	case err == nil, errors.As(err, &pgErr), errors.As(err, &connectErr):
		return false
	case errors.Is(err, pgconn.ErrConnClosed):
		return true
	case pgconn.SafeToRetry(err):
		return false
	case errors.Is(err, pgx.ErrTxClosed), errors.Is(err, pgx.ErrTxCommitRollback):
		return false
	}
	var netErr net.Error
	var fromConn interface{ SafeToRetry() bool } // pgconn's errors: not safe means sent
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) || errors.As(err, &fromConn)
}

// unknown wraps err as an unknown outcome.
func unknown(err error) error { return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err) }

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
//
// fn is taken to be one statement that commits by itself (or a few, each
// idempotent): if it fails with an unknown outcome (40003, or the connection
// lost in flight; see LostInFlight), Do stops and returns an error wrapping
// ErrOutcomeUnknown.
func Do(ctx context.Context, onRetry func(), fn func(ctx context.Context) error) error {
	return run(ctx, onRetry, func(ctx context.Context) error {
		err := fn(ctx)
		if err != nil && !errors.Is(err, ErrOutcomeUnknown) && (Ambiguous(err) || LostInFlight(err)) {
			return unknown(err)
		}
		return err
	})
}

// run is Do without the classification of unknown outcomes.
func run(ctx context.Context, onRetry func(), fn func(ctx context.Context) error) error {
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
// it is itself retryable). A COMMIT (or statement) answered with 40003, or a
// COMMIT whose connection failed after it was sent, is reported as an error
// wrapping ErrOutcomeUnknown and not retried. A connection lost before
// COMMIT was sent is a plain failure: the transaction did not commit.
func Tx(ctx context.Context, db Beginner, onRetry func(), fn func(ctx context.Context, tx pgx.Tx) error) error {
	return TxWith(ctx, db, pgx.TxOptions{IsoLevel: pgx.Serializable}, onRetry, fn)
}

// TxWith is Tx with the caller's transaction options (an empty IsoLevel
// means the server's default isolation).
func TxWith(ctx context.Context, db Beginner, opts pgx.TxOptions, onRetry func(), fn func(ctx context.Context, tx pgx.Tx) error) error {
	return run(ctx, onRetry, func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return TxError(err)
		}
		if err := tx.Commit(ctx); err != nil {
			return CommitError(fmt.Errorf("commit: %w", err))
		}
		return nil
	})
}

// Run runs fn again while it fails with a retryable error, like Do, but
// leaves the outcome's classification to fn: it is for a transaction whose
// BEGIN and COMMIT fn sends itself (in pipelines with its statements), and
// fn classifies its errors with TxError (before COMMIT was sent) and
// CommitError (COMMIT sent), as TxWith does.
func Run(ctx context.Context, onRetry func(), fn func(ctx context.Context) error) error {
	return run(ctx, onRetry, fn)
}

// TxError classifies the error of a transaction's work before its COMMIT
// was sent: the transaction did not commit, unless the error is
// CockroachDB's 40003, whose outcome is unknown (wrapped in
// ErrOutcomeUnknown). A connection lost here is a plain failure.
func TxError(err error) error {
	if err != nil && Ambiguous(err) && !errors.Is(err, ErrOutcomeUnknown) {
		return unknown(err)
	}
	return err
}

// CommitError classifies the error of a COMMIT, or of a pipeline that ends
// with COMMIT: a server's answer (an error, or a ROLLBACK for the COMMIT:
// pgx.ErrTxCommitRollback) or a COMMIT never sent is a plain failure, the
// transaction did not commit; 40003 or a connection lost after COMMIT was
// sent is an unknown outcome (wrapped in ErrOutcomeUnknown).
func CommitError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrOutcomeUnknown):
		return err
	case Ambiguous(err):
		return unknown(err)
	case errors.As(err, &pgErr), errors.Is(err, pgx.ErrTxCommitRollback),
		pgconn.SafeToRetry(err) && !LostInFlight(err):
		// The server answered, or COMMIT was never sent: the
		// transaction did not commit.
		return err
	default:
		return unknown(err)
	}
}
