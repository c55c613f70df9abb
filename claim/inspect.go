package claim

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// InspectTenants is how many tenants QueueInfo.Tenants lists at most: those
// with the most unclaimed items.
const InspectTenants = 20

// QueueInfo is one queue's state, as Inspect reads it. The figures come
// from several statements, not one snapshot: an item claimed between two of
// them may be counted in neither or both of Unclaimed and Claimed.
type QueueInfo struct {
	// Name is the queue's name.
	Name string
	// Stored reports whether the queue has a row in the queues table (a
	// stored part count, settings, or a pause). A queue without one has
	// one part and default settings.
	Stored bool
	// NumParts is the stored part count, 1 if none is stored.
	NumParts int
	// Parts are the queue's parts, by part number: every part below
	// NumParts when Stored, and any part that holds items (items enqueued
	// before a change of the part count keep their part).
	Parts []PartInfo
	// Unclaimed, Due and Claimed are the totals over Parts.
	Unclaimed, Due, Claimed int64
	// OldestDue is the age, by the database clock, of the oldest due
	// unclaimed item (now minus its vesting time); 0 if none is due.
	OldestDue time.Duration
	// Tenants are the tenants with the most unclaimed items, most first
	// (ties by name), at most InspectTenants of them. Items without a
	// tenant are in no entry.
	Tenants []TenantInfo
	// Holders are the queue's claimed items by the session holding them.
	Holders map[uuid.UUID]int64
	// Dead is the number of deaths in the dead items table (an item that
	// died twice counts twice).
	Dead int64
	// Paused reports whether claims of the queue return nothing (SettingsUpdate.Paused).
	Paused bool
	// Settings are the queue's settings (Settings).
	Settings Settings
	// TenantLimits are the tenants' own limits (SettingsUpdate.TenantLimits), by tenant.
	TenantLimits map[string]Limit
	// Retention is how long and how many dead items the queue keeps
	// (Retention).
	Retention Retention
	// Waiting counts the queue's waiting items: enqueued with
	// prerequisites (NewItem.After) not yet all acked.
	Waiting int64
	// Snoozed counts unclaimed items that were snoozed at least once
	// (waiting for their delay, or claimable again); Cancelling counts
	// items whose cancel was asked for while they ran and which have not
	// ended yet.
	Snoozed, Cancelling int64
}

// PartInfo is one part's backlog.
type PartInfo struct {
	Part int
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
	// Claimed items, held by workers now.
	Claimed int64
}

// TenantInfo is one tenant's backlog.
type TenantInfo struct {
	Tenant string
	// Unclaimed items, of which Due are past their vesting time.
	Unclaimed, Due int64
}

// HasItems reports whether the queue holds unclaimed or claimed items, as
// Inspect read them: in separate statements, so an item handed back between
// them (a snooze, a nack) may be in neither. To wait for a queue to drain,
// use Queue.WaitDrained, which counts them in one.
func (i QueueInfo) HasItems() bool { return i.Unclaimed+i.Claimed > 0 }

// Inspect reads the queue's state: the one read behind package metrics,
// the demo's status and dashboards. What it costs (each statement is
// index-backed, its plan tested): point reads of the queue's row,
// settings and tenant limits; the queue's unclaimed items, each read once
// for the backlog by part and once more, for those with a tenant, for the
// backlog by tenant (so it grows with this queue's backlog, not with other
// queues'); the queue's claimed items; and the queue's dead items' index
// entries. Call it at a scrape's pace, not per item.
func (q *Queue) Inspect(ctx context.Context) (QueueInfo, error) {
	if err := q.ready(ctx); err != nil {
		return QueueInfo{}, fmt.Errorf("claim: inspecting %q: %w", q.opts.Queue, err)
	}
	var info QueueInfo
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		info, err = q.inspect(ctx)
		return err
	})
	if err != nil {
		return QueueInfo{}, fmt.Errorf("claim: inspecting %q: %w", q.opts.Queue, err)
	}
	s, err := q.Settings(ctx)
	if err != nil {
		return QueueInfo{}, err
	}
	info.Settings, info.TenantLimits, info.Retention = s, s.TenantLimits, s.Retention
	if info.Waiting, err = q.waitingCount(ctx); err != nil {
		return QueueInfo{}, err
	}
	if info.Snoozed, info.Cancelling, err = q.cancelSnoozeCounts(ctx); err != nil {
		return QueueInfo{}, err
	}
	return info, nil
}

// inspect runs Inspect's reads of the queue's row and items once.
func (q *Queue) inspect(ctx context.Context) (QueueInfo, error) {
	s, name := q.store, q.opts.Queue
	info := QueueInfo{Name: name}
	row, err := s.QueueInspect(ctx, q.db, name)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("reading the queue's row: %w", store.Classify(err))
	}
	info.Stored, info.NumParts, info.Paused = row.Stored, row.NumParts, row.Paused
	parts := map[int]*PartInfo{}
	part := func(p int) *PartInfo {
		if parts[p] == nil {
			parts[p] = &PartInfo{Part: p}
		}
		return parts[p]
	}
	if info.Stored {
		for p := range info.NumParts {
			part(p)
		}
	}
	unclaimed, err := s.QueueInspectUnclaimed(ctx, q.db, name)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("reading the backlog: %w", store.Classify(err))
	}
	for _, u := range unclaimed {
		pi := part(u.Part)
		pi.Unclaimed, pi.Due = u.Unclaimed, u.Due
		if u.OldestDue != nil {
			info.OldestDue = max(info.OldestDue, u.Now.Sub(*u.OldestDue))
		}
	}
	claimed, err := s.QueueInspectClaimed(ctx, q.db, name)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("reading the claimed items: %w", store.Classify(err))
	}
	info.Holders = map[uuid.UUID]int64{}
	for _, c := range claimed {
		part(c.Part).Claimed += c.Claimed
		info.Holders[c.Session] += c.Claimed
	}
	info.Parts = make([]PartInfo, 0, len(parts))
	for _, pi := range parts {
		info.Parts = append(info.Parts, *pi)
		info.Unclaimed += pi.Unclaimed
		info.Due += pi.Due
		info.Claimed += pi.Claimed
	}
	sort.Slice(info.Parts, func(i, j int) bool { return info.Parts[i].Part < info.Parts[j].Part })

	tenants, err := s.QueueInspectTenants(ctx, q.db, name, InspectTenants)
	if err != nil {
		return QueueInfo{}, fmt.Errorf("reading the backlog by tenant: %w", store.Classify(err))
	}
	for _, t := range tenants {
		info.Tenants = append(info.Tenants, TenantInfo{Tenant: t.Tenant, Unclaimed: t.Unclaimed, Due: t.Due})
	}
	if info.Dead, err = s.QueueInspectDead(ctx, q.db, name); err != nil {
		return QueueInfo{}, fmt.Errorf("counting the dead items: %w", store.Classify(err))
	}
	return info, nil
}

// Queues returns the names of the queues in the database t names on db, in
// order: those with a row in the queues table, with unclaimed, claimed,
// dead or waiting items, with ended ids (acked, dead, cancelled items
// remembered for the queue's dedup window) or with periodic schedules, so
// that a drained queue stays known. Each statement finds the next name of
// all these at once, by one index seek in each (a skip from one queue name
// to the next), so n queues take n+1 statements; it reads no item.
func Queues(ctx context.Context, db crsql.DB, t crsql.Tables) ([]string, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("claim: listing the queues: %w", err)
	}
	if err := crsql.Check(ctx, db, t); err != nil {
		return nil, fmt.Errorf("claim: listing the queues: %w", err)
	}
	s := store.New(t)
	var out []string
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		out = out[:0]
		for after := ""; ; {
			n, ok, err := s.QueuesNextAny(ctx, db, after)
			if err != nil {
				return store.Classify(err)
			}
			if !ok {
				return nil
			}
			out, after = append(out, n), n
		}
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing the queues: %w", err)
	}
	if out == nil {
		out = []string{}
	}
	return out, nil
}
