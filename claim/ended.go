package claim

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Bounds of the pruning of ended ids (see Queue.PruneEnded).
const (
	// pruneBatch bounds the rows one pruning statement deletes.
	pruneBatch = 1000
	// pruneStatements bounds the statements of one PruneEnded call (so one
	// Reap deletes at most pruneBatch·pruneStatements ended rows).
	pruneStatements = 8
)

// PruneEnded forgets the queue's ended ids older than its dedup window
// (Settings.DedupWindow): enqueues of those ids add new items again. It
// deletes them oldest first, at most 1,000 per statement (each its own
// short transaction) and at most 8,000 per call, and returns how many it
// deleted; a call that returns 8,000 left more behind for the next one.
// Every worker session's reaper calls it through Reap; any process may
// call it at any time (concurrent pruners skip each other's rows).
func (q *Queue) PruneEnded(ctx context.Context) (int, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: pruning the ended ids of %q: %w", q.opts.Queue, err)
	}
	total := 0
	prune := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		return q.store.PruneEnded(ctx, tx, q.opts.Queue, pruneBatch)
	}
	for range pruneStatements {
		n, err := q.reapStep(ctx, prune)
		total += n
		if err != nil {
			return total, fmt.Errorf("claim: pruning the ended ids of %q: %w", q.opts.Queue, err)
		}
		if n < pruneBatch {
			break
		}
	}
	return total, nil
}
