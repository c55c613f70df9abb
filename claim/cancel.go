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

// Cancelling items from outside, running ones included (schema version 5).
//
// A cancel of an item no session holds deletes it at once. A cancel of a
// claimed item asks its holder to stop: the request (who, why, when) is
// written on the item, whose claim token moves on, so that no ack, nack,
// snooze or lease extension of the running attempt can commit any more —
// its result is never written, whichever code version runs it. The holder
// (a worker) finds the request at its next heartbeat, or at once through
// the queue's cancel notification on PostgreSQL, cancels the handler's
// context with a *CancelledError (errors.Is(context.Cause(ctx),
// ErrCancelled)), and ends the item when the handler returns
// (EndCancelled). If the holder died or hangs, Reap ends the item once its
// claim is released or its lease has run out; no claim hands it out
// meanwhile. Every end deletes the item and records it as cancelled, with
// who, why and when (Cancelled lists them).

// ErrCancelled is the cause of a handler's context cancelled because its
// item was cancelled from outside: errors.Is(context.Cause(ctx),
// ErrCancelled) tells it from a timeout or a shutdown. The cause itself is
// a *CancelledError, which says who cancelled the item and why.
var ErrCancelled = errors.New("the item was cancelled")

// CancelledError is the cause of a handler's context cancelled because its
// item was cancelled (see ErrCancelled, which it matches with errors.Is).
type CancelledError struct {
	// By and Reason are who cancelled the item and why, as they gave them.
	By, Reason string
	// RequestedAt is when the cancel was asked for (database clock).
	RequestedAt time.Time
}

func (e *CancelledError) Error() string {
	msg := "the item was cancelled"
	if e.By != "" {
		msg += " by " + e.By
	}
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is reports whether target is ErrCancelled.
func (e *CancelledError) Is(target error) bool { return target == ErrCancelled }

// CancelOptions says who cancels and why. Both are free text, stored with
// the cancelled item for operators (Cancelled lists them); the zero value
// stores empty texts.
type CancelOptions struct {
	// By names who cancels (a user, user@host, a service).
	By string
	// Reason says why.
	Reason string
}

// CancelResult is what CancelItem did.
type CancelResult struct {
	// Found reports that the queue had the item.
	Found bool
	// Running reports that a session held the item: its cancel was asked
	// for (or had been asked for already, then AlreadyRequested), and the
	// item ends when its handler stops (see WaitEnded), or when Reap ends
	// it if its holder is gone. False with Found: the item was unclaimed
	// and has ended already.
	Running bool
	// AlreadyRequested reports that a cancel had been asked for before;
	// that earlier request's author and reason stay.
	AlreadyRequested bool
}

// CancelItem cancels item id of this queue. An item no session holds is
// deleted at once and recorded as cancelled. A claimed item is asked to
// stop: the request is written on the item in the same transaction as a
// notification on the queue's cancel channel (PostgreSQL), the claim token
// moves on so that the running attempt's ack can no longer commit
// (ErrClaimLost), and no claim hands the item out again. Its worker
// cancels the handler's context (cause *CancelledError) at its next
// heartbeat, or at once when it receives the notification, and ends the
// item when the handler returns; if that worker is gone, Reap ends it
// once its claim is released or its lease has run out. Running items of
// version-4 workers stop at their next lease extension (their handlers see
// a lost claim); see docs/cancel-and-snooze.md.
func (q *Queue) CancelItem(ctx context.Context, id uuid.UUID, o CancelOptions) (CancelResult, error) {
	if err := q.ready(ctx); err != nil {
		return CancelResult{}, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	by, reason := safeText(o.By), safeText(o.Reason)
	var state store.CancelState
	err := retry.Tx(ctx, q.db, q.stats.retried("cancel"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		state, err = q.store.ItemsCancelItem(ctx, tx, id, q.opts.Queue, by, reason)
		if err == nil && state == store.CancelRequested && q.notifiesCancels() {
			err = q.store.Notify(ctx, tx, q.store.NotifyCancelChannel(q.opts.Queue), "")
		}
		return store.Classify(err)
	})
	if err != nil {
		return CancelResult{}, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	switch state {
	case store.CancelEnded:
		q.stats.cancelled.Add(1)
		return CancelResult{Found: true}, nil
	case store.CancelRequested:
		return CancelResult{Found: true, Running: true}, nil
	case store.CancelAlreadyRequested:
		return CancelResult{Found: true, Running: true, AlreadyRequested: true}, nil
	}
	// Not in the items: a waiting item (NewItem.After) is cancelled too,
	// and the items that wait for it end, dead (depends.go).
	existed, err := q.cancelWaiting(ctx, id)
	if err != nil {
		return CancelResult{}, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	return CancelResult{Found: existed}, nil
}

// notifiesCancels reports whether cancel requests notify: on PostgreSQL,
// unless the queue's notifications are off (Options.NoNotify).
func (q *Queue) notifiesCancels() bool { return q.notifies() }

// cancelChannel (queuemaint.Queue.CancelChannel) returns the name of the PostgreSQL notification channel
// on which CancelItem announces cancel requests of this queue's running
// items (workers listen on it unless their Options.NoWake is set).
func (q *Queue) cancelChannel() string { return q.store.NotifyCancelChannel(q.opts.Queue) }

// EndCancelled ends it, an item whose cancel was asked for while this
// claim held it: it deletes the item and records it as cancelled. It
// returns an error wrapping ErrClaimLost when the item is not (or no
// longer) such an item of this claim: no cancel was asked for, another
// session holds it, or it has ended already. A worker calls it when the
// handler of a cancelled item returns, and after an ack, nack or snooze
// refused with ErrClaimLost (the cancel may have come after the handler
// returned).
func (q *Queue) EndCancelled(ctx context.Context, it Item) error {
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: ending cancelled item %s: %w", it.ID, err)
	}
	k := it.claimKey()
	k.Token++ // the request moved the token on by one
	err := q.update(ctx, "cancel", func(ctx context.Context) (bool, error) { return q.store.ItemsCancelEnd(ctx, q.db, k) })
	if err != nil {
		return fmt.Errorf("claim: ending cancelled item %s: %w", it.ID, err)
	}
	q.stats.cancelled.Add(1)
	q.stats.cancelledRunning.Add(1)
	return nil
}

// maxCancelChecks bounds the cancel requests one CancelRequests returns.
const maxCancelChecks = 1000

// CancelRequests returns the items this session holds whose cancel was
// asked for (at most 1,000; the rest at the next call), each with the
// cause its handler's context is to be cancelled with. Token is the
// claim's token the request replaced (Item.Token of the session's copy):
// a request whose Token differs from the caller's item is of another
// claim. A worker calls it at every heartbeat and on a cancel
// notification; it reads only the queue's cancel-requested items, through
// their own (normally empty) index.
func (c Claimer) CancelRequests(ctx context.Context) ([]CancelRequest, error) {
	q := c.q
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: reading cancel requests in %q: %w", q.opts.Queue, err)
	}
	var rows []store.CancelRequest
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = q.store.ItemsCancelsOfSession(ctx, q.db, q.opts.Queue, c.session, maxCancelChecks)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim: reading cancel requests in %q: %w", q.opts.Queue, err)
	}
	out := make([]CancelRequest, len(rows))
	for i, r := range rows {
		out[i] = CancelRequest{ID: r.ID, Token: r.Token - 1,
			Cause: &CancelledError{By: r.By, Reason: r.Reason, RequestedAt: r.RequestedAt}}
	}
	return out, nil
}

// CancelRequest is a cancel asked of an item a session holds (see
// Claimer.CancelRequests).
type CancelRequest struct {
	ID uuid.UUID
	// Token is the token of the claim that was asked to stop.
	Token int64
	// Cause is what the handler's context is to be cancelled with.
	Cause *CancelledError
}

// CancelledItem is an item that ended cancelled (see CancelledItems).
type CancelledItem struct {
	ID uuid.UUID
	// EndedAt is when it ended (database clock).
	EndedAt time.Time
	// By and Reason are who cancelled it and why, as given to CancelItem.
	By, Reason string
	// RequestedAt is when the cancel was asked for (zero for items
	// cancelled by older versions).
	RequestedAt time.Time
	// WasRunning reports that a session held it when it was cancelled: its
	// handler was stopped, and its result not written.
	WasRunning bool
	// Kind is its kind (NewItem.Kind), "" if none or if its cancel kept
	// nothing (a queue whose dedup window is zero, code older than schema
	// version 6).
	Kind string
}

// CancelledQuery asks CancelledItems for one page of cancelled items. The
// zero value asks for the first DefaultListLimit of them.
type CancelledQuery struct {
	// After is the cursor of the previous page (CancelledPage.Next); ""
	// for the first page.
	After string
	// Limit is the most items in the page (0: DefaultListLimit).
	Limit int
	// Kind, if set, lists only the cancelled items of this kind.
	Kind string
}

// CancelledPage is one page of CancelledItems.
type CancelledPage struct {
	// Items are the cancelled items, the most recent end first.
	Items []CancelledItem
	// Next is the cursor of the next page: "" when this page is the last.
	Next string
}

// CancelledItems returns one page of the items of this queue that ended
// cancelled, the most recent first. Page on by passing the page's Next as
// the next query's After. They are kept, as every ended id, for the
// queue's dedup window (Policy.DedupWindow, default 24 h) and then
// pruned by the workers' reaper; a queue whose window is zero keeps none.
func (q *Queue) CancelledItems(ctx context.Context, cq CancelledQuery) (CancelledPage, error) {
	what := fmt.Sprintf("claim: listing the cancelled items of %q", q.opts.Queue)
	switch {
	case cq.Limit < 0:
		return CancelledPage{}, fmt.Errorf("%s: limit %d must not be negative (0: %d)", what, cq.Limit, DefaultListLimit)
	case cq.Limit == 0:
		cq.Limit = DefaultListLimit
	}
	var pos *store.CancelledRow
	if cq.After != "" {
		p, err := decodeCursor(cq.After)
		if err != nil || p.Death != uuid.Nil {
			return CancelledPage{}, fmt.Errorf("%s: cursor %q: %w", what, cq.After, ErrBadCursor)
		}
		pos = &store.CancelledRow{ID: p.ID, EndedAt: p.DiedAt}
	}
	if err := q.ready(ctx); err != nil {
		return CancelledPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var rows []store.CancelledRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		// One more than asked: whether a next page exists.
		rows, err = q.store.ItemsCancelled(ctx, q.db, q.opts.Queue, cq.Kind, pos, cq.Limit+1)
		return store.Classify(err)
	})
	if err != nil {
		return CancelledPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var page CancelledPage
	if len(rows) > cq.Limit {
		rows = rows[:cq.Limit]
		last := rows[cq.Limit-1]
		page.Next = encodeCursor(store.DeadPosition{DiedAt: last.EndedAt, ID: last.ID})
	}
	page.Items = make([]CancelledItem, len(rows))
	for i, r := range rows {
		page.Items[i] = CancelledItem(r)
	}
	return page, nil
}

// WaitEnded waits until this queue has no item id any more, checking
// every poll (at least 10 ms), and returns the outcome its end recorded:
// "acked", "dead", "cancelled" or "taken" ("" when none is recorded: the
// queue's dedup window is zero, or the record was pruned). It returns
// ctx's error when ctx ends first. After CancelItem of a running item, it
// returns once the handler stopped and the item ended (or was acked just
// before the request: then "acked").
func (q *Queue) WaitEnded(ctx context.Context, id uuid.UUID, poll time.Duration) (string, error) {
	if err := q.ready(ctx); err != nil {
		return "", fmt.Errorf("claim: waiting for item %s: %w", id, err)
	}
	poll = max(poll, 10*time.Millisecond)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		var ended bool
		var outcome string
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			ended, outcome, err = q.store.EndedOutcome(ctx, q.db, q.opts.Queue, id)
			return store.Classify(err)
		})
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", fmt.Errorf("claim: waiting for item %s: %w", id, err)
		}
		if ended {
			return outcome, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
}

// cancelSnoozeCounts counts the queue's snoozed and cancelling items
// (QueueInfo.Snoozed, Cancelling), through their own partial indexes (each
// read covers only those items).
func (q *Queue) cancelSnoozeCounts(ctx context.Context) (snoozed, cancelling int64, err error) {
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		snoozed, cancelling, err = q.store.ItemsCancelSnoozeCounts(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("claim: counting snoozed items of %q: %w", q.opts.Queue, err)
	}
	return snoozed, cancelling, nil
}

// reapCancelled ends, in bounded batches, the queue's cancel-requested
// items that no handler will end (their claim released, or their lease
// run out), and returns how many, with the items the database refused to
// end (see reapMoves: each is ended as refused, or left, reported).
func (q *Queue) reapCancelled(ctx context.Context) (int, []*ReapError, error) {
	total := 0
	s, name := q.store, q.opts.Queue
	stuck, err := q.reapMoves(ctx, reapMove{step: StepCancelled, count: &total,
		batch: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return s.ItemsReapCancelled(ctx, tx, name, reapBatch)
		},
		candidates: s.ItemsReapCancelledCandidates,
		byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
			return s.ItemsReapCancelledIDs(ctx, tx, name, ids)
		}})
	q.stats.cancelled.Add(int64(total))
	q.stats.cancelledRunning.Add(int64(total))
	return total, stuck, err
}
