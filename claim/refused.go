package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Rows the database refuses (docs/dependencies.md, "Rows the database
// refuses"). A row that bypassed enqueue's bounds (raw SQL, an older
// version) may be accepted by one table and refused by the one a move
// writes it into: a waiting item with a tenant too long for the items'
// tenant index is, by the release of its last prerequisite. The batched
// movers never let such a row hold up the others: a batch refused for
// something about a row (itemFault) is split until the row is alone, every
// other row of the batch moves, and the row is ended, dead with reason
// ReasonRefused and the database's error in its last error, and reported
// (a ReapError with its id and Ended set, which the worker logs). A row
// whose move to the dead items is refused too stays where it is, reported
// (Ended false), and the movers go on past it.

// ReasonRefused is the reason of a dead item that the database refused to
// move where it had to go (DeadItem.Reason): its last error starts with
// "refused by the database" and gives the step and the database's error.
const ReasonRefused = "refused by the database"

// IsRefusal reports whether err (of Requeue, say) is the database refusing
// the statement for something about the rows it wrote (a data exception,
// an integrity constraint, a row over a size limit such as an index
// entry's, an exception raised by a trigger), which the same statement
// without those rows would not meet: retrying it changes nothing. Bulk
// operations skip such a row and go on (Requeue by filter).
func IsRefusal(err error) bool { return itemFault(err) }

// refusedText is the last error of an item ended because the database
// refused its move in step: the step and the database's error.
func refusedText(step string, err error) string {
	return safeText(fmt.Sprintf("%s (%s): %v", ReasonRefused, step, err))
}

// endRefusedItem ends the item id, which the database refused to move in
// step (with refusal), if no live claim holds it: dead with reason
// ReasonRefused. It returns the ReapError that reports it (Ended if it was
// ended; otherwise the item stays as it is).
func (q *Queue) endRefusedItem(ctx context.Context, step string, id uuid.UUID, refusal error) *ReapError {
	var ended bool
	err := retry.Tx(ctx, q.db, q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		ended, err = q.store.ItemsKillRefused(ctx, tx, q.opts.Queue, id, refusedText(step, refusal))
		return store.Classify(err)
	})
	if err != nil {
		return &ReapError{Queue: q.opts.Queue, Step: step, ID: id, Err: fmt.Errorf("%w; ending it as refused failed too: %w", refusal, err)}
	}
	if ended {
		q.stats.dead.Add(1)
	}
	return &ReapError{Queue: q.opts.Queue, Step: step, ID: id, Err: refusal, Ended: ended}
}

// settleIsolated is settle for prereqs, with the rows the database refuses
// isolated: when the batch's settle is refused for something about a row
// (itemFault), each half is settled apart, down to single prerequisites,
// and one whose settle is still refused has its dependents moved apart
// (settleOne). It returns how many it released, the ids it ended (whose
// own dependents end next: the dependents of dead prerequisites, and the
// refused rows it ended), and the refused rows (those ended with Ended
// set).
func (q *Queue) settleIsolated(ctx context.Context, prereqs []uuid.UUID) (int, []uuid.UUID, []*ReapError, error) {
	released, killed, err := q.settle(ctx, prereqs)
	switch {
	case err == nil:
		return released, killed, nil, nil
	case !itemFault(err):
		return 0, nil, nil, err
	case len(prereqs) == 1:
		return q.settleOne(ctx, prereqs[0], err)
	}
	half := len(prereqs) / 2
	r1, k1, bad1, err := q.settleIsolated(ctx, prereqs[:half])
	if err != nil {
		return r1, k1, bad1, err
	}
	r2, k2, bad2, err := q.settleIsolated(ctx, prereqs[half:])
	return r1 + r2, append(k1, k2...), append(bad1, bad2...), err
}

// settleOne settles the prerequisite p whose settle the database refused
// (refusal) for something about a row. If p was acked (or taken), its
// dependents are released in one transaction, those ready moved in halves
// under savepoints down to single rows: each one refused alone is ended
// (KillRefusedWaiting) and returned among the ids ended, so that its own
// dependents end next. Otherwise (p died: the dependents' move to the dead
// items was refused), or if the end of a refused row is refused too,
// nothing is done: p is reported, stays as it is, and the sweep goes on
// past it.
func (q *Queue) settleOne(ctx context.Context, p uuid.UUID, refusal error) (int, []uuid.UUID, []*ReapError, error) {
	var moved int
	var ended []uuid.UUID
	var bad []*ReapError
	d := q.engine.Load().dialect
	err := retry.TxWith(ctx, q.db, releaseTxOptions(d), q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
		moved, ended, bad = 0, nil, nil
		states, err := q.store.ItemsDepsClassify(ctx, tx, d, q.opts.Queue, []uuid.UUID{p})
		if err != nil {
			return store.Classify(err)
		}
		if len(states) != 1 || (states[0].State != store.OutcomeAcked && states[0].State != store.OutcomeTaken) {
			return errKeep
		}
		ready, err := q.store.ItemsDepsReleaseEdges(ctx, tx, d, q.opts.Queue, []uuid.UUID{p})
		if err != nil {
			return store.Classify(err)
		}
		n, refused, err := q.moveApart(ctx, tx, d, ready)
		if err != nil {
			return err
		}
		moved = n
		for _, r := range refused {
			text := refusedText(StepDependencies, r.err)
			ok, err := q.store.ItemsKillRefusedWaiting(ctx, tx, q.opts.Queue, r.id, text)
			if err != nil {
				return store.Classify(err)
			}
			if ok {
				ended = append(ended, r.id)
				bad = append(bad, &ReapError{Queue: q.opts.Queue, Step: StepDependencies, ID: r.id, Err: r.err, Ended: true})
			}
		}
		if moved > 0 && q.notifies() {
			return store.Classify(q.store.Notify(ctx, tx, q.channel, ""))
		}
		return nil
	})
	switch {
	case errors.Is(err, errKeep) || (err != nil && itemFault(err)):
		// Nothing to isolate here, or the end of a refused row was refused
		// too: p stays, reported; its edges are swept again next time.
		return 0, nil, []*ReapError{{Queue: q.opts.Queue, Step: StepDependencies, ID: p, Err: refusal}}, nil
	case err != nil:
		return 0, nil, nil, err
	}
	q.stats.dead.Add(int64(len(ended)))
	return moved, ended, bad, nil
}

// countEnded returns how many of errs report an item ended as refused.
func countEnded(errs []*ReapError) int {
	n := 0
	for _, e := range errs {
		if e.Ended {
			n++
		}
	}
	return n
}

// errKeep ends settleOne's transaction when it has nothing to isolate.
var errKeep = errors.New("nothing to isolate")

// refusedRow is a row the database refused alone, with its error.
type refusedRow struct {
	id  uuid.UUID
	err error
}

// moveApart moves the waiting items ids (ready: their counts are zero)
// into the items table in tx, under a savepoint: if the database refuses
// the move for something about a row, the savepoint is rolled back and
// each half is moved apart, down to single rows, each refused one returned.
// About 2·log2(len(ids)) statements per refused row.
func (q *Queue) moveApart(ctx context.Context, tx pgx.Tx, d store.Dialect, ids []uuid.UUID) (int, []refusedRow, error) {
	if len(ids) == 0 {
		return 0, nil, nil
	}
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return 0, nil, store.Classify(err)
	}
	moved, err := q.store.ItemsDepsMoveReady(ctx, sp, d, q.opts.Queue, ids)
	if err == nil {
		return len(moved), nil, store.Classify(sp.Commit(ctx))
	}
	if !itemFault(err) {
		return 0, nil, store.Classify(err)
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return 0, nil, store.Classify(rbErr)
	}
	if len(ids) == 1 {
		return 0, []refusedRow{{id: ids[0], err: err}}, nil
	}
	half := len(ids) / 2
	n1, bad1, err := q.moveApart(ctx, tx, d, ids[:half])
	if err != nil {
		return 0, nil, err
	}
	n2, bad2, err := q.moveApart(ctx, tx, d, ids[half:])
	return n1 + n2, append(bad1, bad2...), err
}

// pruneIsolated runs m.batch, a pruning statement of up to pruneBatch rows,
// at most pruneStatements times, while it deletes full batches, and
// reports how many rows it deleted and whether the last batch found fewer
// than a batch (nothing left). A batch that the database refuses for
// something about a row (a trigger, a foreign key a user added) is done
// again by key: the batch's candidates (m.candidates) are deleted in halves
// down to single rows (moveByID), and each row refused alone is returned
// and left where it is (it ended already: there is nothing to end), while
// the others go. Any other failure ends it.
func (q *Queue) pruneIsolated(ctx context.Context, m reapMove) (int, bool, []*ReapError, error) {
	total := 0
	var refused []*ReapError
	seen := map[uuid.UUID]bool{}
	for range pruneStatements {
		n, err := q.reapStep(ctx, m.batch)
		total += n
		switch {
		case err == nil && n < pruneBatch:
			return total, true, refused, nil
		case err == nil:
			continue
		case !itemFault(err):
			return total, false, refused, err
		}
		var ids []uuid.UUID
		err = retry.Do(ctx, q.stats.retried("retention"), func(ctx context.Context) error {
			var err error
			ids, err = m.candidates(ctx, q.db, q.opts.Queue, pruneBatch)
			return store.Classify(err)
		})
		if err != nil {
			return total, false, refused, err
		}
		moved, bad, err := q.moveByID(ctx, m, ids)
		total += moved
		for _, b := range bad {
			if !seen[b.ID] {
				seen[b.ID] = true
				refused = append(refused, b)
			}
		}
		if err != nil {
			return total, false, refused, err
		}
		if moved == 0 || len(ids) < pruneBatch {
			// Only refused rows left in reach of the batch, or nothing.
			return total, len(ids) < pruneBatch, refused, nil
		}
	}
	return total, false, refused, nil
}

// joinRefused joins err and the refused rows (ReapErrors with their ids)
// into one error whose ReapErrors lists them (nil if neither).
func joinRefused(err error, refused []*ReapError) error {
	errs := make([]error, 0, len(refused)+1)
	for _, r := range refused {
		errs = append(errs, r)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
