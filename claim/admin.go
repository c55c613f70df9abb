package claim

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The operator's side of a queue: dead items filtered, paged and counted,
// requeue by filter, purge, and the known-queue check. The crdbwork command
// is built on these; scripts can call them too.

// DeadFilter selects dead items (see DeadQuery and RequeueOptions):
// every field that is set must match; the zero value matches every dead
// item of the queue.
type DeadFilter struct {
	// Tenant is the tenant's name, exactly.
	Tenant string
	// Reason is the reason of death (see Reasons and MatchReason): one
	// of "failed", "permanent", "crash loop", "expired", "snoozed too
	// often", "cancelled", "refused by the database", exactly; or
	// "dependency died", every death of a dependent whose prerequisite
	// ended without an ack, or "dependency died: <id>" (or the id's
	// start), those of one prerequisite. Another reason is refused with
	// ErrUnknownReason.
	Reason string
	// ErrorContains is a substring of the last error (case-sensitive).
	ErrorContains string
	// Kind is the item's kind (NewItem.Kind), exactly; "" matches every
	// kind (and items without one).
	Kind string
}

// row returns the filter as the store takes it: the reason as the prefix
// of the reasons it matches.
func (f DeadFilter) row() (store.DeadFilter, error) {
	p, err := reasonPrefix(f.Reason)
	if err != nil {
		return store.DeadFilter{}, err
	}
	row := store.DeadFilter{Tenant: f.Tenant, ReasonPrefix: p, ErrorContains: f.ErrorContains, Kind: f.Kind}
	if prefix, kind, ok := kindFilter(p); ok {
		// "unknown kind: mail" is the reason of the dead items of kind
		// mail that Nack wrote it for: matched by the kind column, exactly
		// (as a prefix, "a" would match kind "ab" too).
		if f.Kind != "" && f.Kind != kind {
			return store.DeadFilter{}, fmt.Errorf("reason %q and kind %q: %w: the reason names another kind", f.Reason, f.Kind, ErrUnknownReason)
		}
		row.ReasonPrefix, row.Kind = prefix, kind
	}
	return row, nil
}

// DeadQuery asks DeadItems for one page of dead items. The zero value
// asks for the first DefaultListLimit deaths of the queue.
type DeadQuery struct {
	DeadFilter
	// After is the cursor of the previous page (DeadPage.Next); "" for the
	// first page.
	After string
	// Limit is the most items in the page (0: DefaultListLimit).
	Limit int
	// Count asks for the number of the queue's deaths that match the
	// filter, all pages together (DeadPage.Count): one more read of the
	// queue's entries of the dead items' index and the rows they point to.
	Count bool
}

// DefaultListLimit is the page size of DeadItems, CancelledItems and Items when
// their query sets no Limit.
const DefaultListLimit = 100

// DeadPage is one page of DeadItems.
type DeadPage struct {
	// Items are the deaths, the most recent first (by died_at, then id and
	// death, all descending, as Dead).
	Items []DeadItem
	// Next is the cursor of the next page: "" when this page is the last.
	// Deaths that happen while a caller pages are newer than its cursor and
	// are not in the pages that follow; deaths requeued meanwhile drop out.
	Next string
	// Count is the number of deaths that match the filter (an id that
	// died twice counts twice), when the query asked for it (DeadQuery.Count).
	Count int64
}

// ErrBadCursor is returned by DeadItems, CancelledItems and Items for a
// cursor they did not make.
var ErrBadCursor = errors.New("not a cursor of DeadItems")

// DeadItems returns one page of the dead items of this queue that match
// the query's filter, the most recent death first. Page on by passing the
// page's Next as the next query's After: the pages have no gaps and no
// repeats, whatever is requeued meanwhile. Each page reads the queue's
// entries of the dead items' index (queue, died_at) from the cursor on,
// until Limit match. Every death is listed: an id that died twice has two
// entries, told apart by DeadItem.Death.
func (q *Queue) DeadItems(ctx context.Context, dq DeadQuery) (DeadPage, error) {
	what := fmt.Sprintf("claim: listing dead items of %q", q.opts.Queue)
	switch {
	case dq.Limit < 0:
		return DeadPage{}, fmt.Errorf("%s: limit %d must not be negative (0: %d)", what, dq.Limit, DefaultListLimit)
	case dq.Limit == 0:
		dq.Limit = DefaultListLimit
	}
	var after *store.DeadPosition
	if dq.After != "" {
		p, err := decodeCursor(dq.After)
		if err != nil {
			return DeadPage{}, fmt.Errorf("%s: cursor %q: %w", what, dq.After, err)
		}
		after = &p
	}
	filter, err := dq.DeadFilter.row()
	if err != nil {
		return DeadPage{}, fmt.Errorf("%s: %w", what, err)
	}
	// One more than asked: whether a next page exists.
	items, err := q.listDead(ctx, func(ctx context.Context) ([]store.DeadItemRow, error) {
		return q.store.DeadPageFilter(ctx, q.db, q.opts.Queue, filter, after, dq.Limit+1)
	})
	if err != nil {
		return DeadPage{}, err
	}
	var page DeadPage
	if dq.Count {
		if page.Count, err = q.countDead(ctx, dq.DeadFilter); err != nil {
			return DeadPage{}, err
		}
	}
	if len(items) <= dq.Limit {
		page.Items = items
		return page, nil
	}
	last := items[dq.Limit-1]
	page.Items, page.Next = items[:dq.Limit], encodeCursor(store.DeadPosition{DiedAt: last.DiedAt, ID: last.ID, Death: last.Death})
	return page, nil
}

// encodeCursor writes a position as an opaque token.
func encodeCursor(p store.DeadPosition) string {
	raw := fmt.Sprintf("%d.%s.%s", p.DiedAt.UnixMicro(), p.ID, p.Death)
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// decodeCursor reads encodeCursor's token.
func decodeCursor(s string) (store.DeadPosition, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.DeadPosition{}, ErrBadCursor
	}
	fields := strings.Split(string(raw), ".")
	if len(fields) != 3 {
		return store.DeadPosition{}, ErrBadCursor
	}
	var micros int64
	if _, err := fmt.Sscan(fields[0], &micros); err != nil {
		return store.DeadPosition{}, ErrBadCursor
	}
	id, err1 := uuid.Parse(fields[1])
	death, err2 := uuid.Parse(fields[2])
	if err1 != nil || err2 != nil {
		return store.DeadPosition{}, ErrBadCursor
	}
	return store.DeadPosition{DiedAt: time.UnixMicro(micros).UTC(), ID: id, Death: death}, nil
}

// countDead counts the deaths of this queue that match f (DeadQuery.Count).
func (q *Queue) countDead(ctx context.Context, f DeadFilter) (int64, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: counting dead items of %q: %w", q.opts.Queue, err)
	}
	filter, err := f.row()
	if err != nil {
		return 0, fmt.Errorf("claim: counting dead items of %q: %w", q.opts.Queue, err)
	}
	var n int64
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		n, err = q.store.DeadCount(ctx, q.db, q.opts.Queue, filter)
		return store.Classify(err)
	})
	if err != nil {
		return 0, fmt.Errorf("claim: counting dead items of %q: %w", q.opts.Queue, err)
	}
	return n, nil
}

// RequeueOptions says which dead items Requeue moves back into the queue:
// one id (ID, and Death for one given death of it), the dead ids whose
// deaths match Filter, or, with All, every dead id of the queue. The zero
// value selects nothing, and Requeue refuses it.
type RequeueOptions struct {
	// ID is the dead item to requeue: the newest of its deaths, or Death.
	ID uuid.UUID
	// Death is one given death of ID (DeadItem.Death), which need not be
	// the newest (uuid.Nil: the newest). It needs ID.
	Death uuid.UUID
	// Filter selects the dead ids to requeue, when ID is not set: each id
	// with a death that matches (the zero filter matches nothing unless
	// All is set).
	Filter DeadFilter
	// All requeues every dead id of the queue (Filter must then be zero).
	All bool
	// Progress, if not nil, is called after each page of a requeue by
	// Filter or All with the totals so far.
	Progress func(RequeueResult)
	// Cancelled requeues cancelled items instead of dead ones (River's
	// JobRetry of a cancelled job, pg-boss's resume): with ID, that
	// cancelled item; with All, every cancelled item the queue kept.
	// A cancel keeps the item (payload, metadata, key, tenant, priority,
	// headers, attempt limit) for the queue's dedup window, beside its
	// ended record; a requeue moves it back with fresh attempts and no
	// delay and deletes the ended record, so that the id is live again
	// (an enqueue of it is a live duplicate). Death must be zero, and so
	// must Filter but its Kind: with Filter.Kind (and no ID), every kept
	// cancelled item of that kind. A cancelled item that holds its sequence key is a dead item:
	// requeue it without Cancelled. Items cancelled by code older than
	// schema version 6, or while they were waiting for prerequisites,
	// are not kept: Requeue of such an ID fails with ErrNotKept.
	Cancelled bool
}

// ErrNotKept is returned by Requeue with RequeueOptions.Cancelled and an ID
// when the queue kept no cancelled item of that id: it was not cancelled,
// was cancelled longer ago than the queue's dedup window, while it waited
// for prerequisites, or by code older than schema version 6, or it ran
// again since (the id was enqueued again).
var ErrNotKept = errors.New("no cancelled item of the id is kept")

// RequeueResult is what Requeue did.
type RequeueResult struct {
	// Requeued is the number of ids moved back into the queue.
	Requeued int
	// Live is the number of dead ids left where they are because the id is
	// live: an item with the id is in the items table, or a waiting item
	// has it (see ErrItemLive).
	Live int
	// Gone is the number of dead ids that were requeued or purged by
	// someone else between the read of their page and their requeue.
	Gone int
	// Refused is the number of dead ids whose move the database refused
	// for something about the row (a key or tenant too long for the
	// items' indexes, written by raw SQL or an older version; a
	// constraint; a trigger): each stays dead, and the requeue goes on
	// with the others. RefusedIDs are the first MaxRefusedIDs of them
	// (Requeue of one ID says why it is refused).
	Refused    int
	RefusedIDs []uuid.UUID
}

// MaxRefusedIDs bounds RequeueResult.RefusedIDs.
const MaxRefusedIDs = 100

// RequeueBatch is how many dead items Requeue by filter reads per page.
const RequeueBatch = 500

// Requeue moves dead items of this queue back into it, with their id,
// payload, key and priority, fresh attempts and no delay; each one's part
// is its old part modulo the queue's current number of parts, and older
// deaths of a requeued id stay in the dead items, as history.
//
// With o.ID it requeues that id's newest death (or o.Death) in one
// statement in a SERIALIZABLE transaction, so the item is never in both
// tables, nor in neither, and never beside a live item of its id:
// Requeued is 1, or 0 when the queue has no such dead item. If the id is
// live (an item or a waiting item has it, in any queue) nothing moves and
// the error wraps ErrItemLive, saying which.
//
// With o.Filter (or o.All) it requeues the newest death of every dead id
// with a matching death, reading the dead items a page of RequeueBatch at
// a time, newest first, and moving each id in its own short transaction,
// so that no transaction grows with the number of dead items. An id is
// requeued once; ids that are live are skipped and counted (Live). Items
// that die while it runs are newer than its first page and are not
// requeued. An id whose move the database refuses for something about its
// row stays dead, counted in Refused, and the requeue goes on. On an error
// the result says what was done before it.
func (q *Queue) Requeue(ctx context.Context, o RequeueOptions) (RequeueResult, error) {
	zeroFilter := o.Filter == (DeadFilter{})
	if o.Cancelled {
		return q.requeueCancelled(ctx, o)
	}
	switch {
	case o.ID == uuid.Nil && o.Death != uuid.Nil:
		return RequeueResult{}, fmt.Errorf("claim: requeueing death %s of %q: RequeueOptions.Death needs the ID", o.Death, q.opts.Queue)
	case o.ID != uuid.Nil && (!zeroFilter || o.All):
		return RequeueResult{}, fmt.Errorf("claim: requeueing dead item %s of %q: set the ID, or a Filter or All, not both", o.ID, q.opts.Queue)
	case o.All && !zeroFilter:
		return RequeueResult{}, fmt.Errorf("claim: requeueing dead items of %q: All with a Filter: set one or the other", q.opts.Queue)
	case o.ID == uuid.Nil && zeroFilter && !o.All:
		return RequeueResult{}, fmt.Errorf("claim: requeueing dead items of %q: no ID, Filter or All: nothing selected", q.opts.Queue)
	case o.ID != uuid.Nil:
		var death *uuid.UUID
		if o.Death != uuid.Nil {
			death = &o.Death
		}
		moved, err := q.requeue(ctx, o.ID, death)
		if moved {
			return RequeueResult{Requeued: 1}, err
		}
		return RequeueResult{}, err
	}
	return q.requeueWhere(ctx, o.Filter, o.Progress)
}

// requeueWhere is Requeue by filter.
func (q *Queue) requeueWhere(ctx context.Context, f DeadFilter, progress func(RequeueResult)) (RequeueResult, error) {
	var res RequeueResult
	seen := map[uuid.UUID]bool{}
	query := DeadQuery{DeadFilter: f, Limit: RequeueBatch}
	for {
		page, err := q.DeadItems(ctx, query)
		if err != nil {
			return res, err
		}
		for _, d := range page.Items {
			if seen[d.ID] {
				continue
			}
			seen[d.ID] = true
			ok, err := q.requeue(ctx, d.ID, nil)
			switch {
			case errors.Is(err, ErrItemLive):
				res.Live++
			case itemFault(err):
				// This row alone is refused: it stays dead, the rest
				// goes on.
				res.Refused++
				if len(res.RefusedIDs) < MaxRefusedIDs {
					res.RefusedIDs = append(res.RefusedIDs, d.ID)
				}
			case err != nil:
				return res, err
			case ok:
				res.Requeued++
			default:
				res.Gone++
			}
		}
		if progress != nil {
			progress(res)
		}
		if page.Next == "" {
			return res, nil
		}
		query.After = page.Next
	}
}

// PurgeOptions says how Purge runs.
type PurgeOptions struct {
	// DryRun counts what Purge would delete now, and deletes nothing.
	DryRun bool
	// Progress, if not nil, is called after each batch with the totals
	// deleted so far.
	Progress func(PurgeCounts)
}

// PurgeCounts are the rows of one queue that Purge deletes (or deleted,
// or would delete: PurgeOptions.DryRun).
type PurgeCounts struct {
	// Items are the queue's items, claimed ones included.
	Items int64
	// Dead are its dead items (deaths).
	Dead int64
	// Ended are the ended ids remembered for deduplication.
	Ended int64
	// OwnedParts are the parts sessions own.
	OwnedParts int64
	// TenantLimits are the tenants' own limits.
	TenantLimits int64
	// Schedules are the schedules' period marks.
	Schedules int64
	// Stored reports whether the queue has a row in the queues table (its
	// part count, settings and pause).
	Stored bool
	// Waiting are its waiting items (NewItem.After; their edges go with
	// them).
	Waiting int64
}

// Total is the number of rows counted.
func (c PurgeCounts) Total() int64 {
	n := c.Items + c.Dead + c.Ended + c.OwnedParts + c.TenantLimits + c.Schedules + c.Waiting
	if c.Stored {
		n++
	}
	return n
}

// purgePlan counts what Purge would delete now (PurgeOptions.DryRun).
func (q *Queue) purgePlan(ctx context.Context) (PurgeCounts, error) {
	info, err := q.Inspect(ctx)
	if err != nil {
		return PurgeCounts{}, err
	}
	var rc store.QueueRowCounts
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rc, err = q.store.QueuePurgeCount(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return PurgeCounts{}, fmt.Errorf("claim: counting the rows of %q: %w", q.opts.Queue, err)
	}
	return PurgeCounts{Items: info.Unclaimed + info.Claimed, Dead: info.Dead, Ended: rc.Ended, OwnedParts: rc.OwnedParts,
		TenantLimits: int64(len(info.TenantLimits)), Schedules: rc.Schedules, Stored: info.Stored, Waiting: info.Waiting}, nil
}

// PurgeBatch is how many rows one of Purge's statements deletes at most.
const PurgeBatch = 1000

// Purge deletes everything of this queue: its items (claimed ones too:
// their acks then fail with ErrClaimLost), waiting items and their edges,
// dead items, ended ids, owned
// parts, tenant limits, schedule marks and its row in the queues table
// (part count, settings, pause). Other queues' rows are not touched. The
// large tables are deleted PurgeBatch rows per statement, so no statement
// grows with the queue; o.Progress, if not nil, is called after each
// batch with the totals so far. Workers still running on the queue
// re-create its row and parts at their next rebalance: stop them first.
// Items enqueued while it runs may stay. On an error the counts say what
// was deleted before it. With o.DryRun it deletes nothing and returns what
// it would delete now.
func (q *Queue) Purge(ctx context.Context, o PurgeOptions) (PurgeCounts, error) {
	var done PurgeCounts
	if err := q.ready(ctx); err != nil {
		return done, fmt.Errorf("claim: purging %q: %w", q.opts.Queue, err)
	}
	progress := o.Progress
	plan, err := q.purgePlan(ctx)
	if o.DryRun || err != nil {
		return plan, err
	}
	if err != nil {
		return done, err
	}
	for _, step := range []struct {
		table store.PurgeTable
		n     *int64
	}{{store.PurgeUnclaimed, &done.Items}, {store.PurgeClaimed, &done.Items}, {store.PurgeDead, &done.Dead}, {store.PurgeEnded, &done.Ended}} {
		for {
			var n int64
			err := retry.Do(ctx, nil, func(ctx context.Context) error {
				var err error
				n, err = q.store.QueuePurgeBatch(ctx, q.db, q.opts.Queue, step.table, PurgeBatch)
				return store.Classify(err)
			})
			if err != nil {
				return done, fmt.Errorf("claim: purging %q: %w", q.opts.Queue, err)
			}
			*step.n += n
			if progress != nil && n > 0 {
				progress(done)
			}
			if n == 0 {
				break
			}
		}
	}
	// The waiting items and their edges (depends.go), edges first.
	for {
		var n int64
		var more bool
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			n, more, err = q.store.QueuePurgeDependsBatch(ctx, q.db, q.engine.Load().dialect, q.opts.Queue, PurgeBatch)
			return store.Classify(err)
		})
		if err != nil {
			return done, fmt.Errorf("claim: purging %q: %w", q.opts.Queue, err)
		}
		done.Waiting += n
		if progress != nil && n > 0 {
			progress(done)
		}
		if !more {
			break
		}
	}
	err = retry.Tx(ctx, q.db, nil, func(ctx context.Context, tx pgx.Tx) error {
		stored, err := q.store.QueuePurgeRows(ctx, tx, q.opts.Queue)
		done.Stored = stored
		return store.Classify(err)
	})
	if err != nil {
		return done, fmt.Errorf("claim: purging %q: %w", q.opts.Queue, err)
	}
	// The small tables' rows are deleted in one statement each: their
	// counts are the plan's.
	done.OwnedParts, done.TenantLimits, done.Schedules = plan.OwnedParts, plan.TenantLimits, plan.Schedules
	if progress != nil {
		progress(done)
	}
	return done, nil
}

// WaitDrained returns nil once this queue has no items (unclaimed or
// claimed), counting them every poll (at least 10 ms) in one statement; or
// ctx's error when ctx ends first. Dead items do not count: a drained queue
// may have some. A read that fails is returned as the error. The count is
// one snapshot: an item that a handler hands back (a snooze, a nack) while
// it is read is counted once, where Inspect's separate reads of unclaimed
// and claimed items may miss it and report an empty queue for a moment
// (TestWorkerSnooze saw that under load).
func (q *Queue) WaitDrained(ctx context.Context, poll time.Duration) error {
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: waiting for %q to drain: %w", q.opts.Queue, err)
	}
	poll = max(poll, 10*time.Millisecond)
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		var n int64
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			n, err = q.store.VerifyCountItems(ctx, q.db, q.opts.Queue)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("claim: waiting for %q to drain: %w", q.opts.Queue, err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// QueueExists reports whether the queue named exists in the database t
// names on db: it has a row in the queues table, items or dead items (as
// Queues lists them).
func QueueExists(ctx context.Context, db crsql.DB, t crsql.Tables, name string) (bool, error) {
	names, err := Queues(ctx, db, t)
	if err != nil {
		return false, err
	}
	return slices.Contains(names, name), nil
}

// PartOwner is one part of a queue and the session that owns it.
type PartOwner struct {
	// Queue is the queue's name.
	Queue string
	// Part is the part's number.
	Part int
	// Session is the id of the session that owns the part.
	Session uuid.UUID
}

// PartOwners returns the owned parts of queue (every queue's when queue is
// ""), by queue and part. A part nobody owns is not listed; an owner may
// be an expired session not yet reaped.
func PartOwners(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) ([]PartOwner, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("claim: listing the part owners: %w", err)
	}
	stmts := store.New(t)
	var out []PartOwner
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		if queue == "" {
			var err error
			rows, err := stmts.PartsOwnersAll(ctx, db)
			out = make([]PartOwner, len(rows))
			for i, r := range rows {
				out[i] = PartOwner{Queue: r.Queue, Part: r.Part, Session: r.Session}
			}
			return store.Classify(err)
		}
		owners, err := stmts.PartsOwners(ctx, db, queue)
		if err != nil {
			return store.Classify(err)
		}
		out = out[:0]
		for part, s := range owners {
			out = append(out, PartOwner{Queue: queue, Part: part, Session: s})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Part < out[j].Part })
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing the part owners: %w", err)
	}
	return out, nil
}
