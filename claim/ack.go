package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Ack acknowledges it exactly once. In one serializable transaction it
// deletes the item, only if the claim is still it's claim, and then calls
// record (if not nil) to write the result in the same transaction. The
// transaction is retried whole on serialization failures, so record may run
// more than once; only one run's writes commit.
//
// Ack returns nil only if the transaction committed. If the claim was lost,
// it returns an error wrapping ErrClaimLost and nothing was written. If
// record fails, its error is returned and nothing was written. If the
// connection failed during COMMIT, the error wraps retry.ErrCommitUnknown
// (the item stays claimed or is gone; it is never reported as acked).
func (q *Queue) Ack(ctx context.Context, it Item, record func(ctx context.Context, tx pgx.Tx) error) error {
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: ack of item %s: %w", it.ID, err)
	}
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		deleted, err := q.deleteClaimed(ctx, tx, []Item{it})
		if err != nil {
			return err
		}
		if !deleted[0] {
			return ErrClaimLost
		}
		if record != nil {
			return record(ctx, tx)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrClaimLost) {
			q.stats.lost.Add(1)
		}
		return fmt.Errorf("claim: ack of item %s: %w", it.ID, err)
	}
	q.stats.acked.Add(1)
	return nil
}

// AckBatch acknowledges many items in one serializable transaction. Each
// item is deleted only if its claim still holds; record (if not nil) is then
// called once with the items whose delete succeeded, in the same
// transaction. It returns those items, only after COMMIT succeeded; the
// others lost their claims and are left alone. On error nothing was acked.
func (q *Queue) AckBatch(ctx context.Context, items []Item, record func(ctx context.Context, tx pgx.Tx, acked []Item) error) ([]Item, error) {
	if len(items) == 0 {
		return nil, nil
	}
	var acked []Item
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		deleted, err := q.deleteClaimed(ctx, tx, items)
		if err != nil {
			return err
		}
		acked = acked[:0]
		for i, it := range items {
			if deleted[i] {
				acked = append(acked, it)
			}
		}
		if record != nil && len(acked) > 0 {
			return record(ctx, tx, acked)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: batch ack of %d items: %w", len(items), err)
	}
	q.stats.acked.Add(int64(len(acked)))
	q.stats.lost.Add(int64(len(items) - len(acked)))
	return acked, nil
}

// AckRequest is one item for AckEach with the function that records its
// result (nil: nothing to record).
type AckRequest struct {
	Item   Item
	Record func(ctx context.Context, tx pgx.Tx) error
}

// AckEach acknowledges many items, each with its own record function, as if
// by one Ack each, but in one transaction when it can. It first runs them all
// in one serializable transaction: each item deleted only if its claim still
// holds, then its record called, in order. If a record fails, that
// transaction is rolled back and every item is acked on its own with Ack, so
// one failing record holds back no other item. A worker uses it to commit
// the results of several handlers together (group commit).
//
// errs[i] is what Ack would have returned for reqs[i]: nil only if a
// committed transaction deleted the item and wrote its record; an error
// wrapping ErrClaimLost if the claim was gone (nothing of it was written);
// the record's error; or an error wrapping retry.ErrCommitUnknown for every
// item of a transaction whose COMMIT had an unknown outcome.
func (q *Queue) AckEach(ctx context.Context, reqs []AckRequest) (errs []error) {
	errs = make([]error, len(reqs))
	switch len(reqs) {
	case 0:
		return errs
	case 1:
		errs[0] = q.Ack(ctx, reqs[0].Item, reqs[0].Record)
		return errs
	}
	items := make([]Item, len(reqs))
	for i, r := range reqs {
		items[i] = r.Item
	}
	var deleted []bool
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if deleted, err = q.deleteClaimed(ctx, tx, items); err != nil {
			return err
		}
		for i, r := range reqs {
			if deleted[i] && r.Record != nil {
				if err := r.Record(ctx, tx); err != nil {
					return recordError{err}
				}
			}
		}
		return nil
	})
	var recErr recordError
	switch {
	case err == nil:
		for i, it := range items {
			if deleted[i] {
				q.stats.acked.Add(1)
			} else {
				q.stats.lost.Add(1)
				errs[i] = fmt.Errorf("claim: ack of item %s: %w", it.ID, ErrClaimLost)
			}
		}
	case errors.As(err, &recErr):
		// Find out whose record failed by acking each on its own.
		for i, r := range reqs {
			errs[i] = q.Ack(ctx, r.Item, r.Record)
		}
	default:
		for i, it := range items {
			errs[i] = fmt.Errorf("claim: ack of item %s (in a batch of %d): %w", it.ID, len(items), err)
		}
	}
	return errs
}

// recordError marks the error of a caller's record function inside AckEach's
// transaction. It unwraps, so that a retryable error still retries it.
type recordError struct{ err error }

func (e recordError) Error() string { return e.err.Error() }
func (e recordError) Unwrap() error { return e.err }

// deleteClaimed deletes, in one statement, each item whose claim still
// holds (same session, same token), and reports which were deleted.
func (q *Queue) deleteClaimed(ctx context.Context, tx pgx.Tx, items []Item) ([]bool, error) {
	ids := make([]uuid.UUID, len(items))
	sessions := make([]uuid.UUID, len(items))
	tokens := make([]int64, len(items))
	for i, it := range items {
		ids[i], sessions[i], tokens[i] = it.ID, it.Session, it.Token
	}
	rows, err := tx.Query(ctx, q.st.AckMany, ids, sessions, tokens)
	if err != nil {
		return nil, crsql.Classify(err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, crsql.Classify(err)
	}
	set := make(map[uuid.UUID]bool, len(gone))
	for _, id := range gone {
		set[id] = true
	}
	deleted := make([]bool, len(items))
	for i, it := range items {
		// An item listed twice counts once: its first request.
		deleted[i] = set[it.ID]
		delete(set, it.ID)
	}
	return deleted, nil
}
