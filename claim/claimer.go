package claim

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Claimer is the consumer side of a queue for one session: it claims items
// for the session, extends their leases, and releases what a claim with an
// unknown outcome took. A worker uses one per session; producers and
// administrators use the Queue. Items are settled (Ack, AckMany, Nack,
// Release) on the Queue: an Item carries its claim.
//
// A Claimer is a small value: make one with Queue.Claimer whenever it is
// needed. It is safe for concurrent use.
type Claimer struct {
	q       *Queue
	session uuid.UUID
}

// Claimer returns the Claimer of session (a session.Session's ID): the
// claims it makes are the session's, and end with it.
func (q *Queue) Claimer(session uuid.UUID) Claimer {
	return Claimer{q: q, session: session}
}

// Claim claims up to req.Max vested, unclaimed items of the queue for the
// session, in one statement, lowest priority value first, then earliest
// turn (the vesting time; in a fair queue, the turn enqueue stamped: see
// Settings), leaving out the items of req.SkipTenants. Concurrent
// claimers never get the same item: rows locked by one claimer are skipped
// by the others.
//
// With req.Parts nil, it claims in any part. With req.Parts, it claims only
// in those parts, which the session must own (rows in the session-parts
// table); the claims name the part, so they are released when the session
// gives the part up. If a part is no longer owned, or the session no longer
// exists, it returns an error wrapping ErrNotOwner and claims nothing.
//
// Every claim increments the item's token and takes a lease of req.Lease,
// or Options.Lease. A paused queue yields no items, and neither do items
// whose attempts are used up (Reap moves them to the dead items).
//
// The claim commits by itself (in its own transaction). If its outcome is
// unknown (the error wraps ErrOutcomeUnknown), items may be claimed for the
// session without the caller knowing them: call ReleaseForgotten with the
// ids the session does know, or let their leases expire.
//
// At-most-once items (NewItem.AtMostOnce, or Policy.AtMostOnce of the
// queue) are deleted by the claim before it returns them, in the claim's
// transaction on CockroachDB and by a second statement on PostgreSQL: they
// are handed out at most once, whatever happens next. If that deletion
// fails, they are not returned; they stay claimed with their one attempt
// used, so they are never handed out again (Reap moves them to the dead
// items as a crash loop once their lease ends).
func (c Claimer) Claim(ctx context.Context, req ClaimRequest) (items []Item, err error) {
	if end := c.q.startStep(ctx, StepClaim, nil); end != nil {
		defer func() { end(items, err) }()
	}
	return c.q.claimWith(ctx, c.session, req)
}

// ClaimUrgent is the urgent lane: it claims up to req.Max vested, unclaimed
// items of the queue whose priority is at most req.MaxPriority, from any
// part, for the session, lowest priority value first, then earliest turn.
//
// In parts mode each session claims the best items of its own parts only,
// so an urgent item waits for its part's owner, behind whatever that owner
// is busy with, while other sessions take less urgent items of their own
// parts: the order is relaxed (see docs/parts-and-order.md, "How relaxed
// the order is"). A session that runs ClaimUrgent before the Claim of its parts
// takes the queue's most urgent items wherever they are, so an urgent item
// waits for the first session with a free slot rather than for its part's
// owner.
//
// Items of limited tenants come only from the session's own parts when the
// request says which tenants are limited (UrgentRequest.OwnedParts,
// AllTenantsLimited, LimitedTenants): a tenant's limit is then enforced by
// its part's owner alone, as without the lane.
//
// The claims name no part, like those of a Claim without Parts: giving up
// the part does not release them; the lease, the session's end, Ack, Nack
// and Release do, as for any claim. An urgent item may thus run while its
// part's owner works on other items of the same key. Otherwise it is Claim:
// leases, tokens, pausing, expiry, at-most-once items, the commit and an
// unknown outcome are the same.
//
// Concurrent claimers never get the same item. On CockroachDB a lane claim
// and a part claim may pick the same row and then wait for each other or
// retry (Stats.Retries["claim"]); on PostgreSQL they skip each other's
// rows.
func (c Claimer) ClaimUrgent(ctx context.Context, req UrgentRequest) (items []Item, err error) {
	if end := c.q.startStep(ctx, StepClaim, nil); end != nil {
		defer func() { end(items, err) }()
	}
	return c.q.claimUrgent(ctx, c.session, req)
}

// Extend moves the leases of items that are still claimed (same session,
// same token) to now()+d by the database clock, in one statement, and
// returns those items with their new LeaseUntil. Items missing from the
// result lost their claims (acked, released, reaped, or their session is
// gone): stop working on them. Items of another session are never this
// Claimer's: they are left out, as lost claims are, and nothing is asked of
// the database for them. A long-running handler's worker calls it well
// before LeaseUntil. d is between 1 ms and a year.
func (c Claimer) Extend(ctx context.Context, items []Item, d time.Duration) ([]Item, error) {
	mine := items
	for i, it := range items {
		if it.Session != c.session {
			mine = make([]Item, 0, len(items))
			mine = append(mine, items[:i]...)
			for _, it := range items[i+1:] {
				if it.Session == c.session {
					mine = append(mine, it)
				}
			}
			break
		}
	}
	return c.q.extend(ctx, mine, d)
}

// ReleaseForgotten releases the items of the queue claimed by the session
// that are not in keep, giving their attempts back, and returns how many
// it released. A worker calls it after a claim whose outcome was unknown
// (ErrOutcomeUnknown), with the ids of the items it is working on: the items
// that claim may have taken are released at once instead of at the end of
// their leases.
func (c Claimer) ReleaseForgotten(ctx context.Context, keep []uuid.UUID) (int, error) {
	return c.q.releaseForgotten(ctx, c.session, keep)
}
