package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// storedLimits reads the queue's stored limits (claim.Policy and
// claim.SettingsUpdate.TenantLimits) and the database clock: a read by
// primary key and one of the tenants' limits on the maintenance connection.
func (w *Worker) storedLimits(ctx context.Context) (Limits, time.Time, error) {
	var l Limits
	var dbNow time.Time
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		row, err := w.store.QueueLimits(ctx, w.db, w.name)
		l.Queue = claim.Limit{MaxInFlight: row.MaxInFlight, Rate: row.Rate}
		l.Tenant = claim.Limit{MaxInFlight: row.TenantMaxInFlight, Rate: row.TenantRate}
		dbNow = row.Now
		return store.Classify(err)
	})
	if err != nil {
		return Limits{}, time.Time{}, fmt.Errorf("worker: reading the limits of %q: %w", w.name, err)
	}
	var rows []store.TenantLimitRow
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = w.store.QueueTenantLimits(ctx, w.db, w.name)
		return store.Classify(err)
	})
	if err != nil {
		return Limits{}, time.Time{}, fmt.Errorf("worker: reading the tenant limits of %q: %w", w.name, err)
	}
	l.Tenants = make(map[string]claim.Limit, len(rows))
	for _, r := range rows {
		l.Tenants[r.Tenant] = claim.Limit{MaxInFlight: int(r.MaxInFlight), Rate: r.Rate}
	}
	return l, dbNow, nil
}

// claim claims up to pl.n items in parts (nil: without parts), leaving out
// the tenants at their share.
func (w *Worker) claim(ctx context.Context, sess *session.Session, parts []int, pl plan) ([]claim.Item, error) {
	return w.queue.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: pl.n, Parts: parts, SkipTenants: pl.skip, Lease: w.lease})
}
