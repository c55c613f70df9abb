package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// UrgentRequest says what ClaimUrgent claims.
type UrgentRequest struct {
	// Max is the most items to claim.
	Max int
	// MaxPriority is the lane's threshold: only items with priority <= it
	// are claimed.
	MaxPriority int
	// SkipTenants lists tenants whose items are left unclaimed, as in
	// ClaimRequest.
	SkipTenants []string
	// OwnedParts, AllTenantsLimited and LimitedTenants keep the lane
	// within tenant limits enforced per part (package worker in parts
	// mode: the owner of a tenant's part enforces the tenant's whole
	// limit). Items of limited tenants are claimed only from OwnedParts
	// (the parts the session owns): items of every tenant if
	// AllTenantsLimited (the queue has a default tenant limit), otherwise
	// those of the tenants in LimitedTenants. Items without a tenant, and
	// of tenants not limited, come from any part. The zero values restrict
	// nothing.
	OwnedParts        []int
	AllTenantsLimited bool
	LimitedTenants    []string
	// Lease, if not zero, is the lease these claims take instead of
	// Options.Lease, as in ClaimRequest.
	Lease time.Duration
}

// ClaimUrgent is the urgent lane: it claims up to req.Max vested, unclaimed
// items of the queue whose priority is at most req.MaxPriority, from any
// part, for session, lowest priority value first, then earliest turn.
//
// In parts mode each session claims the best items of its own parts only,
// so an urgent item waits for its part's owner, behind whatever that owner
// is busy with, while other sessions take less urgent items of their own
// parts: the order is relaxed (see the README's "How relaxed is the
// order"). A session that runs ClaimUrgent before ClaimParts takes the
// queue's most urgent items wherever they are, so an urgent item waits for
// the first session with a free slot rather than for its part's owner.
//
// Items of limited tenants come only from the session's own parts when the
// request says which tenants are limited (UrgentRequest.OwnedParts,
// AllTenantsLimited, LimitedTenants): a tenant's limit is then enforced by
// its part's owner alone, as without the lane.
//
// The claims name no part, like Claim's: giving up the part does not
// release them; the lease, the session's end, Ack, Nack and Release do, as
// for any claim. An urgent item may thus run while its part's owner works
// on other items of the same key. Otherwise it is ClaimWith: leases,
// tokens, pausing, expiry, at-most-once items, the commit and an unknown
// outcome (see Claim) are the same.
//
// Concurrent claimers never get the same item. On CockroachDB a lane claim
// and a part claim may pick the same row and then wait for each other or
// retry (Stats.Retries["claim"]); on PostgreSQL they skip each other's
// rows (see sql.Store.ClaimUrgent).
func (q *Queue) ClaimUrgent(ctx context.Context, session uuid.UUID, req UrgentRequest) ([]Item, error) {
	if req.Max <= 0 {
		return nil, nil
	}
	lease, err := q.leaseFor(req.Lease)
	if err != nil {
		return nil, err
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: claiming urgent items in %q: %w", q.opts.Queue, err)
	}
	e := q.engine.Load()
	a := crsql.UrgentArgs{
		ClaimArgs:   crsql.ClaimArgs{Session: session, Queue: q.opts.Queue, Limit: req.Max, Lease: lease, SkipTenants: req.SkipTenants},
		MaxPriority: req.MaxPriority, OwnedParts: req.OwnedParts,
		AllTenantsLimited: req.AllTenantsLimited, LimitedTenants: req.LimitedTenants,
	}
	return q.runClaim(ctx, e, session, "claiming urgent items", func(ctx context.Context, db crsql.DB) ([]crsql.ClaimedRow, error) {
		return q.store.ClaimUrgent(ctx, db, e.dialect, a)
	})
}
