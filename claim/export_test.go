package claim

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// What the external tests of this package reach of its unexported parts.

// CrashLoopError is the last error Reap gives an item it moves to the dead
// items as a crash loop.
const CrashLoopError = crashLoopError

// SafeText is safeText, the cleaning of a stored error text.
func SafeText(s string) string { return safeText(s) }

// Backoff is backoff, the delay before attempt+1 of a failed item.
func (q *Queue) Backoff(attempt int) time.Duration { return q.backoff(attempt) }

// AckBatch is ackBatch, the ack of a batch with one record function.
func (q *Queue) AckBatch(ctx context.Context, items []Item, record func(ctx context.Context, tx pgx.Tx, acked []Item) error) ([]Item, error) {
	return q.ackBatch(ctx, items, record)
}

// SetDeadCountCheckEvery sets how often a Queue may read its queue's newest
// dead items for the count bound, and returns a function that restores it.
func SetDeadCountCheckEvery(d time.Duration) (restore func()) {
	old := deadCountCheckEvery
	deadCountCheckEvery = d
	return func() { deadCountCheckEvery = old }
}

// DeadCountChecks returns how many exact checks of the count bound q made.
func (q *Queue) DeadCountChecks() int64 {
	q.deadCount.mu.Lock()
	defer q.deadCount.mu.Unlock()
	return q.deadCount.exact
}
