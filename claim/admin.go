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

// DeadFilter selects dead items (see DeadItems, DeadCount, RequeueWhere):
// every field that is set must match; the zero value matches every dead
// item of the queue.
type DeadFilter struct {
	// Tenant is the tenant's name, exactly.
	Tenant string
	// Reason is the reason of death, exactly ("failed", "permanent",
	// "crash loop", "expired").
	Reason string
	// ErrorContains is a substring of the last error (case-sensitive).
	ErrorContains string
}

// row returns the filter as the store takes it.
func (f DeadFilter) row() store.DeadFilter {
	return store.DeadFilter{Tenant: f.Tenant, Reason: f.Reason, ErrorContains: f.ErrorContains}
}

// DeadQuery asks DeadItems for one page of dead items.
type DeadQuery struct {
	DeadFilter
	// After is the cursor of the previous page (DeadPage.Next); "" for the
	// first page.
	After string
	// Limit is the most items in the page: 1 or more.
	Limit int
}

// DeadPage is one page of DeadItems.
type DeadPage struct {
	// Items are the deaths, the most recent first (by died_at, then id and
	// death, all descending, as Dead).
	Items []DeadItem
	// Next is the cursor of the next page: "" when this page is the last.
	// Deaths that happen while a caller pages are newer than its cursor and
	// are not in the pages that follow; deaths requeued meanwhile drop out.
	Next string
}

// ErrBadCursor is returned by DeadItems for a cursor it did not make.
var ErrBadCursor = errors.New("not a cursor of DeadItems")

// DeadItems returns one page of the dead items of this queue that match
// the query's filter, the most recent death first. Page on by passing the
// page's Next as the next query's After: the pages have no gaps and no
// repeats, whatever is requeued meanwhile. Each page reads the queue's
// entries of the dead items' index (queue, died_at) from the cursor on,
// until Limit match.
func (q *Queue) DeadItems(ctx context.Context, dq DeadQuery) (DeadPage, error) {
	what := fmt.Sprintf("claim: listing dead items of %q", q.opts.Queue)
	if dq.Limit <= 0 {
		return DeadPage{}, fmt.Errorf("%s: limit %d must be positive", what, dq.Limit)
	}
	var after *store.DeadPosition
	if dq.After != "" {
		p, err := decodeCursor(dq.After)
		if err != nil {
			return DeadPage{}, fmt.Errorf("%s: cursor %q: %w", what, dq.After, err)
		}
		after = &p
	}
	// One more than asked: whether a next page exists.
	items, err := q.listDead(ctx, func(ctx context.Context) ([]store.DeadItemRow, error) {
		return q.store.DeadItemsPage(ctx, q.db, q.opts.Queue, dq.DeadFilter.row(), after, dq.Limit+1)
	})
	if err != nil {
		return DeadPage{}, err
	}
	if len(items) <= dq.Limit {
		return DeadPage{Items: items}, nil
	}
	last := items[dq.Limit-1]
	return DeadPage{Items: items[:dq.Limit], Next: encodeCursor(store.DeadPosition{DiedAt: last.DiedAt, ID: last.ID, Death: last.Death})}, nil
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

// DeadCount counts the deaths of this queue that match f (an id that died
// twice counts twice). It reads the queue's entries of the dead items'
// index and the rows they point to.
func (q *Queue) DeadCount(ctx context.Context, f DeadFilter) (int64, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: counting dead items of %q: %w", q.opts.Queue, err)
	}
	var n int64
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		n, err = q.store.CountDead(ctx, q.db, q.opts.Queue, f.row())
		return store.Classify(err)
	})
	if err != nil {
		return 0, fmt.Errorf("claim: counting dead items of %q: %w", q.opts.Queue, err)
	}
	return n, nil
}

// RequeueResult is what RequeueWhere did.
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
	// (Requeue of one says why it is refused).
	Refused    int
	RefusedIDs []uuid.UUID
}

// MaxRefusedIDs bounds RequeueResult.RefusedIDs.
const MaxRefusedIDs = 100

// RequeueBatch is how many dead items RequeueWhere reads per page.
const RequeueBatch = 500

// RequeueWhere requeues (as Requeue: the newest death of each id, fresh
// attempts, no delay) every dead id of this queue that has a death matching
// f, reading the dead items a page of RequeueBatch at a time, newest first,
// and moving each id in its own short transaction, so that no transaction
// grows with the number of dead items. An id is requeued once; ids that are
// live are skipped and counted. Items that die while it runs are newer than
// its first page and are not requeued. An id whose move the database
// refuses for something about its row stays dead, counted in Refused, and
// the requeue goes on. progress, if not nil, is called after each page with
// the totals so far. On an error the result says what was done before it.
func (q *Queue) RequeueWhere(ctx context.Context, f DeadFilter, progress func(RequeueResult)) (RequeueResult, error) {
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
			ok, err := q.Requeue(ctx, d.ID)
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

// PurgeCounts are the rows of one queue that Purge deletes (or deleted).
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

// PurgePlan counts what Purge would delete now.
func (q *Queue) PurgePlan(ctx context.Context) (PurgeCounts, error) {
	info, err := q.Inspect(ctx)
	if err != nil {
		return PurgeCounts{}, err
	}
	var rc store.QueueRowCounts
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rc, err = q.store.CountQueueRows(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return PurgeCounts{}, fmt.Errorf("claim: counting the rows of %q: %w", q.opts.Queue, err)
	}
	waiting, err := q.WaitingCount(ctx)
	if err != nil {
		return PurgeCounts{}, err
	}
	return PurgeCounts{Items: info.Unclaimed + info.Claimed, Dead: info.Dead, Ended: rc.Ended, OwnedParts: rc.OwnedParts,
		TenantLimits: int64(len(info.TenantLimits)), Schedules: rc.Schedules, Stored: info.Stored, Waiting: waiting}, nil
}

// PurgeBatch is how many rows one of Purge's statements deletes at most.
const PurgeBatch = 1000

// Purge deletes everything of this queue: its items (claimed ones too:
// their acks then fail with ErrClaimLost), waiting items and their edges,
// dead items, ended ids, owned
// parts, tenant limits, schedule marks and its row in the queues table
// (part count, settings, pause). Other queues' rows are not touched. The
// large tables are deleted PurgeBatch rows per statement, so no statement
// grows with the queue; progress, if not nil, is called after each batch
// with the totals so far. Workers still running on the queue re-create its
// row and parts at their next rebalance: stop them first. Items enqueued
// while it runs may stay. On an error the counts say what was deleted
// before it.
func (q *Queue) Purge(ctx context.Context, progress func(PurgeCounts)) (PurgeCounts, error) {
	var done PurgeCounts
	if err := q.ready(ctx); err != nil {
		return done, fmt.Errorf("claim: purging %q: %w", q.opts.Queue, err)
	}
	plan, err := q.PurgePlan(ctx)
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
				n, err = q.store.PurgeBatch(ctx, q.db, q.opts.Queue, step.table, PurgeBatch)
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
			n, more, err = q.store.PurgeDependsBatch(ctx, q.db, q.engine.Load().dialect, q.opts.Queue, PurgeBatch)
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
		stored, err := q.store.PurgeQueueRows(ctx, tx, q.opts.Queue)
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
			n, err = q.store.CountItems(ctx, q.db, q.opts.Queue)
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
			rows, err := stmts.AllPartOwners(ctx, db)
			out = make([]PartOwner, len(rows))
			for i, r := range rows {
				out[i] = PartOwner{Queue: r.Queue, Part: r.Part, Session: r.Session}
			}
			return store.Classify(err)
		}
		owners, err := stmts.PartOwners(ctx, db, queue)
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
