package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Cancel deletes an item of this queue whether or not it is claimed, and
// reports whether it existed. A claimed item's pending ack then fails with
// ErrClaimLost.
func (q *Queue) Cancel(ctx context.Context, id uuid.UUID) (bool, error) {
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	var n int64
	err := retry.Do(ctx, q.stats.retried("cancel"), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, q.st.Cancel, id, q.opts.Queue)
		n = tag.RowsAffected()
		return crsql.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	return n == 1, nil
}

// DeadItem is one death of an item: the item was moved to the dead-items
// table because it used up its attempts, failed with a Permanent error or
// passed its deadline. An id may die several times (ids are the caller's, and
// a requeued item may die again): each death is its own DeadItem, told apart
// by Death, and every one is kept until it is requeued.
type DeadItem struct {
	ID uuid.UUID
	// Death is the key of this death among the deaths of ID (the dead
	// items are keyed by (ID, Death)); RequeueDeath takes it.
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
	// ReasonCrashLoop or ReasonExpired ("" for items that died before
	// schema version 3).
	Reason string
}

// ErrItemLive is returned by Requeue and RequeueDeath when an item with the
// dead item's id is in the items table (it was enqueued again, or requeued
// already): an id is in the items table at most once. Nothing was moved;
// the dead item stays. Requeue it once the live item has ended, or leave it
// as history.
var ErrItemLive = errors.New("an item with this id is in the items table")

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
)

// Dead returns up to limit dead items of this queue, the most recent death
// first (by died_at, then id and death, all descending). Every death is
// listed: an id that died twice has two entries, told apart by Death.
// DeadBefore returns the next page.
func (q *Queue) Dead(ctx context.Context, limit int) ([]DeadItem, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim: listing dead items of %q: limit %d must be positive", q.opts.Queue, limit)
	}
	return q.listDead(ctx, q.st.DeadItems, q.opts.Queue, limit)
}

// DeadBefore returns up to limit dead items of this queue that come after
// last in Dead's order (older deaths): the page after the one that ended with
// last. Only last's DiedAt, ID and Death are read; it need not exist any more
// (requeued since, say).
func (q *Queue) DeadBefore(ctx context.Context, last DeadItem, limit int) ([]DeadItem, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim: listing dead items of %q: limit %d must be positive", q.opts.Queue, limit)
	}
	return q.listDead(ctx, q.dst.DeadItemsBefore, q.opts.Queue, last.DiedAt, last.ID, last.Death, limit)
}

// listDead runs a statement that returns dead item columns.
func (q *Queue) listDead(ctx context.Context, stmt string, args ...any) ([]DeadItem, error) {
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, err)
	}
	var out []DeadItem
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		out = out[:0]
		rows, err := q.db.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			d := DeadItem{Queue: q.opts.Queue}
			var key, lastErr, tenant *string
			var part, prio, attempts, maxAttempts int64
			if err := rows.Scan(&d.ID, &part, &key, &prio, &attempts, &maxAttempts, &d.Payload, &d.Metadata,
				&lastErr, &d.EnqueuedAt, &d.DiedAt, &tenant, &d.Reason, &d.Death); err != nil {
				return err
			}
			d.Part, d.Priority, d.Attempts, d.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
			if key != nil {
				d.Key = *key
			}
			if lastErr != nil {
				d.LastError = *lastErr
			}
			if tenant != nil {
				d.Tenant = *tenant
			}
			out = append(out, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, crsql.Classify(err))
	}
	return out, nil
}

// Requeue moves the newest death of the dead item id of this queue back into
// the queue, with its id, payload, key and priority, fresh attempts and no
// delay, and reports whether there was one. Its part is its old part modulo
// the queue's current number of parts. Older deaths of the id stay in the
// dead items, as history (Dead lists them; RequeueDeath requeues one).
//
// If an item with that id is in the items table (live: enqueued again, or
// requeued already), nothing moves and the error wraps ErrItemLive. The move
// is one statement in a SERIALIZABLE transaction: the item is never in both
// tables, nor in neither.
func (q *Queue) Requeue(ctx context.Context, id uuid.UUID) (bool, error) {
	return q.requeue(ctx, id, nil)
}

// RequeueDeath is Requeue for one given death of id (DeadItem.Death), which
// need not be the newest.
func (q *Queue) RequeueDeath(ctx context.Context, id, death uuid.UUID) (bool, error) {
	return q.requeue(ctx, id, &death)
}

func (q *Queue) requeue(ctx context.Context, id uuid.UUID, death *uuid.UUID) (bool, error) {
	what := fmt.Sprintf("dead item %s", id)
	if death != nil {
		what = fmt.Sprintf("death %s of dead item %s", *death, id)
	}
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: requeueing %s of %q: %w", what, q.opts.Queue, err)
	}
	var moved bool
	var liveIn *string // the queue of the live item with the id, if any
	var deaths int64   // the deaths that would have been requeued
	err := retry.Tx(ctx, q.db, q.stats.retried("requeue"), func(ctx context.Context, tx pgx.Tx) error {
		moved, liveIn, deaths = false, nil, 0
		tag, err := tx.Exec(ctx, q.st.Requeue, id, q.opts.Queue, death)
		if err != nil {
			return crsql.Classify(err)
		}
		if moved = tag.RowsAffected() == 1; moved {
			return nil
		}
		return crsql.Classify(tx.QueryRow(ctx, q.dst.RequeueState, id, q.opts.Queue, death).Scan(&liveIn, &deaths))
	})
	if err != nil {
		return false, fmt.Errorf("claim: requeueing %s of %q: %w", what, q.opts.Queue, err)
	}
	if !moved && liveIn != nil && deaths > 0 {
		return false, fmt.Errorf("claim: requeueing %s of %q: %w (queue %q); the dead item stays", what, q.opts.Queue, ErrItemLive, *liveIn)
	}
	if moved {
		q.stats.enqueued.Add(1)
	}
	return moved, nil
}
