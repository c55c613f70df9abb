package claim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Default retention of a queue that sets none (Retention's zero value).
//
// Thirty days covers a month of looking into failures (a weekend, a
// holiday, an incident review) before the evidence goes; 100,000 deaths
// bound a queue's dead items to about 100 MB at 1 KB a payload, so that a
// runaway failure (a bad deploy failing every item) cannot grow the table
// without bound, while leaving a steady trickle of deaths a month of
// history. Both are per queue; raise them for queues whose deaths matter
// longer, lower them for high-volume queues.
const (
	DefaultDeadMaxAge   = 30 * 24 * time.Hour
	DefaultDeadMaxCount = 100_000
)

// Retention says how long and how many dead items a queue keeps. Every
// worker session's reaper (its queue reap) deletes the dead items
// older than DeadMaxAge, then the oldest ones beyond the newest
// DeadMaxCount, in bounded batches. The zero value is the default: 30 days,
// 100,000 items.
type Retention struct {
	// DeadMaxAge is how long a dead item is kept after it died (0:
	// DefaultDeadMaxAge), at microsecond precision, at least a second.
	DeadMaxAge time.Duration
	// DeadMaxCount is how many dead items the queue keeps at most, the
	// newest (0: DefaultDeadMaxCount). Deaths at the same instant as the
	// last one kept are kept with it, and a queue may hold more for a
	// while between reaps (the reap's prune-dead step).
	DeadMaxCount int64
	// NoDeadMaxAge keeps dead items whatever their age (DeadMaxAge must
	// then be 0); NoDeadMaxCount keeps any number (DeadMaxCount must then
	// be 0). With both, dead items stay until requeued or purged.
	NoDeadMaxAge, NoDeadMaxCount bool
	// HistoryWindow is how long the queue keeps the record of an ended
	// item (acked, dead, cancelled), with its attempts' history, for
	// Queue.Item and Queue.ItemsList (0: DefaultHistoryWindow, a day, as
	// River keeps completed jobs), at microsecond precision. Ended records
	// are kept for the longer of it and the dedup window
	// (Settings.DedupWindow), so they may outlive it. NoHistory keeps them
	// for the dedup window only (HistoryWindow must then be 0).
	HistoryWindow time.Duration
	NoHistory     bool
}

// DefaultHistoryWindow is the history window of a queue that sets none
// (Retention.HistoryWindow): a day, as River keeps completed jobs.
const DefaultHistoryWindow = 24 * time.Hour

// Validate reports a retention that cannot be stored.
func (r Retention) Validate() error {
	switch {
	case r.DeadMaxAge < 0 || r.DeadMaxCount < 0:
		return fmt.Errorf("claim: retention: negative bound (max age %v, max count %d): use NoDeadMaxAge or NoDeadMaxCount to keep dead items without that bound", r.DeadMaxAge, r.DeadMaxCount)
	case r.DeadMaxAge > 0 && r.DeadMaxAge < time.Second:
		return fmt.Errorf("claim: retention: max age %v is below a second", r.DeadMaxAge)
	case r.DeadMaxAge > 100*365*24*time.Hour:
		return fmt.Errorf("claim: retention: max age %v is over a century: use NoDeadMaxAge", r.DeadMaxAge)
	case r.NoDeadMaxAge && r.DeadMaxAge != 0:
		return fmt.Errorf("claim: retention: NoDeadMaxAge with a max age of %v: set one or the other", r.DeadMaxAge)
	case r.NoDeadMaxCount && r.DeadMaxCount != 0:
		return fmt.Errorf("claim: retention: NoDeadMaxCount with a max count of %d: set one or the other", r.DeadMaxCount)
	case r.HistoryWindow < 0:
		return fmt.Errorf("claim: retention: negative history window %v: use NoHistory to keep ended items for the dedup window only", r.HistoryWindow)
	case r.HistoryWindow > 0 && r.HistoryWindow < time.Second:
		return fmt.Errorf("claim: retention: history window %v is below a second", r.HistoryWindow)
	case r.HistoryWindow > 100*365*24*time.Hour:
		return fmt.Errorf("claim: retention: history window %v is over a century", r.HistoryWindow)
	case r.NoHistory && r.HistoryWindow != 0:
		return fmt.Errorf("claim: retention: NoHistory with a history window of %v: set one or the other", r.HistoryWindow)
	}
	return nil
}

// stored returns the bounds to store (0: none).
func (r Retention) stored() store.RetentionRow {
	age, count, hist := r.DeadMaxAge, r.DeadMaxCount, r.HistoryWindow
	switch {
	case r.NoDeadMaxAge:
		age = 0
	case age == 0:
		age = DefaultDeadMaxAge
	}
	switch {
	case r.NoDeadMaxCount:
		count = 0
	case count == 0:
		count = DefaultDeadMaxCount
	}
	switch {
	case r.NoHistory:
		hist = 0
	case hist == 0:
		hist = DefaultHistoryWindow
	}
	return store.RetentionRow{MaxAge: age, MaxCount: count, History: hist}
}

// retentionOf returns the Retention a stored row means.
func retentionOf(r store.RetentionRow) Retention {
	return Retention{DeadMaxAge: r.MaxAge, DeadMaxCount: r.MaxCount, NoDeadMaxAge: r.MaxAge <= 0, NoDeadMaxCount: r.MaxCount <= 0,
		HistoryWindow: max(r.History, 0), NoHistory: r.History <= 0}
}

// setRetention (SettingsUpdate.Retention) stores the queue's retention, replacing the one stored; the
// next reap of any session applies it. A queue without a row in the queues
// table gets one with one part, as UpdateSettings does: give a queue its parts
// (worker.Options.Parts, partition.EnsureParts) before this.
func (q *Queue) setRetention(ctx context.Context, r Retention) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: setting the retention of %q: %w", q.opts.Queue, err)
	}
	row := r.stored()
	err := retry.Do(ctx, q.stats.retried("retention"), func(ctx context.Context) error {
		return store.Classify(q.store.QueueRetentionSet(ctx, q.db, q.opts.Queue, row))
	})
	if err != nil {
		return fmt.Errorf("claim: setting the retention of %q: %w", q.opts.Queue, err)
	}
	q.deadCount.forget()
	return nil
}

// Retention reads the queue's retention: the stored bounds, with
// NoDeadMaxAge or NoDeadMaxCount set for a bound that is off (the default
// bounds for a queue never set).
func (q *Queue) retention(ctx context.Context) (Retention, error) {
	if err := q.ready(ctx); err != nil {
		return Retention{}, fmt.Errorf("claim: reading the retention of %q: %w", q.opts.Queue, err)
	}
	var r store.RetentionRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		r, err = q.store.QueueRetention(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return Retention{}, fmt.Errorf("claim: reading the retention of %q: %w", q.opts.Queue, err)
	}
	return retentionOf(r), nil
}

// deadCountCheckEvery bounds how often one Queue reads the newest
// DeadMaxCount entries of its dead items (the count bound's exact check) while
// its upper bound says the queue may be over; deadCountMargin is how far
// before its last exact check a later count of new deaths starts, so that a
// death whose transaction started before the check (its died_at is its
// transaction's time) but committed after it is counted.
var (
	deadCountCheckEvery = time.Minute
	deadCountMargin     = time.Minute
)

// deadCountState is a Queue's upper bound on its queue's dead items, between
// exact checks: at (database clock) the queue held known dead items (with
// bound max), recent of which had died since at minus deadCountMargin.
// Deaths since then can only have added to it, and prunes and requeues only
// taken away: the deaths counted now since at minus the margin, less
// recent, are at least the deaths added since (a death that committed after
// the check with an earlier died_at included), less any of the recent ones
// removed since, so known - recent + that count is an upper bound of the
// queue's dead items.
type deadCountState struct {
	mu      sync.Mutex
	valid   bool
	at      time.Time
	known   int64
	recent  int64
	max     int64
	checked time.Time // local clock of the last exact check
	exact   int64     // exact checks made (for tests)
}

func (s *deadCountState) forget() {
	s.mu.Lock()
	s.valid = false
	s.checked = time.Time{}
	s.mu.Unlock()
}

// pruneDeadItems (queuemaint.Queue.PruneDead) applies the queue's retention to its dead items: it deletes
// those that died longer than Retention.DeadMaxAge ago, oldest first, then
// those older than the newest DeadMaxCount, at most 1,000 per statement
// (each its own short transaction) and at most 8,000 per bound per call,
// and returns how many it deleted; a call that deletes 8,000 for a bound
// left more for the next one. Every worker session's reaper calls it through
// Reap; any process may call it at any time (concurrent pruners skip each
// other's rows).
//
// What it costs with nothing to delete: a lookup of the queue's row, one
// index seek for the age, and for the count a count of the deaths since
// this Queue's last exact check (the queue's newest DeadMaxCount entries of
// its dead-items index, read when the Queue is new and again, at most once
// a minute, while that count says the queue may be over its bound). So a
// queue may hold more than DeadMaxCount for up to a minute plus a reap
// interval.
func (q *Queue) pruneDeadItems(ctx context.Context) (int, error) {
	if err := q.ready(ctx); err != nil {
		return 0, fmt.Errorf("claim: pruning the dead items of %q: %w", q.opts.Queue, err)
	}
	total, refused, err := q.pruneDead(ctx)
	if err != nil {
		err = fmt.Errorf("claim: pruning the dead items of %q: %w", q.opts.Queue, err)
	}
	return total, joinRefused(err, refused)
}

// pruneDead is pruneDeadItems once ready: it returns how many dead items it
// deleted and those the database refused to delete (left, reported; see
// pruneIsolated).
func (q *Queue) pruneDead(ctx context.Context) (int, []*ReapError, error) {
	var refused []*ReapError
	total, err := q.pruneDeadAll(ctx, &refused)
	q.stats.deadPruned.Add(int64(total))
	return total, refused, err
}

func (q *Queue) pruneDeadAll(ctx context.Context, refused *[]*ReapError) (int, error) {
	name := q.opts.Queue
	var r store.RetentionRow
	err := retry.Do(ctx, q.stats.retried("retention"), func(ctx context.Context) error {
		var err error
		r, err = q.store.QueueRetention(ctx, q.db, name)
		return store.Classify(err)
	})
	if err != nil {
		return 0, err
	}
	total := 0
	if r.MaxAge > 0 {
		n, _, err := q.pruneBatches(ctx, refused, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return q.store.DeadPruneOlder(ctx, tx, q.engine.Load().dialect, name, r.MaxAge, pruneBatch)
		}, time.Time{}, r.MaxAge)
		total += n
		if err != nil {
			return total, err
		}
	}
	if r.MaxCount <= 0 {
		return total, nil
	}
	n, err := q.pruneDeadCount(ctx, r.MaxCount, refused)
	return total + n, err
}

// pruneDeadCount deletes the queue's dead items beyond the newest max, when
// its upper bound of the queue's dead items (deadCountState) passes max.
func (q *Queue) pruneDeadCount(ctx context.Context, maxCount int64, refused *[]*ReapError) (int, error) {
	s, name := &q.deadCount, q.opts.Queue
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.valid && s.max == maxCount {
		var since int64
		err := retry.Do(ctx, q.stats.retried("retention"), func(ctx context.Context) error {
			var err error
			since, err = q.store.DeadSince(ctx, q.db, name, s.at.Add(-deadCountMargin), maxCount+1)
			return store.Classify(err)
		})
		if err != nil {
			return 0, err
		}
		if s.known-s.recent+since <= maxCount || time.Since(s.checked) < deadCountCheckEvery {
			return 0, nil
		}
	}
	var newest store.DeadNewestRow
	err := retry.Do(ctx, q.stats.retried("retention"), func(ctx context.Context) error {
		var err error
		newest, err = q.store.DeadNewest(ctx, q.db, name, maxCount, deadCountMargin)
		return store.Classify(err)
	})
	if err != nil {
		return 0, err
	}
	s.valid, s.at, s.known, s.recent, s.max, s.checked = true, newest.Now, newest.Count, newest.Recent, maxCount, time.Now()
	s.exact++
	if newest.Count < maxCount {
		return 0, nil
	}
	n, done, err := q.pruneBatches(ctx, refused, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		return q.store.DeadPruneBefore(ctx, tx, q.engine.Load().dialect, name, newest.Oldest, pruneBatch)
	}, newest.Oldest, 0)
	if err != nil || !done {
		// More may be left than the bound says: check again next time.
		s.valid, s.checked = false, time.Time{}
	}
	return n, err
}

// pruneBatches runs a pruning statement of the dead items in batches of
// pruneBatch rows, each in its own transaction, at most pruneStatements of
// them, and reports how many rows they deleted and whether the last batch
// found fewer than a batch (nothing left). The rows of the batch's
// condition (died before before or, with before zero, more than age ago)
// that the database refuses to delete are left and added to refused (see
// pruneIsolated).
func (q *Queue) pruneBatches(ctx context.Context, refused *[]*ReapError, batch func(ctx context.Context, tx pgx.Tx) (int64, error),
	before time.Time, age time.Duration) (int, bool, error) {
	s, name := q.store, q.opts.Queue
	n, done, bad, err := q.pruneIsolated(ctx, reapMove{step: StepPruneDead, batch: batch,
		candidates: func(ctx context.Context, db crsql.DB, queue string, limit int) ([]uuid.UUID, error) {
			return s.DeadPruneCandidates(ctx, db, queue, before, age, limit)
		},
		byID: func(ctx context.Context, tx pgx.Tx, ids []uuid.UUID) (int64, error) {
			return s.DeadPruneIDs(ctx, tx, name, ids, before, age)
		}})
	*refused = append(*refused, bad...)
	return n, done, err
}
