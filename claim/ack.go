package claim

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// ErrRecordPanic is wrapped by the error of an ack whose record function (an
// AckRequest's Record or a BatchRecord) panicked. The panic was recovered:
// the transaction was rolled back, and the error holds the panic's value and
// the stack where it happened.
var ErrRecordPanic = errors.New("record function panicked")

// Ack acknowledges it exactly once. In one SERIALIZABLE transaction (on
// both engines) it deletes the item, only if the claim is still its claim
// (same session, same token), and then calls record (if not nil) to write
// the result in the same transaction. The transaction is retried whole on
// serialization failures and deadlocks, so record may run more than once;
// only one run's writes commit.
//
// Ack returns nil only if the transaction committed. If the claim was lost,
// it returns an error wrapping ErrClaimLost and nothing was written. If
// record fails, its error is returned and nothing was written (a panic in
// record is recovered and returned wrapping ErrRecordPanic). If the outcome
// is unknown (the COMMIT's answer was lost, or CockroachDB answered 40003),
// the error wraps ErrOutcomeUnknown: the item may be acked or still claimed,
// and it is never reported as acked.
func (q *Queue) Ack(ctx context.Context, it Item, record func(ctx context.Context, tx pgx.Tx) error) error {
	return q.AckMany(ctx, []AckRequest{{Item: it, Record: record}}, AckOptions{})[0]
}

// ackBatch acknowledges many items in one serializable transaction. Each
// item is deleted only if its claim still holds; record (if not nil) is then
// called once with the items whose delete succeeded, in the same
// transaction. It returns those items, only after COMMIT succeeded; the
// others lost their claims and are left alone. On error nothing was acked
// (or, if the error wraps ErrOutcomeUnknown, it is unknown whether the whole
// batch was). Unlike AckMany it never splits the batch: record's failure is
// the batch's. Only the package's tests and benchmarks use it (the
// comparison of one record per batch with one per item).
func (q *Queue) ackBatch(ctx context.Context, items []Item, record func(ctx context.Context, tx pgx.Tx, acked []Item) error) ([]Item, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: batch ack of %d items: %w", len(items), err)
	}
	var acked []Item
	var waitedFor []uuid.UUID
	err := retry.TxWith(ctx, q.db, store.AckTxOptions(q.engine.Load().dialect), q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		deleted, w, err := q.deleteClaimed(ctx, tx, items)
		if err != nil {
			return err
		}
		waitedFor = w
		acked = acked[:0]
		for i, it := range items {
			if deleted[i] {
				acked = append(acked, it)
			}
		}
		if record != nil && len(acked) > 0 {
			return recovered(func() error { return record(ctx, tx, acked) })
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: batch ack of %d items: %w", len(items), err)
	}
	q.stats.acked.Add(int64(len(acked)))
	q.stats.lost.Add(int64(len(items) - len(acked)))
	q.afterAck(ctx, acked, waitedFor)
	return acked, nil
}

// afterAck runs what follows every committed ack, whatever way it went
// (ackTx, ackPipelined, ackBatch): the release of the dependents of the
// items it acked that items wait for — waitedFor, which the ack's own
// statement reported (AckManyDependents, ReadAckPipeline), and those of
// the at-most-once items among acked (the items the ack acked), which it
// asks the database for — in a short transaction of its own
// (releaseAcked). At-most-once items count too: their claim took them
// (their end is recorded as taken, which satisfies their dependents), and
// their ack says that their handler succeeded. Every ack path calls it, so
// that none leaves the dependents of what it acked to the reaper, and an
// ack of items nothing waits for runs nothing more.
func (q *Queue) afterAck(ctx context.Context, acked []Item, waitedFor []uuid.UUID) {
	if atMostOnce(acked) {
		var taken []uuid.UUID
		for _, it := range acked {
			if it.AtMostOnce {
				taken = append(taken, it.ID)
			}
		}
		err := retry.Do(ctx, q.stats.retried("unblock"), func(ctx context.Context) error {
			w, err := q.store.ItemsDepsWaitedFor(ctx, q.db, q.opts.Queue, taken)
			if err == nil {
				waitedFor = append(waitedFor, w...)
			}
			return store.Classify(err)
		})
		if err != nil {
			q.stats.releaseFailed.Add(1) // left to the reaper
		}
	}
	q.releaseAcked(ctx, waitedFor)
}

// AckRequest is one item for AckMany with the function that records its
// result (nil: nothing to record).
type AckRequest struct {
	Item Item
	// Record writes the item's result in the ack's SERIALIZABLE
	// transaction, after the item's delete.
	Record func(ctx context.Context, tx pgx.Tx) error
	// Value is whatever the handler hands on to a BatchRecord (for example
	// its result, to be written with the batch's other results in one
	// statement). claim never looks at it.
	Value any
}

// BatchRecord records the results of a whole batch in one go (one multi-row
// INSERT or COPY instead of one statement per item). AckMany calls it
// once per transaction, in that transaction, after the per-item Records,
// with the requests whose delete succeeded (their claims held), in request
// order. Like Record it may run more than once (the transaction is retried
// whole on serialization failures and deadlocks): only one run's writes
// commit.
type BatchRecord func(ctx context.Context, tx pgx.Tx, acked []AckRequest) error

// AckOptions configure AckMany. The zero value is valid.
type AckOptions struct {
	// Batch, if not nil, records the results of every transaction's acked
	// items in one call (see BatchRecord).
	Batch BatchRecord
	// Statement, if not nil, records them with one SQL statement (see
	// BatchStatement), after Batch if both are set. With Statement alone
	// (no Batch, and no per-item Record but Exec's, no at-most-once or
	// repeated item in the call), on PostgreSQL AckMany sends the whole
	// transaction —
	// BEGIN, the fenced delete, the statement and COMMIT — in one round
	// trip; if a claim was lost or the transaction failed, it acks the
	// items again the ordinary way, so the results and errors are the same
	// as with the equivalent BatchRecord.
	Statement BatchStatement
}

// AckMany acknowledges many items, each with its own record function,
// as if by one Ack each, but in one transaction when it can (group commit).
// It first runs them all in one SERIALIZABLE transaction (on both engines:
// the claim check and the result must commit together whatever the
// server's default isolation; docs/cockroachdb.md): one statement deletes every item
// whose claim still holds, then each deleted item's Record is called in
// order, then opts.Batch and opts.Statement (if set) once with all of them
// (with opts.Statement alone, in one round trip on PostgreSQL: see
// AckOptions.Statement).
//
// The statements of Exec records (and of opts.Statement) are not sent one
// by one: they go with the COMMIT, in one pipeline, so that a transaction
// of many items costs two round trips (BEGIN with the delete, then the
// statements with COMMIT) plus those that record functions make themselves
// (Exec).
//
// If that transaction fails for any reason but an unknown outcome — a
// Record or the BatchRecord failed or panicked, a statement failed, or
// COMMIT was refused (a deferred constraint or a unique violation found at
// COMMIT) — and it held more than one item, every item is acked again on its
// own (its own transaction, its Record, and opts.Batch called with that one
// request), so the item whose record fails holds back no other.
//
// errs[i] is what Ack would have returned for reqs[i]: nil only if a
// committed transaction deleted the item and wrote its records; an error
// wrapping ErrClaimLost if the claim was gone (nothing of it was written);
// the record's error (wrapping ErrRecordPanic for a panic); or, for every
// item of a transaction whose outcome is unknown, an error wrapping
// ErrOutcomeUnknown (nothing is retried after it: the batch may have
// committed).
//
// Whichever way the items were acked (one transaction, one pipelined round
// trip, or one by one), the items that wait for them (NewItem.After) are
// released right after the commit, in a short transaction of their own, as
// after Ack; at-most-once items' dependents too (docs/dependencies.md).
func (q *Queue) AckMany(ctx context.Context, reqs []AckRequest, opts AckOptions) (errs []error) {
	errs = make([]error, len(reqs))
	if len(reqs) == 0 {
		return errs
	}
	if q.opts.Hooks != nil {
		items := make([]Item, len(reqs))
		for i := range reqs {
			items[i] = reqs[i].Item
		}
		end := q.startStep(ctx, StepAck, items)
		defer func() { end(nil, errors.Join(errs...)) }()
	}
	if err := q.ready(ctx); err != nil {
		for i, r := range reqs {
			errs[i] = fmt.Errorf("claim: ack of item %s: %w", r.Item.ID, err)
		}
		return errs
	}
	if errs, ok := q.ackPipelined(ctx, reqs, opts); ok {
		return errs
	}
	deleted, err := q.ackTx(ctx, reqs, opts.batchRecord())
	switch {
	case err == nil:
		for i, r := range reqs {
			if deleted[i] {
				q.stats.acked.Add(1)
			} else {
				q.stats.lost.Add(1)
				errs[i] = fmt.Errorf("claim: ack of item %s: %w", r.Item.ID, ErrClaimLost)
			}
		}
	case len(reqs) == 1:
		errs[0] = fmt.Errorf("claim: ack of item %s: %w", reqs[0].Item.ID, err)
	case errors.Is(err, ErrOutcomeUnknown):
		for i, r := range reqs {
			errs[i] = fmt.Errorf("claim: ack of item %s (in a batch of %d): %w", r.Item.ID, len(reqs), err)
		}
	default:
		// Find out whose record (or COMMIT) fails by acking each on its own.
		for i := range reqs {
			errs[i] = q.AckMany(ctx, reqs[i:i+1], opts)[0]
		}
	}
	return errs
}

// ackTx runs one ack transaction for reqs and reports which items it
// deleted. A lost claim is not an error here: its item is just not deleted
// (and its records not called).
func (q *Queue) ackTx(ctx context.Context, reqs []AckRequest, batch BatchRecord) ([]bool, error) {
	items := make([]Item, len(reqs))
	for i, r := range reqs {
		items[i] = r.Item
	}
	deleted, waitedFor, err := q.runAck(ctx, items, func(ctx context.Context, tx pgx.Tx, deleted []bool) error {
		var acked []AckRequest
		for i, r := range reqs {
			if !deleted[i] {
				continue
			}
			if r.Record != nil {
				if err := recovered(func() error { return r.Record(ctx, tx) }); err != nil {
					return err
				}
			}
			if batch != nil { // the batch record's list (nothing else reads it)
				if acked == nil {
					acked = make([]AckRequest, 0, len(reqs))
				}
				acked = append(acked, r)
			}
		}
		if batch != nil && len(acked) > 0 {
			if err := recovered(func() error { return batch(ctx, tx, acked) }); err != nil {
				return fmt.Errorf("batch record: %w", err)
			}
		}
		return nil
	})
	if err == nil {
		// The acked items' dependents (depends.go), once the ack committed.
		acked := make([]Item, 0, len(items))
		for i, it := range items {
			if deleted[i] {
				acked = append(acked, it)
			}
		}
		q.afterAck(ctx, acked, waitedFor)
	}
	return deleted, err
}

// recovered calls fn, turning a panic into an error wrapping ErrRecordPanic
// with the panic's value and stack.
func recovered(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrRecordPanic, p, debug.Stack())
		}
	}()
	return fn()
}

// deleteClaimed deletes, in one statement, each item whose claim still
// holds (same session, same token), and reports which were deleted and the
// ids of those that items wait for (NewItem.After). At-most-once items
// count as deleted without a statement: their claim deleted them, and
// holding the claimed Item is what entitles the caller to record its
// result (afterAck asks whether items wait for them).
func (q *Queue) deleteClaimed(ctx context.Context, tx pgx.Tx, items []Item) ([]bool, []uuid.UUID, error) {
	held := heldItems(items)
	if len(held) == 0 {
		return markDeleted(items, nil), nil, nil
	}
	gone, waitedFor, err := q.store.ItemsAckDependents(ctx, tx, q.engine.Load().dialect, claimKeys(held))
	if err != nil {
		return nil, nil, store.Classify(err)
	}
	return markDeleted(items, gone), waitedFor, nil
}

// heldItems returns the items an ack's statement deletes: all but the
// at-most-once items (their claim deleted them).
func heldItems(items []Item) []Item {
	if !atMostOnce(items) {
		return items
	}
	var held []Item
	for _, it := range items {
		if !it.AtMostOnce {
			held = append(held, it)
		}
	}
	return held
}

// markDeleted reports which of items an ack deleted, given the ids its
// statement deleted (gone): those, and the at-most-once items. An item
// listed twice counts once: its first request.
func markDeleted(items []Item, gone []uuid.UUID) []bool {
	deleted := make([]bool, len(items))
	set := make(map[uuid.UUID]bool, len(gone))
	for _, id := range gone {
		set[id] = true
	}
	for i, it := range items {
		if it.AtMostOnce {
			deleted[i] = true
			continue
		}
		deleted[i] = set[it.ID]
		delete(set, it.ID)
	}
	return deleted
}

func atMostOnce(items []Item) bool {
	for _, it := range items {
		if it.AtMostOnce {
			return true
		}
	}
	return false
}
