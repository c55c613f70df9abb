package claim

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Bounds of the pruning of ended ids (see queuemaint.Queue.PruneEnded).
const (
	// pruneBatch bounds the rows one pruning statement deletes.
	pruneBatch = 1000
	// pruneStatements bounds the statements of one prune-ended step (so one
	// Reap deletes at most pruneBatch·pruneStatements ended rows).
	pruneStatements = 8
)

// pruneEndedIDs (queuemaint.queuemaint.Queue.PruneEnded) forgets the queue's ended ids older than both its dedup window
// (Policy.DedupWindow) and its history window (Retention.HistoryWindow;
// an enqueue of an id past its dedup window adds a new item again even
// while its record stays for the history). It
// deletes them oldest first, at most 1,000 per statement (each its own
// short transaction) and at most 8,000 per call, and returns how many it
// deleted; a call that returns 8,000 left more behind for the next one.
// Every worker session's reaper calls it through Reap; any process may
// call it at any time (concurrent pruners skip each other's rows). An
// ended id whose delete the database refuses (a trigger, a foreign key a
// user added) is left, and the others are deleted: the error then joins a
// ReapError with its id (ReapErrors lists them).
func (q *Queue) pruneEndedIDs(ctx context.Context) (int, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: pruning the ended ids of %q: %w", q.opts.Queue, err)
	}
	total, refused, err := q.pruneEnded(ctx)
	if err != nil {
		err = fmt.Errorf("claim: pruning the ended ids of %q: %w", q.opts.Queue, err)
	}
	return total, joinRefused(err, refused)
}

// pruneEnded is pruneEndedIDs once ready: it returns how many ended ids it
// deleted and those the database refused to delete (left, reported; see
// pruneIsolated).
func (q *Queue) pruneEnded(ctx context.Context) (int, []*ReapError, error) {
	s, name := q.store, q.opts.Queue
	total, _, refused, err := q.pruneIsolated(ctx, reapMove{step: StepPruneEnded,
		batch: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return s.EndedPrune(ctx, tx, name, pruneBatch)
		},
		candidates: s.EndedPruneCandidates,
		byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
			return s.EndedPruneIDs(ctx, tx, name, ids)
		}})
	if err != nil {
		return total, refused, err
	}
	if err := q.pruneKeptCancelled(ctx); err != nil {
		return total, refused, err
	}
	return total, refused, q.pruneAttemptErrors(ctx)
}

// pruneAttemptErrors deletes the queue's rows of attempt errors (the
// items' history, schema version 6) whose item is in none of the items,
// waiting, dead and kept cancelled tables and has no ended record within
// the history window, as many as pruneEnded deletes ended ids at most, in
// statements of its own. They are not counted as ended ids.
func (q *Queue) pruneAttemptErrors(ctx context.Context) error {
	for i := 0; i < pruneStatements; i++ {
		var n int64
		err := retry.Tx(ctx, q.db, q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
			var err error
			n, err = q.store.AttemptErrorsPrune(ctx, tx, q.opts.Queue, pruneBatch)
			return store.Classify(err)
		})
		if err != nil {
			return fmt.Errorf("pruning the attempt errors of items gone: %w", err)
		}
		if n < pruneBatch {
			return nil
		}
	}
	return nil
}

// pruneKeptCancelled deletes the queue's cancelled items kept for a
// requeue (RequeueOptions.Cancelled) that are older than its dedup window,
// as many as pruneEnded deletes ended ids at most, in statements of its
// own. They are not counted as ended ids.
func (q *Queue) pruneKeptCancelled(ctx context.Context) error {
	for i := 0; i < pruneStatements; i++ {
		var n int64
		err := retry.Tx(ctx, q.db, q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
			var err error
			n, err = q.store.CancelledPrune(ctx, tx, q.opts.Queue, pruneBatch)
			return store.Classify(err)
		})
		if err != nil {
			return fmt.Errorf("pruning the cancelled items kept for a requeue: %w", err)
		}
		if n < pruneBatch {
			return nil
		}
	}
	return nil
}
