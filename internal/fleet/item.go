package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// States of an item id, as Item finds it (ItemView.State).
const (
	StateQueued    = "queued"    // unclaimed and due
	StateScheduled = "scheduled" // unclaimed, due later (a delay, a backoff, a snooze)
	StateClaimed   = "claimed"   // a session works it
	StateWaiting   = "waiting"   // enqueued with prerequisites not yet all acked
	StateDead      = "dead"      // in the dead items (its newest death), and not live
	StateCancelled = "cancelled" // ended by a cancel (an ended id)
	StateAcked     = "acked"     // ended by an ack (an ended id)
	StateTaken     = "taken"     // an at-most-once item taken by a claim (an ended id)
	StateUnknown   = ""          // nowhere: never enqueued, purged, or forgotten after its queue's dedup window
)

// ItemView is everything the tables hold about one item id: the live item
// (or the waiting one), its deaths, and the ended records of its queues.
// An id is live at most once, but it may have died before (deaths stay as
// history) and be remembered as ended in its queue.
type ItemView struct {
	ID uuid.UUID
	// State is where the id is now: the live item's state, else the
	// waiting item's, else its latest end (a death counts as "dead").
	State string
	// Queue is the queue of the state (the live item's, the waiting
	// item's, the latest death's or end's).
	Queue string
	// Snoozed: the live item was snoozed (Live.Snoozes > 0) and is not
	// claimed.
	Snoozed bool
	// Live is the item in the items table (nil: none).
	Live *store.ItemDetail
	// Waiting is the waiting item (nil: none).
	Waiting *store.WaitingItemRow
	// Deaths are its deaths, newest first (at most MaxDeaths), with
	// DeathQueues their queues.
	Deaths      []store.DeadItemRow
	DeathQueues []string
	// Ended are its ended records in the queues looked in, newest first.
	Ended []store.EndedRow
	// History is the item's attempts, oldest first (store.Timeline), for
	// its State: the live item's, the dead item's, or the ended record's.
	// HistoryRecorded is false for an item that ended under code older
	// than schema version 6 (no history recorded); HistoryOmitted reports
	// attempts left out (the oldest, beyond store.HistoryMaxEntries).
	History         []store.Attempt
	HistoryRecorded bool
	HistoryOmitted  bool
}

// MaxDeaths bounds ItemView.Deaths.
const MaxDeaths = 20

// Item reads where the item id is, and all the tables hold about it: the
// items, waiting and dead items by the id (primary keys), and the ended ids
// of the queues given (one primary-key lookup per queue: no index leads
// with the id alone). With no queues, no ended record is looked for.
func (r *Reader) Item(ctx context.Context, id uuid.UUID, queues []string) (*ItemView, error) {
	return ReadItem(ctx, r.store, r.db, id, queues)
}

// ReadItem is Reader.Item with the statements of st on db.
func ReadItem(ctx context.Context, st *store.Store, db store.DB, id uuid.UUID, queues []string) (*ItemView, error) {
	v := &ItemView{ID: id}
	r := struct {
		store *store.Store
		db    store.DB
	}{st, db}
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		*v = ItemView{ID: id}
		it, ok, err := r.store.ItemsGet(ctx, r.db, id)
		if err != nil {
			return store.Classify(err)
		}
		if ok {
			v.Live = &it
		}
		w, ok, err := r.store.WaitingItem(ctx, r.db, id)
		if err != nil {
			return store.Classify(err)
		}
		if ok {
			v.Waiting = &w
		}
		if v.Deaths, v.DeathQueues, err = r.store.DeadOfID(ctx, r.db, id, MaxDeaths); err != nil {
			return store.Classify(err)
		}
		if len(queues) > 0 {
			if v.Ended, err = r.store.EndedOfID(ctx, r.db, queues, id); err != nil {
				return store.Classify(err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: reading item %s: %w", id, err)
	}
	v.locate()
	return v, nil
}

// locate sets State and Queue from what was read.
func (v *ItemView) locate() {
	var lastDeath, lastEnd time.Time
	if len(v.Deaths) > 0 {
		lastDeath = v.Deaths[0].DiedAt
	}
	if len(v.Ended) > 0 {
		lastEnd = v.Ended[0].EndedAt
	}
	switch {
	case v.Live != nil && v.Live.Claim != nil:
		v.State, v.Queue = StateClaimed, v.Live.Queue
	case v.Live != nil:
		v.State, v.Queue = StateQueued, v.Live.Queue
		if v.Live.VestingAt.After(v.Live.Now) {
			v.State = StateScheduled
		}
		v.Snoozed = v.Live.Snoozes > 0
	case v.Waiting != nil:
		v.State, v.Queue = StateWaiting, v.Waiting.Queue
	case len(v.Deaths) > 0 && !lastEnd.After(lastDeath):
		v.State, v.Queue = StateDead, v.DeathQueues[0]
	case len(v.Ended) > 0:
		e := v.Ended[0]
		v.State, v.Queue = e.Outcome, e.Queue
	}
	v.History, v.HistoryRecorded, v.HistoryOmitted = History(v)
}

// History returns the timeline of v's attempts for its State, whether
// one was recorded, and whether older attempts were left out.
func History(v *ItemView) ([]store.Attempt, bool, bool) {
	var in store.TimelineInput
	var raw []byte
	switch v.State {
	case StateClaimed, StateQueued, StateScheduled:
		it := v.Live
		raw, in.Attempts, in.LastStart = it.History, it.Attempts, it.ClaimedAt
		if it.Claim != nil {
			in.Last, in.LastSession = store.AttemptRunning, it.Claim
		}
	case StateWaiting, StateUnknown:
		return nil, true, false
	case StateDead:
		if len(v.Deaths) == 0 { // its dead item was pruned or purged; its ended record stays
			return endedHistory(v.Ended[0])
		}
		d := v.Deaths[0]
		raw, in.Attempts = d.History, int64(d.Attempts)
		recorded := raw != nil
		for _, e := range v.Ended {
			if e.Queue == v.Queue && e.Outcome == StateDead && e.Attempts != nil && !e.EndedAt.Before(d.DiedAt.Add(-time.Second)) {
				in.LastStart, in.LastSession, recorded = e.StartedAt, e.Session, true
				break
			}
		}
		if !recorded {
			return nil, false, false
		}
	default: // an ended record
		return endedHistory(v.Ended[0])
	}
	return timeline(raw, in)
}

// endedHistory is the timeline of an ended record.
func endedHistory(e store.EndedRow) ([]store.Attempt, bool, bool) {
	if e.Attempts == nil {
		return nil, false, false
	}
	in := store.TimelineInput{Attempts: *e.Attempts, LastStart: e.StartedAt, LastSession: e.Session}
	switch {
	case e.Outcome == StateAcked || e.Outcome == StateTaken:
		in.Last, in.LastEnd = store.AttemptSucceeded, &e.EndedAt
	case e.Outcome == StateCancelled && e.WasRunning && e.StartedAt != nil:
		in.Last, in.LastEnd = store.AttemptCancelled, &e.EndedAt
	}
	return timeline(e.History, in)
}

// timeline reads the entries raw into in and returns its timeline.
func timeline(raw []byte, in store.TimelineInput) ([]store.Attempt, bool, bool) {
	entries, err := store.ParseHistory(raw)
	if err != nil {
		// A history this code cannot read: shown as not recorded.
		return nil, false, false
	}
	in.Entries = entries
	tl, omitted := store.Timeline(in)
	return tl, true, omitted
}
