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
}

// Claim claims up to n vested, unclaimed items of the queue for session, in
// one statement, lowest priority value first, then earliest vesting time.
// Any session may claim any item (no parts). Concurrent claimers never get
// the same item: rows locked by one claimer are skipped by the others.
//
// Every claim increments the item's token and takes a lease of
// Options.Lease. A paused queue yields no items, and neither do items whose
// attempts are used up (Reap moves them to the dead items).
//
// The claim commits by itself (in its own transaction; see Queue.ready).
// If its outcome is
// unknown (the error wraps ErrOutcomeUnknown), items may be claimed for
// session without the caller knowing them: call ReleaseForgotten with the
// ids the session does know, or let their leases expire.
func (q *Queue) Claim(ctx context.Context, session uuid.UUID, n int) ([]Item, error) {
	return q.claim(ctx, false, session, n)
}

// ClaimParts is Claim restricted to the given parts, which session must own
// (rows in the session-parts table). The claims name the part, so they are
// released when the session gives the part up. If a part is no longer owned,
// it returns an error wrapping ErrNotOwner and claims nothing.
func (q *Queue) ClaimParts(ctx context.Context, session uuid.UUID, parts []int, n int) ([]Item, error) {
	if len(parts) == 0 {
		return nil, nil
	}
	// Each part once: the statement reads every listed part with its own
	// limit, and a part listed twice would pick its rows twice.
	ps := make([]int64, 0, len(parts))
	seen := make(map[int]bool, len(parts))
	for _, p := range parts {
		if !seen[p] {
			seen[p] = true
			ps = append(ps, int64(p))
		}
	}
	return q.claim(ctx, true, session, n, ps)
}

func (q *Queue) claim(ctx context.Context, inParts bool, session uuid.UUID, n int, extra ...any) ([]Item, error) {
	if n <= 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: claiming in %q: %w", q.opts.Queue, err)
	}
	args := append([]any{session, q.opts.Queue, n, q.opts.Lease.Microseconds()}, extra...)
	var items []Item
	e := q.engine.Load()
	stmt := e.st.ClaimAny
	if inParts {
		stmt = e.st.ClaimParts
	}
	run := func(ctx context.Context, db crsql.DB) error {
		rows, err := db.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		items, err = scanItems(rows, session)
		return err
	}
	var err error
	if e.claimInTx {
		err = retry.Tx(ctx, q.db, q.stats.retried("claim"), func(ctx context.Context, tx pgx.Tx) error { return run(ctx, tx) })
	} else {
		err = retry.Do(ctx, q.stats.retried("claim"), func(ctx context.Context) error { return run(ctx, q.db) })
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return nil, fmt.Errorf("claim: claiming in %q for session %s: %w (%v)", q.opts.Queue, session, ErrNotOwner, pgErr.Message)
		}
		return nil, fmt.Errorf("claim: claiming in %q for session %s: %w", q.opts.Queue, session, crsql.Classify(err))
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Priority != items[j].Priority {
			return items[i].Priority < items[j].Priority
		}
		return items[i].VestingAt.Before(items[j].VestingAt)
	})
	q.stats.claimed.Add(int64(len(items)))
	return items, nil
}

func scanItems(rows pgx.Rows, session uuid.UUID) ([]Item, error) {
	defer rows.Close()
	var items []Item
	for rows.Next() {
		var it Item
		var part, prio, attempts, maxAttempts int64
		var key, lastErr *string
		var claimPart *int64
		if err := rows.Scan(&it.ID, &it.Queue, &part, &key, &prio, &attempts, &maxAttempts,
			&it.Payload, &it.Metadata, &it.EnqueuedAt, &it.VestingAt, &lastErr, &claimPart, &it.Token, &it.LeaseUntil); err != nil {
			return nil, err
		}
		it.Part, it.Priority, it.Attempt, it.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
		if key != nil {
			it.Key = *key
		}
		if lastErr != nil {
			it.LastError = *lastErr
		}
		it.Session, it.InPart = session, claimPart != nil
		items = append(items, it)
	}
	return items, rows.Err()
}
