package claim

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// UrgentRequest says what Claimer.ClaimUrgent claims.
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

// claimUrgent is Claimer.ClaimUrgent for session (see its documentation).
func (q *Queue) claimUrgent(ctx context.Context, session uuid.UUID, req UrgentRequest) ([]Item, error) {
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
	a := store.UrgentArgs{
		ClaimArgs:   store.ClaimArgs{Session: session, Queue: q.opts.Queue, Limit: req.Max, Lease: lease, SkipTenants: req.SkipTenants},
		MaxPriority: req.MaxPriority, OwnedParts: req.OwnedParts,
		AllTenantsLimited: req.AllTenantsLimited, LimitedTenants: req.LimitedTenants,
	}
	return q.runClaim(ctx, e, session, "claiming urgent items", q.sequenceGuard(e, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
		return q.store.ItemsClaimUrgentSequenced(ctx, db, e.dialect, a)
	}, func(ctx context.Context, db crsql.DB) ([]store.ClaimedRow, error) {
		return q.store.ItemsClaimUrgent(ctx, db, e.dialect, a)
	}))
}
