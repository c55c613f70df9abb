package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crashLoopError is the last error of an item that Reap moved to the dead
// items because its attempts were used up without an ack or a nack.
const crashLoopError = "attempts used up without an ack or nack: the handler or the process died on every attempt"

// reapBatch bounds the rows one statement of Reap releases or moves.
const reapBatch = 1000

// extend is Claimer.Extend without the check of the items' session (see
// its documentation).
func (q *Queue) extend(ctx context.Context, items []Item, d time.Duration) ([]Item, error) {
	if d < time.Millisecond || d > maxLease {
		return nil, fmt.Errorf("claim: extending leases in %q: duration %v must be between 1ms and %v", q.opts.Queue, d, maxLease)
	}
	if len(items) == 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: extending leases in %q: %w", q.opts.Queue, err)
	}
	keys := claimKeys(items)
	var until map[uuid.UUID]time.Time
	err := retry.Do(ctx, q.stats.retried("extend"), func(ctx context.Context) error {
		var err error
		until, err = q.store.ItemsExtend(ctx, q.db, q.engine.Load().dialect, keys, d)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim: extending the leases of %d items in %q: %w", len(items), q.opts.Queue, err)
	}
	var out []Item
	for _, it := range items {
		if t, ok := until[it.ID]; ok {
			it.LeaseUntil = t
			out = append(out, it)
			delete(until, it.ID)
		}
	}
	q.stats.lost.Add(int64(len(items) - len(out)))
	return out, nil
}

// ReapStats says what one reap of a queue did: every worker session reaps
// its queue every few heartbeats (worker.Testing.AfterQueueReap reports
// each), and its maintenance is not part of Queue's API.
type ReapStats struct {
	// Released counts items whose lease had expired, released with their
	// attempt counted: they are claimable again.
	Released int
	// Dead counts unclaimed items whose attempts were used up, moved to the
	// dead items with reason "crash loop" (ReasonCrashLoop); their last
	// error says that the attempts were used up without an ack or a nack.
	Dead int
	// Expired counts unclaimed items past their deadline (NewItem.TTL),
	// moved to the dead items with reason "expired".
	Expired int
	// Refused counts items (and waiting items) that the database refused
	// to release or move even alone, for something about the item (a
	// row written past the schema's bounds, a constraint, a trigger),
	// and that were ended instead: moved to the dead items with reason
	// ReasonRefused, the database's error in their last error. Each is in
	// Reap's error as a ReapError with its id and Ended set.
	Refused int
	// Stuck counts items that a step could not release or move even
	// alone, nor end as refused (the database refused their move to the
	// dead items too), and ended ids and dead items whose delete by the
	// pruning steps the database refused: each is in Reap's error as a
	// ReapError with its id, and stays as it is (an unclaimed item never
	// handed out) until a later Reap can do it; every other row was reaped
	// without it.
	Stuck int
	// Pruned counts ended ids forgotten because they ended before the
	// queue's dedup window (the reap's prune-ended step).
	Pruned int
	// DeadPruned counts dead items deleted under the queue's retention
	// (the reap's prune-dead step).
	DeadPruned int
	// Cancelled counts items whose cancel was asked for while they ran,
	// ended as cancelled because their handler's session was gone (the
	// claim released) or their lease had run out (see CancelItem).
	Cancelled int

	// Unblocked counts waiting items (NewItem.After) released because
	// their last prerequisite was acked by an ack that did not release
	// them itself (an older worker's, or one whose release failed or
	// never ran: its process died); DependencyDead counts waiting
	// items ended, dead with reason "dependency died: <id>", because a
	// prerequisite ended without an ack (docs/dependencies.md).
	Unblocked, DependencyDead int
}

// reapQueue (queuemaint.Queue.Reap) ends the queue's cancelled items that no handler will end (see
// CancelItem), releases the queue's items whose lease expired, whoever claimed them
// (a hung handler, a claim whose answer was lost, a process that forgot an
// item), and moves its unclaimed items whose attempts are used up to the
// dead items with reason "crash loop", and its unclaimed items past their
// deadline with reason "expired". It works in bounded
// batches until nothing is left, and then forgets, in bounded batches, the
// ended ids older than the queue's dedup window (the prune-ended step) and deletes
// the dead items beyond the queue's retention (the prune-dead step). Any session
// may run it at any time; it is
// idempotent, and acks of reaped claims are refused (ErrClaimLost: the token
// fences them).
//
// No failure stops the rest of the work. Every step runs whatever the
// others did: a step that fails (the database, a connection) leaves its
// remaining batches for the next Reap, and the other steps go on. A batch
// that the database refuses for something about one of its items (an
// integrity constraint, a trigger, a row over a size limit: see
// ErrDeadLetterFailed) is done again by id, the list split in halves until
// each refused item fails alone: every other item is released or moved, and
// each refused one is ended, dead with reason ReasonRefused (counted in
// ReapStats.Refused), or, if its move to the dead items is refused too,
// stays as it is (counted in ReapStats.Stuck). The dependency step isolates
// refused waiting items in the same way. The error joins
// (errors.Join) one ReapError per failed step and per stuck item, with its
// id; ReapErrors lists them. The stats count what was done, failures or not.
func (q *Queue) reapQueue(ctx context.Context) (ReapStats, error) {
	var st ReapStats
	if err := q.ready(ctx); err != nil {
		return st, fmt.Errorf("claim: reaping %q: %w", q.opts.Queue, err)
	}
	var errs []error
	// Cancelled items first: a cancelled item whose lease ran out ends
	// here rather than being released by the lease step.
	n, stuck, err := q.reapCancelled(ctx)
	st.Cancelled = n
	for _, e := range stuck {
		errs = append(errs, e)
		if e.Ended {
			st.Refused++
		} else {
			st.Stuck++
		}
	}
	if err != nil {
		errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: StepCancelled, Err: err})
	}
	s, name, d := q.store, q.opts.Queue, q.engine.Load().dialect
	moves := []reapMove{
		{step: StepLeases, count: &st.Released,
			batch: func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return s.ItemsReapLeases(ctx, tx, d, name, reapBatch)
			},
			candidates: s.ItemsReapLeasesCandidates,
			byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
				return s.ItemsReapLeasesIDs(ctx, tx, name, ids)
			}},
		{step: StepExhausted, count: &st.Dead,
			batch: func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return s.ItemsReapExhausted(ctx, tx, name, reapBatch, crashLoopError)
			},
			candidates: s.ItemsReapExhaustedCandidates,
			byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
				return s.ItemsReapExhaustedIDs(ctx, tx, name, ids, crashLoopError)
			}},
		{step: StepExpired, count: &st.Expired,
			batch: func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return s.ItemsReapExpired(ctx, tx, name, reapBatch)
			},
			candidates: s.ItemsReapExpiredCandidates,
			byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
				return s.ItemsReapExpiredIDs(ctx, tx, name, ids)
			}},
	}
	for _, m := range moves {
		if ctx.Err() != nil {
			errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: m.step, Err: ctx.Err()})
			continue
		}
		stuck, err := q.reapMoves(ctx, m)
		for _, e := range stuck {
			errs = append(errs, e)
			if e.Ended {
				st.Refused++
			} else {
				st.Stuck++
			}
		}
		if err != nil {
			errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: m.step, Err: err})
		}
	}
	q.stats.reaped.Add(int64(st.Released))
	q.stats.dead.Add(int64(st.Dead + st.Expired))
	// A step of its own: the ended ids past the dedup window.
	n, refusedRows, err := q.pruneEnded(ctx)
	st.Pruned = n
	for _, e := range refusedRows {
		errs = append(errs, e)
		st.Stuck++
	}
	if err != nil {
		errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: StepPruneEnded, Err: err})
	}
	// And the dead items beyond the queue's retention.
	n, refusedRows, err = q.pruneDead(ctx)
	st.DeadPruned = n
	for _, e := range refusedRows {
		errs = append(errs, e)
		st.Stuck++
	}
	if err != nil {
		errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: StepPruneDead, Err: err})
	}
	// A step of its own: the waiting items whose prerequisites ended.
	var refused []*ReapError
	st.Unblocked, st.DependencyDead, refused, err = q.sweepDeps(ctx)
	for _, e := range refused {
		errs = append(errs, e)
		if e.Ended {
			st.Refused++
		} else {
			st.Stuck++
		}
	}
	if err != nil {
		errs = append(errs, &ReapError{Queue: q.opts.Queue, Step: StepDependencies, Err: err})
	}
	return st, errors.Join(errs...)
}

// prunesDue (queuemaint.Queue.PrunesDue) reports whether the steps of
// reapQueue that the queue's reap turn's test of work leaves out may have
// anything to do (store.Store.ReapsPrunesDue).
func (q *Queue) prunesDue(ctx context.Context) (bool, error) {
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: testing whether %q has anything to prune: %w", q.opts.Queue, err)
	}
	var due bool
	err := retry.Do(ctx, q.stats.retried("reap"), func(ctx context.Context) error {
		var err error
		due, err = q.store.ReapsPrunesDue(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: testing whether %q has anything to prune: %w", q.opts.Queue, err)
	}
	return due, nil
}

// reapMove is a step of Reap, which releases items or moves them to the dead
// items: its batch (up to reapBatch items of the queue), the read that lists
// the batch's candidates (queue, limit → ids), the by-id form of the batch,
// and the count it adds to.
type reapMove struct {
	step       string
	batch      func(ctx context.Context, tx pgx.Tx) (int64, error)
	candidates func(ctx context.Context, db crsql.DB, queue string, limit int) ([]uuid.UUID, error)
	byID       func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error)
	count      *int
}

// reapMoves runs a step in bounded batches until nothing is left. A
// batch refused for something about one of its items (itemFault) is done
// again by id (moveByID); the items that fail alone are returned, once each,
// and the step goes on while it moves something. Any other failure ends the
// step.
func (q *Queue) reapMoves(ctx context.Context, m reapMove) ([]*ReapError, error) {
	var stuck []*ReapError
	seen := map[uuid.UUID]bool{}
	for {
		n, err := q.reapStep(ctx, m.batch)
		*m.count += n
		if err == nil {
			if n < reapBatch {
				return stuck, nil
			}
			continue
		}
		if !itemFault(err) {
			return stuck, err
		}
		ids, err := q.reapCandidates(ctx, m.candidates)
		if err != nil {
			return stuck, err
		}
		moved, bad, err := q.moveByID(ctx, m, ids)
		*m.count += moved
		for _, b := range bad {
			if !seen[b.ID] {
				seen[b.ID] = true
				// Refused alone: ended, dead with reason ReasonRefused,
				// unless its move to the dead items is refused too.
				stuck = append(stuck, q.endRefusedItem(ctx, m.step, b.ID, b.Err))
			}
		}
		if err != nil {
			return stuck, err
		}
		if moved == 0 || len(ids) < reapBatch {
			return stuck, nil
		}
	}
}

// reapCandidates lists up to reapBatch ids of a step's candidates.
func (q *Queue) reapCandidates(ctx context.Context, list func(ctx context.Context, db crsql.DB, queue string, limit int) ([]uuid.UUID, error)) ([]uuid.UUID, error) {
	var ids []uuid.UUID
	err := retry.Do(ctx, q.stats.retried("reap"), func(ctx context.Context) error {
		var err error
		ids, err = list(ctx, q.db, q.opts.Queue, reapBatch)
		return store.Classify(err)
	})
	return ids, err
}

// moveByID releases or moves the given candidates of a step in one statement; if
// the database refuses it for something about one of them, it splits the
// list in halves and moves each, down to single items: each refused item
// fails alone (returned with its error), every other one moves, in about
// 2·log2(len(ids)) statements per refused item. Any other failure stops it.
func (q *Queue) moveByID(ctx context.Context, m reapMove, ids []uuid.UUID) (int, []*ReapError, error) {
	if len(ids) == 0 {
		return 0, nil, nil
	}
	n, err := q.reapStep(ctx, func(ctx context.Context, tx pgx.Tx) (int64, error) { return m.byID(ctx, tx, ids) })
	switch {
	case err == nil:
		return n, nil, nil
	case !itemFault(err):
		return 0, nil, err
	case len(ids) == 1:
		return 0, []*ReapError{{Queue: q.opts.Queue, Step: m.step, ID: ids[0], Err: err}}, nil
	}
	half := len(ids) / 2
	n1, bad1, err := q.moveByID(ctx, m, ids[:half])
	if err != nil {
		return n1, bad1, err
	}
	n2, bad2, err := q.moveByID(ctx, m, ids[half:])
	return n1 + n2, append(bad1, bad2...), err
}

// reapStep runs one batch of Reap, step, in a SERIALIZABLE transaction (its
// statements lock with SKIP LOCKED; see store.Store) and returns its rows.
func (q *Queue) reapStep(ctx context.Context, step func(ctx context.Context, tx pgx.Tx) (int64, error)) (int, error) {
	var n int
	err := retry.Tx(ctx, q.db, q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
		rows, err := step(ctx, tx)
		n = int(rows)
		return store.Classify(err)
	})
	return n, err
}

// releaseForgotten is Claimer.ReleaseForgotten for session (see its
// documentation).
func (q *Queue) releaseForgotten(ctx context.Context, session uuid.UUID, keep []uuid.UUID) (int, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: releasing forgotten claims in %q: %w", q.opts.Queue, err)
	}
	var n int
	err := retry.Do(ctx, q.stats.retried("release"), func(ctx context.Context) error {
		released, err := q.store.ItemsReleaseForgotten(ctx, q.db, q.opts.Queue, session, keep)
		n = int(released)
		return store.Classify(err)
	})
	if err != nil {
		return 0, fmt.Errorf("claim: releasing forgotten claims of session %s in %q: %w", session, q.opts.Queue, err)
	}
	q.stats.released.Add(int64(n))
	return n, nil
}
