package partition

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/wake"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// MaxParts is the largest number of parts a queue may have.
const MaxParts = 4096

// DB is the database partition works on: a *pgxpool.Pool (or a *pgx.Conn)
// satisfies it. It is sql.Pool, the one database type of crdbwork's
// packages: a value of claim.DB, partition.DB or worker.DB is any of them.
type DB = crsql.Pool

// Parts returns the number of parts of queue: 1 if it was never set.
func Parts(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) (int, error) {
	stmts := store.New(t)
	var n int
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		n, err = stmts.PartsCount(ctx, db, queue)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("partition: reading the number of parts of %q: %w", queue, store.Classify(err))
	}
	return n, nil
}

// MoveBatch is the number of rows SetParts reads (and at most moves) per
// statement.
const MoveBatch = 1000

// SetParts sets the number of parts of queue to n. It is the one way to
// change it, and it is safe while producers and workers run:
//
//   - one short transaction stores the new count and deletes the ownership
//     rows of parts >= n, which releases the claims made in those parts
//     (pending acks of those items fail with claim.ErrClaimLost and the
//     items are handled again); rebalancers pick up the new count at their
//     next poll;
//   - enqueues read the count in their own statement or transaction, under a
//     share lock, so none can slip an item into a removed part once that
//     transaction committed;
//   - then the items of parts >= n move to part % n: SetParts walks the
//     items table once in primary-key order, MoveBatch rows per statement
//     (each its own transaction), so that the move never holds more than a
//     batch of rows and does not conflict with every claim and ack at once. A key's items may thus, once, be spread over two parts,
//     and their order across that move is not kept. A moved item keeps an
//     any-part claim (claim.Claimer.Claim without Parts); a claim naming its part
//     (with Parts), made by a session that had not yet seen the new count,
//     is released, and its ack fails with claim.ErrClaimLost.
//
// Once the items have moved, SetParts wakes the queue's idle workers (a
// notification on the queue's channel on PostgreSQL, and this process's
// workers directly), as an enqueue does: the moved items, and the items
// whose claims the deletion released, are in parts that no wake-up named
// (and a worker that had not yet seen the new count mapped the hints of
// items enqueued meanwhile to other parts).
//
// If SetParts fails half-way, some items are still in parts >= n; run it
// again (it is idempotent) to move them. Raising n only affects items
// enqueued afterwards.
func SetParts(ctx context.Context, db DB, t crsql.Tables, queue string, n int) error {
	if n < 1 || n > MaxParts {
		return fmt.Errorf("partition: %d parts for %q: the number of parts must be between 1 and %d", n, queue, MaxParts)
	}
	if err := store.CheckQueueName(queue); err != nil {
		return fmt.Errorf("partition: setting the parts of a queue: %w (claim.MaxQueueNameLength)", err)
	}
	stmts := store.New(t)
	// The server's default isolation: READ COMMITTED on PostgreSQL, so that
	// the upsert waits for the enqueues holding a share lock on the row and
	// does not fail because of them; SERIALIZABLE on CockroachDB.
	err := retry.TxWith(ctx, db, pgx.TxOptions{}, nil, func(ctx context.Context, tx pgx.Tx) error {
		if err := stmts.PartsCountUpsert(ctx, tx, queue, n); err != nil {
			return err
		}
		if _, err := stmts.PartsDropAbove(ctx, tx, queue, n); err != nil {
			return err
		}
		// The rebalancers of the queue's sessions read the new count when
		// their heartbeats see the queue's change marker move.
		return stmts.QueueChangesBump(ctx, tx, queue)
	})
	if err != nil {
		return fmt.Errorf("partition: setting %d parts for %q: %w", n, queue, store.Classify(err))
	}
	if err := moveItems(ctx, db, stmts, queue, n); err != nil {
		return fmt.Errorf("partition: moving the items of %q to %d parts: %w", queue, n, store.Classify(err))
	}
	// A rebalancer that had not yet seen the new count may have taken a
	// removed part again meanwhile.
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		dropped, err := stmts.PartsDropAbove(ctx, db, queue, n)
		if err == nil && dropped > 0 {
			err = stmts.QueueChangesBump(ctx, db, queue)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("partition: setting %d parts for %q: %w", n, queue, store.Classify(err))
	}
	wakeWorkers(ctx, db, stmts, queue)
	return nil
}

// wakeWorkers wakes the idle workers of queue: those of this process at
// once, and on PostgreSQL those of every process by the queue's
// notification. A failure to notify is not SetParts' failure (the parts
// are set and the items moved): the workers' rebalancers read the new
// count within their poll and then claim in every part they own, which
// finds the moved items unless the move was still running.
func wakeWorkers(ctx context.Context, db DB, stmts *store.Store, queue string) {
	channel := stmts.NotifyChannel(queue)
	wake.Signal(channel)
	if d, err := store.DetectDialect(ctx, db); err == nil && d == store.Postgres {
		_ = stmts.Notify(ctx, db, channel, "")
	}
}

// moveItems moves the items of queue in parts >= n to part % n, walking
// the items table once in primary-key order, MoveBatch rows per statement.
// One walk is enough: no item enters a part >= n once the new count is
// committed (enqueues and requeues read it), and the items enqueued before
// that committed before it, so the walk, which starts later, sees them.
func moveItems(ctx context.Context, db DB, stmts *store.Store, queue string, n int) error {
	var after uuid.UUID // the nil UUID: before every id
	for {
		var page store.MovedPage
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			page, err = stmts.PartsMoveItems(ctx, db, queue, n, after, MoveBatch)
			return err
		})
		if err != nil {
			return err
		}
		if page.Done {
			return nil
		}
		after = page.Last
	}
}
