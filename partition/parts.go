package partition

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// MaxParts is the largest number of parts a queue may have.
const MaxParts = 4096

// DB is a connection pool: *pgxpool.Pool satisfies it.
type DB interface {
	crsql.DB
	retry.Beginner
}

// Parts returns the number of parts of queue: 1 if it was never set.
func Parts(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) (int, error) {
	var n int64
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return db.QueryRow(ctx, crsql.NewStatements(t).QueueParts, queue).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("partition: reading the number of parts of %q: %w", queue, crsql.Classify(err))
	}
	return int(n), nil
}

// SetParts sets the number of parts of queue to n. It is the one way to
// change it, and it is safe while producers and workers run:
//
//   - items already enqueued keep their part, except those in parts >= n,
//     which move to part % n (so a key's items may, once, be spread over two
//     parts, and their order across that move is not kept);
//   - ownership rows of parts >= n are deleted, which releases their claims
//     (pending acks of those items fail with claim.ErrClaimLost and the items
//     are handled again); rebalancers pick up the new count at their next poll;
//   - enqueues read the count in their own statement, under a share lock,
//     so none can slip an item into a removed part.
//
// Raising n only affects items enqueued afterwards.
func SetParts(ctx context.Context, db DB, t crsql.Tables, queue string, n int) error {
	if n < 1 || n > MaxParts {
		return fmt.Errorf("partition: %d parts for %q: the number of parts must be between 1 and %d", n, queue, MaxParts)
	}
	st := crsql.NewStatements(t)
	// The server's default isolation: READ COMMITTED on PostgreSQL, so that
	// each statement sees the enqueues that committed before the count
	// changed; SERIALIZABLE on CockroachDB.
	err := retry.TxWith(ctx, db, pgx.TxOptions{}, nil, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, st.UpsertQueueParts, queue, int64(n)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, st.DropPartsAbove, queue, int64(n)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, st.MovePartsAbove, queue, int64(n))
		return err
	})
	if err != nil {
		return fmt.Errorf("partition: setting %d parts for %q: %w", n, queue, crsql.Classify(err))
	}
	return nil
}
