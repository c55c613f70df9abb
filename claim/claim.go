package claim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Item is a claimed item. Keep it as returned: Ack, Nack and Release use its
// claim fields to prove the claim is still this one.
type Item struct {
	ID          uuid.UUID // as returned by Enqueue
	Queue       string
	Part        int    // fixed at enqueue (from Key, if set); moved only by partition.SetParts
	Key         string // "" if none
	Priority    int    // lower values are claimed first
	Attempt     int    // 1 on the first claim; counts claims, including ones lost to a crash
	MaxAttempts int    // after this many attempts, Nack moves the item to the dead-items table
	Payload     []byte
	Metadata    []byte
	EnqueuedAt  time.Time // by the database clock
	VestingAt   time.Time // when the item last became claimable, by the database clock
	LastError   string    // the error of the previous attempt, if any

	// Session is the session that holds the claim.
	Session uuid.UUID
	// Token is the claim's fencing token: every claim of the item
	// increments it, so it never repeats. Ack, Nack, Release and Extend act
	// only if the item is still claimed by Session with this Token.
	Token int64
	// LeaseUntil is when the claim's lease ends, by the database clock.
	// Past it, any session's Reap may release the item; Extend moves it.
	LeaseUntil time.Time
	// InPart reports a parts-mode claim: the claim names the part too, and
	// giving up the part releases it.
	InPart bool
	// Tenant is the item's tenant ("" if none).
	Tenant string
	// ExpiresAt is the item's deadline by the database clock (zero: none).
	// Claims never hand the item out past it; a claim made before it may
	// still ack it.
	ExpiresAt time.Time
	// AtMostOnce reports an at-most-once item: its claim deleted it. Ack
	// only runs its record, in a transaction of its own (there is no claim
	// left to check: call it once, and never again after an unknown
	// outcome, or the record may commit twice); Nack, Snooze and Release
	// report, at once and without writing anything, an error wrapping
	// ErrClaimLost that says the item is at-most-once (Nack and Snooze with
	// the outcome Dropped), and Extend leaves it out. The item is never
	// handed out again.
	AtMostOnce bool
	// TurnAt is the item's place in claim order within its priority: its
	// vesting time, or in a fair queue the turn enqueue stamped.
	TurnAt time.Time
	// Checkpoint is the checkpoint an earlier attempt saved
	// (Queue.SaveCheckpoint, worker.SaveCheckpoint), nil if none: resume
	// from it. Progress is the progress last reported (Queue.ReportProgress),
	// zero if none.
	Checkpoint []byte
	Progress   Progress
	// Headers are the headers the producer gave (NewItem.Headers), such as
	// trace context; nil if none. Values that are not strings (written by
	// hand into the column) are left out.
	Headers map[string]string
	// Timeout is the item's own handler timeout (NewItem.Timeout), zero if
	// none: package worker runs its handler with this deadline instead of
	// its ItemTimeout.
	Timeout time.Duration
	// Kind is the item's kind (NewItem.Kind), "" if none: a worker.Kinds
	// runs the item with the handler registered for it.
	Kind string
}

// ClaimRequest says what Claimer.Claim claims.
type ClaimRequest struct {
	// Max is the most items to claim.
	Max int
	// Parts, if not nil, restricts the claim to these parts, which the
	// session must own (an empty, non-nil list claims nothing); nil claims
	// in any part.
	Parts []int
	// SkipTenants lists tenants whose items are left unclaimed (for
	// example tenants at their limit).
	SkipTenants []string
	// Lease, if not zero, is the lease these claims take instead of
	// Options.Lease (between 1 ms and a year): package worker claims with
	// its own default when the queue's Options.Lease was left zero.
	Lease time.Duration
}

// leaseFor returns the lease of a claim that asked for d: d, or
// Options.Lease when d is zero.
func (q *Queue) leaseFor(d time.Duration) (time.Duration, error) {
	switch {
	case d == 0:
		return q.opts.Lease, nil
	case d < time.Millisecond || d > maxLease:
		return 0, fmt.Errorf("claim: Lease %v must be between 1ms and %v", d, maxLease)
	}
	return d, nil
}

// claimWith is Claimer.Claim for session (see its documentation).
func (q *Queue) claimWith(ctx context.Context, session uuid.UUID, req ClaimRequest) ([]Item, error) {
	if req.Max <= 0 || (req.Parts != nil && len(req.Parts) == 0) {
		return nil, nil
	}
	lease, err := q.leaseFor(req.Lease)
	if err != nil {
		return nil, err
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: claiming in %q: %w", q.opts.Queue, err)
	}
	e := q.engine.Load()
	a := store.ClaimArgs{Session: session, Queue: q.opts.Queue, Limit: req.Max, Lease: lease, SkipTenants: req.SkipTenants}
	if req.Parts == nil {
		return q.runClaim(ctx, e, session, "claiming", q.sequenceGuard(e, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimAnySequenced(ctx, db, e.dialect, a)
		}, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimAny(ctx, db, e.dialect, a)
		}))
	}
	// Each part once: the statement reads every listed part with its own
	// limit, and a part listed twice would pick its rows twice.
	ps := make([]int64, 0, len(req.Parts))
	seen := make(map[int]bool, len(req.Parts))
	for _, p := range req.Parts {
		if !seen[p] {
			seen[p] = true
			ps = append(ps, int64(p))
		}
	}
	if len(ps) > store.MaxPartBranches {
		if q.sequenced(ctx) {
			return q.claimManyPartsSequenced(ctx, e, session, a, ps)
		}
		return q.claimManyParts(ctx, e, session, req.Max, ps, req.SkipTenants, lease)
	}
	claimIn := func(a store.ClaimArgs, ps []int64) ([]Item, error) {
		return q.runClaim(ctx, e, session, "claiming", q.sequenceGuard(e, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimPartsSequenced(ctx, db, e.dialect, a, ps)
		}, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
			return q.store.ItemsClaimParts(ctx, db, e.dialect, a, ps)
		}))
	}
	// In a fair queue each part is read up to its share of the claim (see
	// partShare; sequenced claims read every part whole), and the parts
	// that gave their whole share are read again for the rest.
	a.PartLimit = q.claimShare(ctx, req.Max, len(ps))
	items, err := claimIn(a, ps)
	if err != nil || a.PartLimit == 0 || len(items) >= req.Max {
		return items, err
	}
	gave := make(map[int]int, len(ps))
	for _, it := range items {
		gave[it.Part]++
	}
	full := make([]int64, 0, len(ps))
	for _, p := range ps {
		if gave[int(p)] >= a.PartLimit {
			full = append(full, p)
		}
	}
	if len(full) == 0 {
		return items, nil // every part gave all it had
	}
	rest := a
	rest.Limit, rest.PartLimit = req.Max-len(items), 0
	more, err := claimIn(rest, full)
	return append(items, more...), err
}

// claimManyParts is claimWith for a session that lists more parts than one
// per-part claim statement reads (store.MaxPartBranches): in one
// transaction, a Pick per group of parts locks the best n claimable items
// of each group, the best n of them all in (priority, turn_at) order are
// claimed by ClaimPicked, and the other picked rows are left as they were
// (their locks end with the transaction, which commits at once). So the
// claim hands out what one statement over every part would: the best n
// across the parts, each part read up to n entries. The transaction is
// SERIALIZABLE on CockroachDB (which refuses SKIP LOCKED under READ
// COMMITTED) and at the server's default isolation on PostgreSQL, as the
// single-statement claims are (see Queue.ready).
func (q *Queue) claimManyParts(ctx context.Context, e *engine, session uuid.UUID, n int, parts []int64, skip []string, lease time.Duration) ([]Item, error) {
	opts := pgx.TxOptions{}
	if e.dialect == store.Cockroach {
		opts.IsoLevel = pgx.Serializable
	}
	var items []Item
	err := retry.TxWith(ctx, q.db, opts, q.stats.retried("claim"), func(ctx context.Context, tx pgx.Tx) error {
		var all []store.PickedRow
		for start := 0; start < len(parts); start += store.MaxPartBranches {
			group := parts[start:min(start+store.MaxPartBranches, len(parts))]
			picked, err := q.store.ItemsPickParts(ctx, tx, q.opts.Queue, n, skip, group)
			if err != nil {
				return err
			}
			all = append(all, picked...)
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].Priority != all[j].Priority {
				return all[i].Priority < all[j].Priority
			}
			return all[i].TurnAt.Before(all[j].TurnAt)
		})
		all = all[:min(n, len(all))]
		if len(all) == 0 {
			items = nil
			return nil
		}
		ids := make([]uuid.UUID, len(all))
		for i, r := range all {
			ids[i] = r.ID
		}
		rows, err := q.store.ItemsClaimPicked(ctx, tx, e.dialect, session, lease, ids)
		if err != nil {
			return err
		}
		items = itemsOf(rows, session)
		items, err = q.takeAtMostOnce(ctx, tx, e, items)
		return err
	})
	return q.claimed(session, "claiming", items, err)
}

// runClaim runs one of the claim statements (claimWith's, or claimUrgent's)
// with args, takes the at-most-once items among what it claimed, and
// returns the items in claim order. what says what the claim does, for
// errors.
func (q *Queue) runClaim(ctx context.Context, e *engine, session uuid.UUID, what string,
	claim func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error)) ([]Item, error) {
	var items []Item
	run := func(ctx context.Context, db crsql.DB) error {
		rows, err := claim(ctx, db)
		if err != nil {
			return err
		}
		items = itemsOf(rows, session)
		return nil
	}
	var err error
	if e.claimInTx {
		err = retry.Tx(ctx, q.db, q.stats.retried("claim"), func(ctx context.Context, tx pgx.Tx) error {
			if err := run(ctx, tx); err != nil {
				return err
			}
			items, err = q.takeAtMostOnce(ctx, tx, e, items)
			return err
		})
	} else {
		err = retry.Do(ctx, q.stats.retried("claim"), func(ctx context.Context) error { return run(ctx, q.db) })
		if err == nil {
			items = q.takeAtMostOnceAlone(ctx, e, items)
		}
	}
	return q.claimed(session, what, items, err)
}

// claimed finishes a claim that returned items and err: it reports a
// foreign-key violation as ErrNotOwner (a part the session does not own),
// or sorts the items in claim order and counts them.
func (q *Queue) claimed(session uuid.UUID, what string, items []Item, err error) ([]Item, error) {
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return nil, fmt.Errorf("claim: %s in %q for session %s: %w (%v)", what, q.opts.Queue, session, ErrNotOwner, pgErr.Message)
		}
		return nil, fmt.Errorf("claim: %s in %q for session %s: %w", what, q.opts.Queue, session, store.Classify(err))
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Priority != items[j].Priority {
			return items[i].Priority < items[j].Priority
		}
		return items[i].TurnAt.Before(items[j].TurnAt)
	})
	q.stats.claimed.Add(int64(len(items)))
	return items, nil
}

// takeAtMostOnce deletes the at-most-once items among items through db and
// returns items without those it could not delete.
func (q *Queue) takeAtMostOnce(ctx context.Context, db crsql.DB, e *engine, items []Item) ([]Item, error) {
	var keys []store.ClaimKey
	for _, it := range items {
		if it.AtMostOnce {
			keys = append(keys, it.claimKey())
		}
	}
	if len(keys) == 0 {
		return items, nil
	}
	taken, err := q.store.ItemsTakeAtMostOnce(ctx, db, e.dialect, keys)
	if err != nil {
		return nil, err
	}
	gone := make(map[uuid.UUID]bool, len(taken))
	for _, id := range taken {
		gone[id] = true
	}
	out := items[:0]
	for _, it := range items {
		if !it.AtMostOnce || gone[it.ID] {
			out = append(out, it)
		}
	}
	return out, nil
}

// takeAtMostOnceAlone runs takeAtMostOnce by itself, after a claim that
// committed (PostgreSQL). If it fails for good, the at-most-once items are
// left out (see Claimer.Claim); the others are returned either way.
func (q *Queue) takeAtMostOnceAlone(ctx context.Context, e *engine, items []Item) []Item {
	if !atMostOnce(items) {
		return items // nothing to take (and no copy of the items to make)
	}
	var out []Item
	err := retry.Do(ctx, q.stats.retried("claim"), func(ctx context.Context) error {
		var err error
		out, err = q.takeAtMostOnce(ctx, q.db, e, append([]Item(nil), items...))
		return store.Classify(err)
	})
	if err == nil {
		return out
	}
	out = out[:0]
	for _, it := range items {
		if !it.AtMostOnce {
			out = append(out, it)
		}
	}
	return out
}

// itemsOf returns the claimed rows as session's Items (nil for none).
func itemsOf(rows []store.ClaimedRow, session uuid.UUID) []Item {
	if len(rows) == 0 {
		return nil
	}
	items := make([]Item, len(rows))
	for i, r := range rows {
		items[i] = Item{ID: r.ID, Queue: r.Queue, Part: r.Part, Key: r.Key, Priority: r.Priority,
			Attempt: r.Attempts, MaxAttempts: r.MaxAttempts, Payload: r.Payload, Metadata: r.Metadata,
			EnqueuedAt: r.EnqueuedAt, VestingAt: r.VestingAt, LastError: r.LastError,
			Session: session, Token: r.Token, LeaseUntil: r.LeaseUntil, InPart: r.InPart,
			Tenant: r.Tenant, ExpiresAt: r.ExpiresAt, AtMostOnce: r.AtMostOnce, TurnAt: r.TurnAt,
			Checkpoint: r.Checkpoint, Headers: headersOf(r.Headers), Timeout: r.Timeout, Kind: r.Kind}
		if r.HasProgress {
			items[i].Progress = Progress{Done: r.ProgressDone, Total: r.ProgressTotal}
		}
	}
	return items
}

// claimKey returns the claim that it holds, which the statements that act
// on a claimed item check.
func (it Item) claimKey() store.ClaimKey {
	return store.ClaimKey{ID: it.ID, Session: it.Session, Token: it.Token}
}

// claimKeys returns the claims of items.
func claimKeys(items []Item) []store.ClaimKey {
	keys := make([]store.ClaimKey, len(items))
	for i, it := range items {
		keys[i] = it.claimKey()
	}
	return keys
}
