package claim

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// ErrItemNotFound is returned (wrapped) by Item for an id the queue has
// nowhere: never enqueued, in another queue, purged, or ended longer ago
// than the queue keeps ended items (Retention.HistoryWindow, the dedup
// window).
var ErrItemNotFound = errors.New("item not found")

// ItemState is where an item is, as Item and Items report it.
type ItemState string

// The states of an item.
const (
	StateQueued    ItemState = "queued"    // unclaimed and due
	StateDelayed   ItemState = "delayed"   // unclaimed, due later: a delay or a retry's backoff
	StateSnoozed   ItemState = "snoozed"   // unclaimed, due later, after a snooze
	StateRunning   ItemState = "running"   // claimed: a session works it
	StateWaiting   ItemState = "waiting"   // enqueued with prerequisites not yet all acked (NewItem.After)
	StateDead      ItemState = "dead"      // in the dead items (its latest death)
	StateCancelled ItemState = "cancelled" // ended by a cancel
	StateAcked     ItemState = "acked"     // ended by an ack
	StateTaken     ItemState = "taken"     // an at-most-once item handed out by a claim
)

// AttemptOutcome is how an attempt ended.
type AttemptOutcome string

// The outcomes of an attempt.
const (
	AttemptRunning   AttemptOutcome = store.AttemptRunning   // a session runs it now
	AttemptSucceeded AttemptOutcome = store.AttemptSucceeded // its handler succeeded (or the at-most-once item was taken)
	AttemptFailed    AttemptOutcome = store.AttemptFailed    // its handler failed; the item was retried
	AttemptPermanent AttemptOutcome = store.AttemptPermanent // its handler failed for good (Permanent)
	AttemptDead      AttemptOutcome = store.AttemptDead      // its failure ended the item dead
	AttemptLease     AttemptOutcome = store.AttemptLease     // its lease ran out before its handler ended it
	AttemptCancelled AttemptOutcome = store.AttemptCancelled // the item was cancelled while it ran
	// AttemptLost: no end was recorded: its worker's session ended while
	// it ran (the process was killed or cut off; the claim was released
	// with the session), or code older than schema version 6 ended it.
	AttemptLost AttemptOutcome = store.AttemptLost
	// AttemptRequeued is a marker, not an attempt: the item was requeued
	// from the dead or cancelled items (Attempt.From); the attempts after
	// it count from one again.
	AttemptRequeued AttemptOutcome = store.AttemptRequeued
)

// Attempt is one attempt of an item, as its history keeps it.
type Attempt struct {
	// Number is the attempt's number, from 1 (0 for a requeue marker);
	// Run counts the requeues before it.
	Number int64
	Run    int
	// StartedAt is its claim, EndedAt its end (zero: not known, or not
	// ended), Session the worker session that ran it (uuid.Nil: not known).
	StartedAt, EndedAt time.Time
	Session            uuid.UUID
	Outcome            AttemptOutcome
	// Error is the error its handler returned (a panic's, with its stack
	// trace), its first HistoryMaxError characters; longer ones end with
	// a marker saying how long they were.
	Error string
	// From is where a requeue marker's item came from: "dead" or
	// "cancelled".
	From string
}

// History bounds (schema version 6): an item keeps its last
// HistoryMaxEntries failed attempts, and of each error its first
// HistoryMaxError characters.
const (
	HistoryMaxEntries = store.HistoryMaxEntries
	HistoryMaxError   = store.HistoryMaxError
)

func attemptsOf(in []store.Attempt) []Attempt {
	out := make([]Attempt, len(in))
	for i, a := range in {
		o := Attempt{Number: a.Number, Run: a.Run, Outcome: AttemptOutcome(a.Outcome), Error: a.Error, From: a.From}
		if a.StartedAt != nil {
			o.StartedAt = *a.StartedAt
		}
		if a.EndedAt != nil {
			o.EndedAt = *a.EndedAt
		}
		if a.Session != nil {
			o.Session = *a.Session
		}
		out[i] = o
	}
	return out
}

// Item looks up the item id of this queue wherever it is: queued, delayed
// or snoozed, running, waiting for prerequisites, dead, or ended (acked,
// cancelled, taken) within the queue's history window
// (Retention.HistoryWindow, a day by default, or its dedup window if
// longer), with its attempts' history (ItemInfo.History). It returns an
// error wrapping ErrItemNotFound when the queue has no such item: never
// enqueued, in another queue, purged, or ended before the window. An id
// that died and was enqueued again is reported where it is now.
func (q *Queue) Item(ctx context.Context, id uuid.UUID) (ItemInfo, error) {
	what := fmt.Sprintf("claim: reading item %s of %q", id, q.opts.Queue)
	if err := q.ready(ctx); err != nil {
		return ItemInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	v, err := fleet.ReadItem(ctx, q.store, q.db, id, []string{q.opts.Queue})
	if err != nil {
		return ItemInfo{}, fmt.Errorf("%s: %w", what, err)
	}
	if v.State == fleet.StateUnknown {
		return ItemInfo{}, fmt.Errorf("%s: %w", what, ErrItemNotFound)
	}
	if v.Queue != q.opts.Queue {
		return ItemInfo{}, fmt.Errorf("%s: %w (the id is %s in queue %q)", what, ErrItemNotFound, v.State, v.Queue)
	}
	it := ItemInfo{ID: id, Queue: v.Queue, History: attemptsOf(v.History), HistoryRecorded: v.HistoryRecorded, HistoryOmitted: v.HistoryOmitted}
	switch {
	case v.Live != nil:
		d := v.Live
		it = it.withLive(d)
		switch {
		case d.Claim != nil:
			it.State = StateRunning
		case d.VestingAt.After(d.Now) && d.Snoozes > 0:
			it.State = StateSnoozed
		case d.VestingAt.After(d.Now):
			it.State = StateDelayed
		default:
			it.State = StateQueued
		}
	case v.Waiting != nil:
		w := v.Waiting
		it.State, it.Key, it.Tenant, it.Priority, it.MaxAttempts, it.Kind = StateWaiting, w.Key, w.Tenant, w.Priority, w.MaxAttempts, w.Kind
		it.EnqueuedAt, it.Payload, it.Metadata, it.PayloadSize = w.EnqueuedAt, w.Payload, w.Metadata, int64(len(w.Payload))
	case v.State == fleet.StateDead && len(v.Deaths) > 0:
		d := v.Deaths[0]
		it.State, it.Part, it.Key, it.Tenant, it.Priority, it.Kind = StateDead, d.Part, d.Key, d.Tenant, int64(d.Priority), d.Kind
		it.Attempts, it.MaxAttempts, it.LastError, it.EnqueuedAt = int64(d.Attempts), int64(d.MaxAttempts), d.LastError, d.EnqueuedAt
		it.EndedAt, it.Reason, it.Payload, it.Metadata, it.PayloadSize = d.DiedAt, d.Reason, d.Payload, d.Metadata, int64(len(d.Payload))
	default:
		e := v.Ended[0]
		it.State, it.EndedAt, it.Kind = ItemState(e.Outcome), e.EndedAt, e.Kind
		if e.Attempts != nil {
			it.Attempts = *e.Attempts
		}
		if e.EnqueuedAt != nil {
			it.EnqueuedAt = *e.EnqueuedAt
		}
		if e.Outcome == store.OutcomeCancelled {
			it.Reason = e.CancelReason
		}
		if n := len(it.History); n > 0 {
			it.LastError = it.History[n-1].Error
		}
	}
	return it, nil
}

// withLive fills it from the live item d.
func (it ItemInfo) withLive(d *store.ItemDetail) ItemInfo {
	it.Part, it.Key, it.Priority, it.Tenant, it.EnqueuedAt, it.Kind = d.Part, d.Key, d.Priority, d.Tenant, d.EnqueuedAt, d.Kind
	it.VestingAt, it.TurnAt, it.Attempts, it.MaxAttempts, it.LastError = d.VestingAt, d.TurnAt, d.Attempts, d.MaxAttempts, d.LastError
	it.Claimed, it.PayloadSize, it.Payload, it.Metadata = d.Claim != nil, int64(len(d.Payload)), d.Payload, d.Metadata
	if d.LeaseUntil != nil {
		it.LeaseUntil = *d.LeaseUntil
	}
	if d.Claim != nil {
		it.Session = *d.Claim
	}
	return it
}

// list is Items with a State (ItemQuery.State): one page of this queue's
// items in that state.
func (q *Queue) list(ctx context.Context, lq ItemQuery) (ItemPage, error) {
	what := fmt.Sprintf("claim: listing the %s items of %q", lq.State, q.opts.Queue)
	kind, outcomes, err := listKind(lq)
	switch {
	case lq.Claimed:
		return ItemPage{}, fmt.Errorf("%s: Claimed is the state running: set State or Claimed, not both", what)
	case err != nil:
		return ItemPage{}, fmt.Errorf("%s: %w", what, err)
	case lq.Limit < 0:
		return ItemPage{}, fmt.Errorf("%s: limit %d must not be negative (0: %d)", what, lq.Limit, DefaultListLimit)
	case lq.Limit == 0:
		lq.Limit = DefaultListLimit
	}
	pos := store.ListStart(kind)
	if lq.After != "" {
		if pos, err = decodeListCursor(lq.After, kind); err != nil {
			return ItemPage{}, fmt.Errorf("%s: cursor %q: %w", what, lq.After, err)
		}
	}
	if err := q.ready(ctx); err != nil {
		return ItemPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var rows []store.ListRow
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = q.store.ItemsList(ctx, q.db, kind, q.opts.Queue, store.ListFilter{Key: lq.Key, Tenant: lq.Tenant, Kind: lq.Kind}, outcomes, pos, lq.Limit+1)
		return store.Classify(err)
	})
	if err != nil {
		return ItemPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var page ItemPage
	if len(rows) > lq.Limit {
		rows = rows[:lq.Limit]
		page.Next = encodeListCursor(rows[lq.Limit-1].Position(kind), kind)
	}
	now := time.Now()
	page.Items = make([]ItemInfo, len(rows))
	for i, r := range rows {
		it := ItemInfo{ID: r.ID, Kind: r.Kind, Queue: q.opts.Queue, Part: int(r.Part), Key: r.Key, Tenant: r.Tenant, Priority: r.Priority,
			Attempts: r.Attempts, MaxAttempts: r.MaxAttempts, EnqueuedAt: r.EnqueuedAt, LastError: r.LastError, PayloadSize: r.PayloadLen,
			HistoryRecorded: true}
		switch kind {
		case store.ListUnclaimed:
			it.VestingAt, it.TurnAt, it.State = r.At, r.TurnAt, StateQueued
			if r.At.After(now) {
				it.State = StateDelayed
				if r.Snoozes > 0 {
					it.State = StateSnoozed
				}
			}
		case store.ListClaimed:
			it.State, it.Claimed, it.LeaseUntil = StateRunning, true, r.At
			if r.Claim != nil {
				it.Session = *r.Claim
			}
		case store.ListWaiting:
			it.State = StateWaiting
		case store.ListDead:
			it.State, it.EndedAt, it.Reason = StateDead, r.At, r.Outcome
		default:
			it.State, it.EndedAt = ItemState(r.Outcome), r.At
			it.HistoryRecorded = r.Attempts >= 0
			it.Attempts = max(r.Attempts, 0)
		}
		page.Items[i] = it
	}
	return page, nil
}

// listKind returns the store's list of lq.State.
func listKind(lq ItemQuery) (store.ListKind, []string, error) {
	switch lq.State {
	case StateQueued:
		return store.ListUnclaimed, nil, nil
	case StateRunning:
		return store.ListClaimed, nil, nil
	case StateWaiting:
		return store.ListWaiting, nil, nil
	case StateDead:
		return store.ListDead, nil, nil
	case StateAcked, StateTaken, StateCancelled:
		if lq.Key != "" || lq.Tenant != "" {
			return 0, nil, fmt.Errorf("a key or tenant filter lists queued, running, waiting and dead items only (an ended item's record keeps neither; a kind filter lists ended items too)")
		}
		if lq.State == StateCancelled {
			return store.ListCancelled, nil, nil
		}
		return store.ListEnded, []string{store.OutcomeAcked, store.OutcomeTaken}, nil
	case StateDelayed, StateSnoozed:
		return 0, nil, fmt.Errorf("state %q is listed with the queued items (StateQueued: every unclaimed item, each with its state)", lq.State)
	case "":
		return 0, nil, errors.New("a key or kind filter needs a state (ItemQuery.State)")
	}
	return 0, nil, fmt.Errorf("unknown state %q (queued, running, waiting, dead, acked or cancelled)", lq.State)
}

// encodeListCursor writes p, a position in list k, as an opaque token.
func encodeListCursor(p store.ListPosition, k store.ListKind) string {
	raw := fmt.Sprintf("l%d.%d.%d.%d.%d.%s.%s", k, p.Priority, p.TurnAt.UnixMicro(), p.Part, p.At.UnixMicro(), p.ID, p.Death)
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// decodeListCursor reads encodeListCursor's token for list k.
func decodeListCursor(s string, k store.ListKind) (store.ListPosition, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.ListPosition{}, ErrBadCursor
	}
	f := strings.Split(string(raw), ".")
	if len(f) != 7 || f[0] != fmt.Sprintf("l%d", k) {
		return store.ListPosition{}, ErrBadCursor
	}
	var n [4]int64
	for i := range n {
		if n[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return store.ListPosition{}, ErrBadCursor
		}
	}
	id, err1 := uuid.Parse(f[5])
	death, err2 := uuid.Parse(f[6])
	if err1 != nil || err2 != nil {
		return store.ListPosition{}, ErrBadCursor
	}
	return store.ListPosition{Priority: n[0], TurnAt: time.UnixMicro(n[1]).UTC(), Part: n[2], At: time.UnixMicro(n[3]).UTC(), ID: id, Death: death}, nil
}
