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
	// Claimed lists the claimed items, the soonest lease expiry first;
	// false lists the unclaimed items in claim order (priority, turn,
	// part, id).
	Claimed bool
	// Tenant lists only this tenant's unclaimed items ("" every tenant's;
	// not with Claimed).
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

// ItemInfo is an item in the items table, as Items lists it and Item
// looks it up.
type ItemInfo struct {
	ID       uuid.UUID
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
}

// Items returns one page of this queue's items (the items table: neither
// waiting items nor dead ones, see DeadItems), unclaimed ones in claim
// order or claimed ones by lease expiry (ItemQuery.Claimed). Page on by
// passing the page's Next as the next query's After. Each page reads at
// most Limit+1 entries of the index that serves its order.
func (q *Queue) Items(ctx context.Context, iq ItemQuery) (ItemPage, error) {
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

// Item looks up the item id of this queue in the items table, whole, and
// reports false when the queue has no such item there (it is waiting,
// dead, ended, or in another queue: see WaitEnded, DeadItems).
func (q *Queue) Item(ctx context.Context, id uuid.UUID) (ItemInfo, bool, error) {
	if err := q.ready(ctx); err != nil {
		return ItemInfo{}, false, fmt.Errorf("claim: reading item %s of %q: %w", id, q.opts.Queue, err)
	}
	var d store.ItemDetail
	var found bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		d, found, err = q.store.ItemsGet(ctx, q.db, id)
		return store.Classify(err)
	})
	if err != nil {
		return ItemInfo{}, false, fmt.Errorf("claim: reading item %s of %q: %w", id, q.opts.Queue, err)
	}
	if !found || d.Queue != q.opts.Queue {
		return ItemInfo{}, false, nil
	}
	it := ItemInfo{ID: d.ID, Part: d.Part, Key: d.Key, Priority: d.Priority, Tenant: d.Tenant, EnqueuedAt: d.EnqueuedAt,
		VestingAt: d.VestingAt, TurnAt: d.TurnAt, Attempts: d.Attempts, MaxAttempts: d.MaxAttempts, LastError: d.LastError,
		Claimed: d.Claim != nil, PayloadSize: int64(len(d.Payload)), Payload: d.Payload, Metadata: d.Metadata}
	if d.LeaseUntil != nil {
		it.LeaseUntil = *d.LeaseUntil
	}
	return it, true, nil
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
