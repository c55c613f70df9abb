package worker

import (
	"context"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// itemTenant returns the tenant of an item ("" for none).
func itemTenant(claim.Item) string { return "" }

// storedLimits reads the queue's stored limits.
func (w *Worker) storedLimits(context.Context) (Limits, time.Time, error) {
	return Limits{}, time.Time{}, nil
}

// claim claims up to pl.n items in parts (nil: without parts).
func (w *Worker) claim(ctx context.Context, sess *session.Session, parts []int, pl plan) ([]claim.Item, error) {
	if parts != nil {
		return w.queue.ClaimParts(ctx, sess.ID(), parts, pl.n)
	}
	return w.queue.Claim(ctx, sess.ID(), pl.n)
}
