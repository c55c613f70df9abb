package claim

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Sequenced queues (docs/sequences.md): in a queue whose sequencing is on,
// the items with a key run one at a time per key, in enqueue order.
//
// An item enqueued while its queue is sequenced, with a NewItem.Key, is a
// sequenced item: it is claimed only when it is the first of its key's
// sequenced items still in the queue, and only while no other item of its
// key is claimed. So, per key:
//
//   - at most one item is in flight (claimed), fleet-wide: a unique index
//     of the database guarantees it, whatever the sessions, processes and
//     parts;
//   - items are claimed in enqueue order (by the database clock; items of
//     one enqueue call, or of several calls in one transaction, in the
//     order given);
//   - an item that failed and waits for its retry (Nack) keeps its key
//     blocked until it is acked or moved to the dead items (strict FIFO, as
//     SQS FIFO message groups and pg-boss's key_strict_fifo);
//   - a claim lost with its session (a killed process) or its part (a
//     rebalance) is released by the foreign keys, and the next claim of the
//     key takes the same item again, its attempt counted.
//
// Items without a key, and items enqueued while the queue was not
// sequenced, are claimed as in any queue. Priorities order the heads of
// different keys, not the items of one key.

// sequenceOrders numbers the items this process enqueues (NewItem order,
// call after call): the order of a key's items that share an enqueue time,
// the items of one transaction (see sql's enqueueStatements).
var sequenceOrders atomic.Int64

// sequencedTTL is how long a Queue trusts what it last read of its queue's
// sequencing before its next claim reads it again.
const sequencedTTL = time.Second

// sequenceState is what a Queue last read of its queue's sequencing: until
// (Unix nanoseconds) and whether its claims must be sequenced.
type sequenceState struct {
	until atomic.Int64
	on    atomic.Bool
}

// SetSequenced turns sequencing of the queue on or off. While it is on,
// items enqueued with a key are sequenced (see the package documentation
// above and docs/sequences.md); turning it off leaves the items already
// sequenced so: they keep their order until they end. Claims of other
// processes follow within a second (sooner if they run into a claimed item
// of a sequenced key). Turn it on before enqueueing the items to order, and
// only once every worker of the queue runs crdbwork 0.5 or newer: older
// workers claim sequenced items out of order (never two of one key at once:
// the database refuses that claim, which then fails and is retried).
func (q *Queue) SetSequenced(ctx context.Context, on bool) error {
	verb := map[bool]string{true: "sequencing", false: "unsequencing"}[on]
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	err := retry.Do(ctx, q.stats.retried("sequence"), func(ctx context.Context) error {
		return crsql.Classify(q.store.SetSequenced(ctx, q.db, q.opts.Queue, on))
	})
	if err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	q.seq.until.Store(0) // this Queue reads it again at its next claim
	return nil
}

// SequenceInfo is what Sequencing reports of a queue.
type SequenceInfo struct {
	// On reports that the queue is sequenced: items enqueued with a key are
	// sequenced.
	On bool
	// Items reports that the queue holds sequenced items (enqueued while it
	// was on): claims keep their order while any is left.
	Items bool
}

// Sequencing reports whether the queue is sequenced, and whether it holds
// sequenced items.
func (q *Queue) Sequencing(ctx context.Context) (SequenceInfo, error) {
	if err := q.ready(ctx); err != nil {
		return SequenceInfo{}, fmt.Errorf("claim: reading the sequencing of %q: %w", q.opts.Queue, err)
	}
	var info SequenceInfo
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		info.On, info.Items, err = q.store.QueueSequenced(ctx, q.db, q.opts.Queue)
		return crsql.Classify(err)
	})
	if err != nil {
		return SequenceInfo{}, fmt.Errorf("claim: reading the sequencing of %q: %w", q.opts.Queue, err)
	}
	return info, nil
}

// sequenced reports whether the queue's claims must be sequenced: it is
// sequenced, or holds sequenced items. It reads the database at most once
// per sequencedTTL; if that read fails, the last answer stands (a plain
// claim that meets a sequenced key fails on the unique index and turns the
// sequenced claims on: see sequenceGuard).
func (q *Queue) sequenced(ctx context.Context) bool {
	now := time.Now().UnixNano()
	if now < q.seq.until.Load() {
		return q.seq.on.Load()
	}
	on, items, err := q.store.QueueSequenced(ctx, q.db, q.opts.Queue)
	if err != nil {
		return q.seq.on.Load()
	}
	q.seq.on.Store(on || items)
	q.seq.until.Store(now + int64(sequencedTTL))
	return on || items
}

// sequenceConflict is a claim's unique violation on the index of claimed
// sequenced keys, made retryable (SQLSTATE 40001 for crdb.ExecuteCtx, as
// internal/retry does for deadlocks): the claim changed nothing, and its
// retry skips the key.
type sequenceConflict struct{ err error }

func (c sequenceConflict) Error() string    { return c.err.Error() }
func (c sequenceConflict) Unwrap() error    { return c.err }
func (c sequenceConflict) SQLState() string { return "40001" }

// sequenceGuard wraps a claim: it picks the sequenced statement or the
// plain one at each attempt (sequenced, plain), and turns a unique
// violation on the index of claimed sequenced keys into a retryable
// sequenceConflict, after which the Queue claims sequenced (until its next
// read of the queue's sequencing).
func (q *Queue) sequenceGuard(sequenced, plain func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error)) func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error) {
	return func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error) {
		claim := plain
		if q.sequenced(ctx) {
			claim = sequenced
		}
		rows, err := claim(ctx, db)
		if err != nil && q.store.IsSequenceConflict(err) {
			q.seq.on.Store(true)
			q.seq.until.Store(time.Now().Add(sequencedTTL).UnixNano())
			return nil, sequenceConflict{err}
		}
		return rows, err
	}
}

// claimManyPartsSequenced is claimManyParts for a sequenced queue: the
// sequenced per-part claim, one statement per group of
// crsql.MaxPartBranches parts, each for what the groups before it left of
// a.Limit. (Order across parts is relaxed anyway; within a key it is kept,
// since a key's items share a part and every claim tests the key's head.)
func (q *Queue) claimManyPartsSequenced(ctx context.Context, e *engine, session uuid.UUID, a crsql.ClaimArgs, parts []int64) ([]Item, error) {
	var all []Item
	for start := 0; start < len(parts) && len(all) < a.Limit; start += crsql.MaxPartBranches {
		group := parts[start:min(start+crsql.MaxPartBranches, len(parts))]
		ga := a
		ga.Limit = a.Limit - len(all)
		items, err := q.runClaim(ctx, e, session, "claiming", q.sequenceGuard(func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error) {
			return q.store.ClaimPartsSequenced(ctx, db, e.dialect, ga, group)
		}, func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error) {
			return q.store.ClaimParts(ctx, db, e.dialect, ga, group)
		}))
		if err != nil {
			if len(all) > 0 {
				return all, nil // claimed; the next claim reports the error
			}
			return nil, err
		}
		all = append(all, items...)
	}
	return all, nil
}

// ClaimsSequenced reports whether the Queue's claims are sequenced, as it
// last read (at most a second before its last claim): the queue is
// sequenced or holds sequenced items. Package worker claims again as soon
// as an item ends in such a queue (its key's next item may be claimable
// at once) rather than at its idle poll. It does no I/O.
func (q *Queue) ClaimsSequenced() bool { return q.seq.on.Load() }
