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
)

// DeadItem is one death of an item: the item was moved to the dead-items
// table because it used up its attempts, failed with a Permanent error or
// passed its deadline. An id may die several times (ids are the caller's, and
// a requeued item may die again): each death is its own DeadItem, told apart
// by Death, and every one is kept until it is requeued.
type DeadItem struct {
	ID uuid.UUID
	// Death is the key of this death among the deaths of ID (the dead
	// items are keyed by (ID, Death)); RequeueOptions.Death takes it.
	Death       uuid.UUID
	Queue       string
	Part        int
	Key         string
	Priority    int
	Attempts    int // attempts made, the last one included
	MaxAttempts int
	Payload     []byte
	Metadata    []byte
	LastError   string // the error of the last attempt
	EnqueuedAt  time.Time
	DiedAt      time.Time
	Tenant      string // "" if none
	// Reason says why it died: ReasonFailed, ReasonPermanent,
	// ReasonCrashLoop, ReasonExpired, ReasonRefused, ReasonCancelled or,
	// for a dependent, ReasonDependencyDied and the prerequisite's id (""
	// for items that died before schema version 3).
	Reason string
	// Kind is the item's kind (NewItem.Kind), "" if none (or if it died
	// under code older than schema version 6); a requeue keeps it.
	Kind string
}

// ErrItemLive is returned by Requeue of one id (RequeueOptions.ID) when the dead item's
// id is live: an item with the id is in the items table (it was enqueued
// again, or requeued already), or a waiting item has it (it was enqueued
// again with prerequisites not yet acked: NewItem.After), in this queue or
// another. An id is live at most once, and the move would take the id from
// the live item (a waiting item's release would then find it taken, and
// be lost). Nothing was moved; the dead item stays. Requeue it once the live
// item has ended, or leave it as history.
var ErrItemLive = errors.New("the id is live: an item or a waiting item has it")

// Reasons of dead items (DeadItem.Reason).
const (
	// ReasonFailed: its attempts were used up by failures (Nack).
	ReasonFailed = "failed"
	// ReasonPermanent: it failed with a Permanent error.
	ReasonPermanent = "permanent"
	// ReasonCrashLoop: its attempts were used up without an ack or a nack
	// (Reap; the handler or its process died on every attempt).
	ReasonCrashLoop = "crash loop"
	// ReasonExpired: its deadline (NewItem.TTL) passed before it was acked
	// (Reap).
	ReasonExpired = "expired"
	// (ReasonRefused, in refused.go: the database refused to move it.)
	// ReasonCancelled: a sequenced item cancelled in a queue whose
	// sequences hold on a death (SettingsUpdate.SequenceHold): it is kept here,
	// holding its key, so that it can be requeued or deleted. (Other
	// cancelled items are not dead items: see Queue.CancelledItems.)
	ReasonCancelled = "cancelled"
)

// listDead runs list, a read of dead items, and returns them as DeadItems.
func (q *Queue) listDead(ctx context.Context, list func(ctx context.Context) ([]store.DeadItemRow, error)) ([]DeadItem, error) {
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, err)
	}
	var rows []store.DeadItemRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = list(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, store.Classify(err))
	}
	var out []DeadItem
	for _, r := range rows {
		out = append(out, DeadItem{ID: r.ID, Death: r.Death, Queue: q.opts.Queue, Part: r.Part, Key: r.Key,
			Priority: r.Priority, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts, Payload: r.Payload,
			Metadata: r.Metadata, LastError: r.LastError, EnqueuedAt: r.EnqueuedAt, DiedAt: r.DiedAt,
			Tenant: r.Tenant, Reason: r.Reason, Kind: r.Kind})
	}
	return out, nil
}

// requeue moves the newest death of the dead item id of this queue (or
// the given death) back into the queue, with its id, payload, key and
// priority, fresh attempts and no delay, and reports whether there was
// one. Its part is its old part modulo the queue's current number of
// parts. Older deaths of the id stay in the dead items, as history.
//
// If the id is live — an item with that id is in the items table (enqueued
// again, or requeued already), or a waiting item has it (enqueued again
// with prerequisites not yet acked), in any queue — nothing moves and the
// error wraps ErrItemLive, saying which. The move is one statement in a
// SERIALIZABLE transaction: the item is never in both tables, nor in
// neither, and never beside a live item or waiting item of its id.
func (q *Queue) requeue(ctx context.Context, id uuid.UUID, death *uuid.UUID) (bool, error) {
	what := fmt.Sprintf("dead item %s", id)
	if death != nil {
		what = fmt.Sprintf("death %s of dead item %s", *death, id)
	}
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: requeueing %s of %q: %w", what, q.opts.Queue, err)
	}
	var r store.RequeueResult // moved, or why not: a live item with the id, the deaths that would have moved
	err := retry.Tx(ctx, q.db, q.stats.retried("requeue"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		r, err = q.store.DeadRequeue(ctx, tx, id, q.opts.Queue, death)
		if err == nil && r.Moved && q.notifies() {
			err = q.store.Notify(ctx, tx, q.channel, "")
		}
		return store.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: requeueing %s of %q: %w", what, q.opts.Queue, err)
	}
	if !r.Moved && r.Live && r.Deaths > 0 {
		if r.Waiting {
			return false, fmt.Errorf("claim: requeueing %s of %q: %w: it is a waiting item of queue %q (enqueued again with prerequisites not yet acked); the dead item stays",
				what, q.opts.Queue, ErrItemLive, r.LiveQueue)
		}
		return false, fmt.Errorf("claim: requeueing %s of %q: %w: it is an item of queue %q, in the items table (enqueued again, or requeued already); the dead item stays",
			what, q.opts.Queue, ErrItemLive, r.LiveQueue)
	}
	moved := r.Moved
	if moved {
		q.stats.enqueued.Add(1)
		q.Wake()
	}
	return moved, nil
}
