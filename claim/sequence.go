package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
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
//     key takes the same item again, its attempt counted;
//   - a dead item lets its key advance, or, in a queue that holds on a
//     death (SettingsUpdate.SequenceHold), holds the key's later items until it is
//     requeued, deleted or released; requeued, it runs at its original
//     place in the key's order, never beside another item of its key.
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

// setSequenced (SettingsUpdate.Sequenced) turns sequencing of the queue on or off. While it is on,
// items enqueued with a key are sequenced (see the package documentation
// above and docs/sequences.md); turning it off leaves the items already
// sequenced so: they keep their order until they end. Claims of other
// processes follow within a second (sooner if they run into a claimed item
// of a sequenced key). Turn it on before enqueueing the items to order, and
// only once every worker of the queue runs crdbwork 0.5 or newer: older
// workers claim sequenced items out of order (never two of one key at once:
// the database refuses that claim, which then fails and is retried).
func (q *Queue) setSequenced(ctx context.Context, on bool) error {
	verb := map[bool]string{true: "sequencing", false: "unsequencing"}[on]
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	err := retry.Do(ctx, q.stats.retried("sequence"), func(ctx context.Context) error {
		return store.Classify(q.store.QueueSequencedSet(ctx, q.db, q.opts.Queue, on))
	})
	if err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	q.seq.until.Store(0) // this Queue reads it again at its next claim
	return nil
}

// sequenceInfo is what Sequencing reports of a queue.
type sequenceInfo struct {
	// On reports that the queue is sequenced: items enqueued with a key are
	// sequenced.
	On bool
	// Items reports that the queue holds sequenced items (enqueued while it
	// was on): claims keep their order while any is left.
	Items bool
	// Hold reports that a death of a sequenced item holds its key
	// (SettingsUpdate.SequenceHold); false: the key advances.
	Hold bool
}

// setSequenceHold (SettingsUpdate.SequenceHold) sets what a death of one of the queue's sequenced items
// (moved to the dead items: attempts used up, Permanent, a crash loop,
// expired, refused by the database; or cancelled) does to its key:
//
//   - hold false (the default), advance: the key's next item runs, as if
//     the dead one had been acked;
//   - hold true: the key's later items wait, the key is blocked (see
//     BlockedKeys), until the dead item is requeued (Requeue, which puts
//     it back at its place in the key's order: it runs next), deleted from
//     the dead items (by an operator, Purge or retention), or the key is
//     released (ReleaseSequenceKey). A cancelled item is kept among the
//     dead items (ReasonCancelled) so that it can be requeued or deleted
//     like a dead one.
//
// It applies to deaths from then on. Turning hold off releases the keys
// that the queue's dead items hold (the dead items stay) and returns how
// many dead items it released. Hold needs every worker of the queue at
// crdbwork 0.6 or newer (schema version 6): older workers neither mark
// their deaths as holding nor skip held keys (docs/sequences.md, "Rolling
// upgrades").
func (q *Queue) setSequenceHold(ctx context.Context, hold bool) (released int, err error) {
	verb := map[bool]string{true: "setting sequences to hold on a death in", false: "setting sequences to advance on a death in"}[hold]
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	err = retry.Tx(ctx, q.db, q.stats.retried("sequence"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		released, err = q.store.QueueSequenceHoldSet(ctx, tx, q.opts.Queue, hold)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, store.Classify(err))
	}
	return released, nil
}

// ReleaseSequenceKey releases key from the dead items that hold it (in a
// queue whose sequences hold on a death, SettingsUpdate.SequenceHold): its later items
// run again, in order. The dead items stay (they may still be requeued;
// a requeued one runs at its place in the key's order, if its turn has not
// passed: before the key's items still queued that came after it). It
// returns the ids of the dead items released; none if the key was not held.
func (q *Queue) ReleaseSequenceKey(ctx context.Context, key string) ([]uuid.UUID, error) {
	if key == "" {
		return nil, fmt.Errorf("claim: releasing a key of %q: the key is empty", q.opts.Queue)
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: releasing key %q of %q: %w", key, q.opts.Queue, err)
	}
	var ids []uuid.UUID
	err := retry.Do(ctx, q.stats.retried("sequence"), func(ctx context.Context) error {
		var err error
		ids, err = q.store.ItemsSequenceRelease(ctx, q.db, q.opts.Queue, key)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim: releasing key %q of %q: %w", key, q.opts.Queue, err)
	}
	return ids, nil
}

// Why a key is blocked (BlockedKey.Kind).
const (
	// BlockedDead: a dead item holds the key (the queue holds on a death).
	BlockedDead = "dead"
	// BlockedRetry: the key's head failed and waits for its retry (Nack's
	// backoff, or a snooze).
	BlockedRetry = "retry"
	// BlockedDelayed: the key's head was enqueued with a delay
	// (NewItem.Delay) that has not passed.
	BlockedDelayed = "delayed"
)

// BlockedKey is a key of a sequenced queue whose items cannot run although
// the key has some: held by a dead item, or waiting for its head's time.
// (A key whose head is running is not blocked; a key with no items left is
// not listed, even if a dead item holds it.)
type BlockedKey struct {
	Key string
	// ID is the item that blocks the key: the dead item (Kind BlockedDead),
	// or the key's head (BlockedRetry, BlockedDelayed).
	ID uuid.UUID
	// Kind says why: BlockedDead, BlockedRetry or BlockedDelayed.
	Kind string
	// Reason is the dead item's reason (ReasonFailed, ...,
	// ReasonCancelled); "" for the other kinds.
	Reason string
	// LastError is the error of the blocking item's last attempt ("" if
	// none).
	LastError string
	// At is when the dead item died, or when the head becomes claimable.
	At time.Time
	// Attempts the blocking item has used.
	Attempts int
}

// BlockedKeys lists up to limit blocked keys of the queue, by key: keys
// held by a dead item (in a queue that holds on a death) and keys whose
// head waits for a retry or a delay, each with the item that blocks it. A
// key held by two dead items is listed twice. Keys held by a dead item are
// listed even when they have no items left (their next item will wait).
// It reads the queue's dead items that hold keys through their index, and
// the queue's sequenced items that are not yet claimable (each with a
// test that it is its key's head): an operator's read, whose cost grows
// with the queue's sequenced backlog.
func (q *Queue) BlockedKeys(ctx context.Context, limit int) ([]BlockedKey, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim: listing blocked keys of %q: limit %d must be positive", q.opts.Queue, limit)
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: listing blocked keys of %q: %w", q.opts.Queue, err)
	}
	var rows []store.BlockedKeyRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = q.store.ItemsSequenceBlockedKeys(ctx, q.db, q.opts.Queue, limit)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing blocked keys of %q: %w", q.opts.Queue, err)
	}
	out := make([]BlockedKey, len(rows))
	for i, r := range rows {
		out[i] = BlockedKey{Key: r.Key, ID: r.ID, Kind: r.Kind, Reason: r.Reason, LastError: r.LastError, At: r.At, Attempts: r.Attempts}
	}
	return out, nil
}

// Sequencing reports whether the queue is sequenced, and whether it holds
// sequenced items.
func (q *Queue) sequencing(ctx context.Context) (sequenceInfo, error) {
	if err := q.ready(ctx); err != nil {
		return sequenceInfo{}, fmt.Errorf("claim: reading the sequencing of %q: %w", q.opts.Queue, err)
	}
	var info sequenceInfo
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		st, err := q.store.QueueSequencing(ctx, q.db, q.opts.Queue)
		info = sequenceInfo{On: st.On, Items: st.Items, Hold: st.Hold}
		return store.Classify(err)
	})
	if err != nil {
		return sequenceInfo{}, fmt.Errorf("claim: reading the sequencing of %q: %w", q.opts.Queue, err)
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

// DefaultSequencedClaimTimeout is Options.SequencedClaimTimeout's default.
const DefaultSequencedClaimTimeout = 10 * time.Second

// ErrSequencedClaimTimeout is wrapped by the error of a claim in a
// sequenced queue that the database stopped after
// Options.SequencedClaimTimeout: it claimed nothing.
var ErrSequencedClaimTimeout = errors.New("the sequenced claim ran past its bound (Options.SequencedClaimTimeout) and was stopped; nothing was claimed")

// boundedSequenced runs the sequenced claim through db under the Queue's
// SequencedClaimTimeout: SET LOCAL statement_timeout in db's transaction
// (CockroachDB's claims run in one, claimInTx), or in a transaction of its
// own whose BEGIN carries the settings (PostgreSQL's single-statement
// claims: one more round trip, the COMMIT). PostgreSQL and CockroachDB
// stop a statement past statement_timeout with SQLSTATE 57014, which rolls
// the claim back: the heads it locked are free again. (CockroachDB docs
// checked: "SET {session variable}", SET LOCAL since v21.2.)
//
// On PostgreSQL the transaction also turns JIT compilation off: the
// planner costs a sequenced claim as if it read the queue's whole backlog
// (its per-candidate SubPlans times every candidate; the LIMIT ends it
// sooner), which passes jit_above_cost on a backlog of a few thousand
// items, and compiling the statement then cost more than running it (a
// measured 100–600 ms per claim).
func (q *Queue) boundedSequenced(ctx context.Context, e *engine, db crsql.DB, claim func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error)) ([]store.ClaimedRow, error) {
	bound := q.opts.SequencedClaimTimeout
	var sets []string
	if bound >= 0 {
		sets = append(sets, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(bound.Milliseconds(), 1)))
	}
	if e.dialect == store.Postgres {
		sets = append(sets, "SET LOCAL jit = off")
	}
	if len(sets) == 0 {
		return claim(ctx, db)
	}
	set := strings.Join(sets, "; ")
	var rows []store.ClaimedRow
	var err error
	if tx, ok := db.(pgx.Tx); ok {
		if _, err = tx.Exec(ctx, set); err == nil {
			rows, err = claim(ctx, tx)
		}
	} else {
		var tx pgx.Tx
		tx, err = q.db.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + set})
		if err == nil {
			if rows, err = claim(ctx, tx); err == nil {
				err = tx.Commit(ctx)
			} else {
				_ = tx.Rollback(context.WithoutCancel(ctx))
			}
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil && bound >= 0 {
		return nil, fmt.Errorf("%w (%v): %w", ErrSequencedClaimTimeout, bound, err)
	}
	return rows, err
}

// sequenceGuard wraps a claim: it picks the sequenced statement or the
// plain one at each attempt (sequenced, plain), runs the sequenced one
// under its bound (boundedSequenced), and turns a unique violation on the
// index of claimed sequenced keys into a retryable sequenceConflict, after
// which the Queue claims sequenced (until its next read of the queue's
// sequencing).
func (q *Queue) sequenceGuard(e *engine, sequenced, plain func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error)) func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
	return func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
		claim := plain
		if q.sequenced(ctx) {
			claim = func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
				return q.boundedSequenced(ctx, e, db, sequenced)
			}
		}
		rows, err := claim(ctx, db)
		if err != nil && q.store.ItemsIsSequenceConflict(err) {
			q.seq.on.Store(true)
			q.seq.until.Store(time.Now().Add(sequencedTTL).UnixNano())
			return nil, sequenceConflict{err}
		}
		return rows, err
	}
}

// claimManyPartsSequenced is claimManyParts for a sequenced queue: the
// sequenced per-part claim, one statement per group of
// store.MaxPartBranches parts, each for what the groups before it left of
// a.Limit. (Order across parts is relaxed anyway; within a key it is kept,
// since a key's items share a part and every claim tests the key's head.)
func (q *Queue) claimManyPartsSequenced(ctx context.Context, e *engine, session uuid.UUID, a store.ClaimArgs, parts []int64) ([]Item, error) {
	var all []Item
	for start := 0; start < len(parts) && len(all) < a.Limit; start += store.MaxPartBranches {
		group := parts[start:min(start+store.MaxPartBranches, len(parts))]
		ga := a
		ga.Limit = a.Limit - len(all)
		items, err := q.runClaim(ctx, e, session, "claiming", q.sequenceGuard(e, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimPartsSequenced(ctx, db, e.dialect, ga, group)
		}, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimParts(ctx, db, e.dialect, ga, group)
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

// claimsSequenced (queuemaint.Queue.ClaimsSequenced) reports whether the Queue's claims are sequenced, as it
// last read (at most a second before its last claim): the queue is
// sequenced or holds sequenced items. Package worker claims again as soon
// as an item ends in such a queue (its key's next item may be claimable
// at once) rather than at its idle poll. It does no I/O.
func (q *Queue) claimsSequenced() bool { return q.seq.on.Load() }
