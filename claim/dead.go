package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

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

// DeadItem is an item that was moved to the dead-items table: it used up its
// attempts or failed with a Permanent error.
type DeadItem struct {
	ID          uuid.UUID
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

// Dead returns up to limit dead items of this queue, the most recent first.
func (q *Queue) Dead(ctx context.Context, limit int) ([]DeadItem, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim: listing dead items of %q: limit %d must be positive", q.opts.Queue, limit)
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, err)
	}
	var out []DeadItem
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		out = out[:0]
		rows, err := q.db.Query(ctx, q.st.DeadItems, q.opts.Queue, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			d := DeadItem{Queue: q.opts.Queue}
			var key, lastErr, tenant *string
			var part, prio, attempts, maxAttempts int64
			if err := rows.Scan(&d.ID, &part, &key, &prio, &attempts, &maxAttempts, &d.Payload, &d.Metadata,
				&lastErr, &d.EnqueuedAt, &d.DiedAt, &tenant, &d.Reason); err != nil {
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

// Requeue moves a dead item of this queue back into the queue, with its id,
// payload, key and priority, fresh attempts and no delay, and reports
// whether the item was dead. Its part is its old part modulo the queue's
// current number of parts. It is one statement: the item is never in both
// tables, nor in neither.
func (q *Queue) Requeue(ctx context.Context, id uuid.UUID) (bool, error) {
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: requeueing dead item %s of %q: %w", id, q.opts.Queue, err)
	}
	var n int64
	err := retry.Do(ctx, q.stats.retried("requeue"), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, q.st.Requeue, id, q.opts.Queue)
		n = tag.RowsAffected()
		return crsql.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: requeueing dead item %s of %q: %w", id, q.opts.Queue, err)
	}
	if n == 1 {
		q.stats.enqueued.Add(1)
	}
	return n == 1, nil
}
