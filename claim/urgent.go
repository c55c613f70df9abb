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
// parts: the order is relaxed (see docs/parts-and-order.md, "How relaxed
// the order is"). A session that runs ClaimUrgent before ClaimParts takes the
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
// rows (see sql.UrgentStatements).
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
	skip := req.SkipTenants
	if skip == nil {
		skip = []string{}
	}
	limited := req.LimitedTenants
	if limited == nil {
		limited = []string{}
	}
	owned := make([]int64, len(req.OwnedParts))
	for i, p := range req.OwnedParts {
		owned[i] = int64(p)
	}
	e := q.engine.Load()
	args := []any{session, q.opts.Queue, req.Max, lease.Microseconds(), skip, int64(req.MaxPriority),
		req.AllTenantsLimited, limited, owned}
	return q.runClaim(ctx, e, session, "claiming urgent items", q.urgentStatement(e), args)
}

// urgentStatement returns the lane's claim for the engine e, rendering it
// on first use.
func (q *Queue) urgentStatement(e *engine) string {
	if s := q.urgent.Load(); s != nil {
		return *s
	}
	d := crsql.Postgres
	if e.claimInTx {
		d = crsql.Cockroach
	}
	s := crsql.NewUrgentStatements(q.opts.Tables).ForDialect(d)
	q.urgent.Store(&s)
	return s
}
