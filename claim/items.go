package claim

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// ItemQuery asks Items for one page of the queue's items. The zero value
// asks for the first DefaultListLimit unclaimed items in claim order.
type ItemQuery struct {
	// State, when set, lists the items in that state, in any table:
	// StateQueued every unclaimed item (queued, delayed and snoozed: each
	// item's State says which) in claim order; StateRunning the claimed
	// items by lease end; StateWaiting the waiting items by enqueue time;
	// StateDead the deaths, StateAcked the acked and taken items and
	// StateCancelled the cancelled ones, newest first (the ended ones
	// within the queue's history window). Not with Claimed.
	State ItemState
	// Key lists only the items of this key, Kind only those of this kind
	// (NewItem.Kind) ("" any; with a State; Key not for StateAcked and
	// StateCancelled, whose records keep no key, Kind for every state).
	Key, Kind string
	// Claimed lists the claimed items, the soonest lease expiry first;
	// false lists the unclaimed items in claim order (priority, turn,
	// part, id).
	Claimed bool
	// Tenant lists only this tenant's unclaimed items ("" every tenant's;
	// not with Claimed), or with a State this tenant's items in it (not
	// for StateAcked and StateCancelled).
	Tenant string
	// After is the cursor of the previous page (ItemPage.Next); "" for the
	// first page. A cursor belongs to its query's Claimed and Tenant.
	After string
	// Limit is the most items in the page (0: DefaultListLimit).
	Limit int
}

// ItemPage is one page of Items.
type ItemPage struct {
	Items []ItemInfo
	// Next is the cursor of the next page: "" when this page is the last.
	// Items claimed, acked or enqueued while a caller pages may be missed or
	// listed again: a page is one read of the index that serves its order.
	Next string
}

// ItemInfo is an item, as Items lists it and Item looks it up.
type ItemInfo struct {
	ID uuid.UUID
	// Kind is its kind (NewItem.Kind; "" none; set by Item, and by Items
	// with a State).
	Kind string
	// Queue is its queue; State where it is (set by Item, and by Items with a State).
	Queue    string
	State    ItemState
	Part     int
	Key      string
	Priority int64
	Tenant   string
	// EnqueuedAt is when it was enqueued; VestingAt when it is (or was)
	// due; TurnAt its turn in a fair queue (VestingAt otherwise).
	EnqueuedAt, VestingAt, TurnAt time.Time
	// Attempts are its attempts so far, of at most MaxAttempts.
	Attempts, MaxAttempts int64
	// LastError is the error of its last attempt ("" if none; Items gives
	// its first 500 characters).
	LastError string
	// Claimed reports that a session holds it, until LeaseUntil.
	Claimed    bool
	LeaseUntil time.Time
	// PayloadSize is the size of its payload. Payload and Metadata are
	// read by Item only (nil in Items' pages).
	PayloadSize       int64
	Payload, Metadata []byte
	// Session is the session that runs it (claimed items; set by Item and
	// List).
	Session uuid.UUID
	// EndedAt is when it died or ended (dead and ended items), Reason why
	// it died, or why it was cancelled.
	EndedAt time.Time
	Reason  string
	// History is its attempts, oldest first, with their errors (Item
	// only). HistoryRecorded is false for an item that ended under code
	// older than schema version 6, which recorded no history;
	// HistoryOmitted reports attempts left out (an item keeps the last
	// HistoryMaxEntries failed ones).
	History         []Attempt
	HistoryRecorded bool
	HistoryOmitted  bool
}

// Items returns one page of this queue's items: without a State, of the
// items table (neither waiting items nor dead ones, see DeadItems),
// unclaimed ones in claim order or claimed ones by lease expiry
// (ItemQuery.Claimed), each page reading at most Limit+1 entries of the
// index that serves its order; with a State, the items in that state
// wherever they are (ItemQuery.State), optionally of one key or tenant.
// Page on by passing the page's Next as the next query's After. Pages are
// read by keyset, each going on after the previous page's last item, never
// by offset: paging from the first page to the last lists every item that
// stays in the state meanwhile exactly once, whatever is enqueued or ended
// meanwhile. A key or tenant filter reads the state's items in order until
// the page is full.
func (q *Queue) Items(ctx context.Context, iq ItemQuery) (ItemPage, error) {
	if iq.State != "" || iq.Key != "" || iq.Kind != "" {
		return q.list(ctx, iq)
	}
	what := fmt.Sprintf("claim: listing the items of %q", q.opts.Queue)
	switch {
	case iq.Limit < 0:
		return ItemPage{}, fmt.Errorf("%s: limit %d must not be negative (0: %d)", what, iq.Limit, DefaultListLimit)
	case iq.Claimed && iq.Tenant != "":
		return ItemPage{}, fmt.Errorf("%s: a tenant lists unclaimed items only: set Claimed or Tenant, not both", what)
	case iq.Limit == 0:
		iq.Limit = DefaultListLimit
	}
	var after *store.ItemPosition
	if iq.After != "" {
		p, err := decodeItemCursor(iq.After, iq.Claimed)
		if err != nil {
			return ItemPage{}, fmt.Errorf("%s: cursor %q: %w", what, iq.After, err)
		}
		after = &p
	}
	if err := q.ready(ctx); err != nil {
		return ItemPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var rows []store.ItemRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		// One more than asked: whether a next page exists.
		rows, err = q.store.ItemsPage(ctx, q.db, q.opts.Queue, iq.Tenant, iq.Claimed, after, iq.Limit+1)
		return store.Classify(err)
	})
	if err != nil {
		return ItemPage{}, fmt.Errorf("%s: %w", what, err)
	}
	var page ItemPage
	if len(rows) > iq.Limit {
		rows = rows[:iq.Limit]
		page.Next = encodeItemCursor(rows[iq.Limit-1], iq.Claimed)
	}
	page.Items = make([]ItemInfo, len(rows))
	for i, r := range rows {
		it := ItemInfo{ID: r.ID, Part: r.Part, Key: r.Key, Priority: r.Priority, Tenant: r.Tenant, EnqueuedAt: r.Enqueued,
			VestingAt: r.VestingAt, TurnAt: r.TurnAt, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts, LastError: r.LastError,
			Claimed: r.Claim != nil, PayloadSize: r.PayloadSize}
		if r.LeaseUntil != nil {
			it.LeaseUntil = *r.LeaseUntil
		}
		page.Items[i] = it
	}
	return page, nil
}

// encodeItemCursor writes the position of it in its page's order as an
// opaque token ("c" claimed: lease, id; "u" unclaimed: priority, turn,
// part, id).
func encodeItemCursor(it store.ItemRow, claimed bool) string {
	var raw string
	if claimed {
		var lease time.Time
		if it.LeaseUntil != nil {
			lease = *it.LeaseUntil
		}
		raw = fmt.Sprintf("c.%d.%s", lease.UnixMicro(), it.ID)
	} else {
		raw = fmt.Sprintf("u.%d.%d.%d.%s", it.Priority, it.TurnAt.UnixMicro(), it.Part, it.ID)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// decodeItemCursor reads encodeItemCursor's token for a query of claimed
// items or not.
func decodeItemCursor(s string, claimed bool) (store.ItemPosition, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.ItemPosition{}, ErrBadCursor
	}
	f := strings.Split(string(raw), ".")
	num := func(s string) (int64, bool) {
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}
	switch {
	case claimed && len(f) == 3 && f[0] == "c":
		lease, ok := num(f[1])
		id, err := uuid.Parse(f[2])
		if !ok || err != nil {
			return store.ItemPosition{}, ErrBadCursor
		}
		return store.ItemPosition{LeaseUntil: time.UnixMicro(lease).UTC(), ID: id}, nil
	case !claimed && len(f) == 5 && f[0] == "u":
		prio, ok1 := num(f[1])
		turn, ok2 := num(f[2])
		part, ok3 := num(f[3])
		id, err := uuid.Parse(f[4])
		if !ok1 || !ok2 || !ok3 || err != nil {
			return store.ItemPosition{}, ErrBadCursor
		}
		return store.ItemPosition{Priority: prio, TurnAt: time.UnixMicro(turn).UTC(), Part: int(part), ID: id}, nil
	}
	return store.ItemPosition{}, ErrBadCursor
}
