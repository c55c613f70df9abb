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

// requeueCancelled is Requeue with o.Cancelled.
func (q *Queue) requeueCancelled(ctx context.Context, o RequeueOptions) (RequeueResult, error) {
	kind := o.Filter.Kind
	switch {
	case o.Filter != (DeadFilter{Kind: kind}) || o.Death != uuid.Nil:
		return RequeueResult{}, fmt.Errorf("claim: requeueing cancelled items of %q: a Filter (but its Kind) or a Death selects dead items, not cancelled ones", q.opts.Queue)
	case o.ID != uuid.Nil && (o.All || kind != ""):
		return RequeueResult{}, fmt.Errorf("claim: requeueing cancelled item %s of %q: set the ID, or All or a Filter.Kind, not both", o.ID, q.opts.Queue)
	case o.ID == uuid.Nil && !o.All && kind == "":
		return RequeueResult{}, fmt.Errorf("claim: requeueing cancelled items of %q: no ID, All or Filter.Kind: nothing selected", q.opts.Queue)
	}
	if err := q.ready(ctx); err != nil {
		return RequeueResult{}, fmt.Errorf("claim: requeueing cancelled items of %q: %w", q.opts.Queue, err)
	}
	if o.ID != uuid.Nil {
		moved, err := q.requeueOneCancelled(ctx, o.ID)
		if moved {
			return RequeueResult{Requeued: 1}, err
		}
		return RequeueResult{}, err
	}
	var res RequeueResult
	var afterAt time.Time
	var afterID uuid.UUID
	for {
		var page []store.KeptCancelled
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			page, err = q.store.CancelledList(ctx, q.db, q.opts.Queue, kind, afterAt, afterID, RequeueBatch)
			return store.Classify(err)
		})
		if err != nil {
			return res, fmt.Errorf("claim: listing the cancelled items of %q: %w", q.opts.Queue, err)
		}
		for _, k := range page {
			moved, err := q.requeueOneCancelled(ctx, k.ID)
			switch {
			case errors.Is(err, ErrItemLive):
				res.Live++
			case errors.Is(err, ErrNotKept):
				res.Gone++
			case itemFault(err):
				res.Refused++
				if len(res.RefusedIDs) < MaxRefusedIDs {
					res.RefusedIDs = append(res.RefusedIDs, k.ID)
				}
			case err != nil:
				return res, err
			case moved:
				res.Requeued++
			default:
				res.Gone++
			}
		}
		if o.Progress != nil {
			o.Progress(res)
		}
		if len(page) < RequeueBatch {
			return res, nil
		}
		afterAt, afterID = page[len(page)-1].CancelledAt, page[len(page)-1].ID
	}
}

// requeueOneCancelled moves the cancelled item id kept by the queue back
// into it, in one statement in a SERIALIZABLE transaction.
func (q *Queue) requeueOneCancelled(ctx context.Context, id uuid.UUID) (bool, error) {
	var r store.CancelledRequeueResult
	err := retry.Tx(ctx, q.db, q.stats.retried("requeue"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		r, err = q.store.CancelledRequeue(ctx, tx, id, q.opts.Queue)
		if err == nil && r.Moved && q.notifies() {
			err = q.store.Notify(ctx, tx, q.channel, "")
		}
		return store.Classify(err)
	})
	what := fmt.Sprintf("claim: requeueing cancelled item %s of %q", id, q.opts.Queue)
	switch {
	case err != nil:
		return false, fmt.Errorf("%s: %w", what, err)
	case r.Moved:
		q.stats.enqueued.Add(1)
		q.Wake()
		return true, nil
	case r.Live && r.Waiting:
		return false, fmt.Errorf("%s: %w: it is a waiting item of queue %q", what, ErrItemLive, r.LiveQueue)
	case r.Live:
		return false, fmt.Errorf("%s: %w: it is an item of queue %q, in the items table (enqueued again, or requeued already)", what, ErrItemLive, r.LiveQueue)
	case r.Kept:
		return false, fmt.Errorf("%s: %w: its ended record says %q, not cancelled (it ran again since)", what, ErrNotKept, r.Outcome)
	case r.Outcome == store.OutcomeCancelled:
		return false, fmt.Errorf("%s: %w: it was cancelled while it waited for prerequisites, by code older than schema version 6, or in a queue that keeps nothing", what, ErrNotKept)
	}
	return false, fmt.Errorf("%s: %w: not cancelled within the queue's dedup window", what, ErrNotKept)
}
