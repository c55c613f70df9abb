package claim

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Limit is a fleet-wide limit on a queue's items, or on one tenant's: at
// most MaxInFlight items claimed at once across all workers, and at most
// Rate items claimed per second. Zero means no limit, for each field.
//
// The database stores the limits; workers enforce them without a shared
// counter (see package worker, "Fleet-wide limits").
type Limit struct {
	// MaxInFlight is the most items claimed at once (0: no limit).
	MaxInFlight int
	// Rate is the most items claimed per second (0: no limit).
	Rate float64
}

// maxLimitInFlight bounds Limit.MaxInFlight: far above any fleet's
// handlers, it keeps the workers' share arithmetic from overflowing.
const maxLimitInFlight = 1 << 40

// Validate reports a limit that cannot be stored: negative, not a number,
// infinite, or MaxInFlight beyond 2^40.
func (l Limit) Validate() error {
	switch {
	case l.MaxInFlight < 0 || l.MaxInFlight > maxLimitInFlight:
		return fmt.Errorf("claim: max in flight %d is out of range (0: no limit, up to %d)", l.MaxInFlight, maxLimitInFlight)
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate < 0:
		return fmt.Errorf("claim: rate %v is not a number of items per second (0: no limit)", l.Rate)
	}
	return nil
}

// Unlimited reports whether l limits nothing.
func (l Limit) Unlimited() bool { return l.MaxInFlight == 0 && l.Rate == 0 }

// setTenantLimit (SettingsUpdate.TenantLimits) stores tenant's own limit on the queue, which replaces the
// queue's default for each tenant (Policy.TenantMaxInFlight and
// Policy.TenantRate) for that tenant; a zero Limit makes the tenant
// unlimited. Workers pick it up within their limits' refresh interval
// (worker.LimitOptions.Refresh). The tenant is at most MaxKeyLength bytes
// of valid UTF-8, without NUL bytes, as NewItem.Tenant.
func (q *Queue) setTenantLimit(ctx context.Context, tenant string, l Limit) error {
	if tenant == "" {
		return errors.New("claim: a tenant limit needs a tenant name")
	}
	if err := store.CheckText("the tenant", tenant, MaxKeyLength); err != nil {
		return fmt.Errorf("claim: setting a tenant's limit: %w (MaxKeyLength)", err)
	}
	if err := l.Validate(); err != nil {
		return err
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: setting the limit of tenant %q of %q: %w", tenant, q.opts.Queue, err)
	}
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return store.Classify(q.store.QueueTenantLimitSet(ctx, q.db, q.opts.Queue, tenant, int64(l.MaxInFlight), l.Rate))
	})
	q.spread.forget() // this process's enqueues see the limit at once
	if err != nil {
		return fmt.Errorf("claim: setting the limit of tenant %q of %q: %w", tenant, q.opts.Queue, err)
	}
	return nil
}

// removeTenantLimit (a nil limit of SettingsUpdate.TenantLimits) deletes tenant's own limit: the queue's default for
// each tenant applies to it again. It reports whether there was one.
func (q *Queue) removeTenantLimit(ctx context.Context, tenant string) (bool, error) {
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: removing the limit of tenant %q of %q: %w", tenant, q.opts.Queue, err)
	}
	var had bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		had, err = q.store.QueueTenantLimitRemove(ctx, q.db, q.opts.Queue, tenant)
		return store.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: removing the limit of tenant %q of %q: %w", tenant, q.opts.Queue, err)
	}
	return had, nil
}

// TenantLimits returns the tenants' own limits on the queue (those set with
// SettingsUpdate.TenantLimits), by tenant.
func (q *Queue) tenantLimits(ctx context.Context) (map[string]Limit, error) {
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: reading the tenant limits of %q: %w", q.opts.Queue, err)
	}
	out, err := readTenantLimits(ctx, q.db, q.store, q.opts.Queue)
	if err != nil {
		return nil, fmt.Errorf("claim: reading the tenant limits of %q: %w", q.opts.Queue, err)
	}
	return out, nil
}

func readTenantLimits(ctx context.Context, db crsql.DB, s *store.Store, queue string) (map[string]Limit, error) {
	var rows []store.TenantLimitRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = s.QueueTenantLimits(ctx, db, queue)
		return store.Classify(err)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]Limit, len(rows))
	for _, l := range rows {
		out[l.Tenant] = Limit{MaxInFlight: int(l.MaxInFlight), Rate: l.Rate}
	}
	return out, nil
}
