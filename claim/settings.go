package claim

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Settings are a queue's settings, stored in the database so that every
// producer and worker of the queue follows the same ones. The zero value
// (a queue never configured) is a plain queue: first in, first out within
// a priority, at-least-once delivery, no limits.
type Settings struct {
	// Fair spreads claims over the tenants with vested work (NewItem.Tenant):
	// enqueue stamps each tenant's items one turn apart, starting from the
	// queue's head, so claims take one item of every backlogged tenant in
	// turn, and a tenant with ten items is not kept waiting behind one with
	// a million. Items without a tenant keep their vesting time as their
	// turn. It applies to items enqueued while it is on (by other
	// processes' Queues from at most a second after Configure: a Queue
	// that found its queue not fair asks again after a second).
	Fair bool
	// AtMostOnce makes every item enqueued while it is on at-most-once
	// (NewItem.AtMostOnce): its claim deletes it.
	AtMostOnce bool
	// MaxInFlight bounds the items of the queue being handled at once
	// across all workers (0: no bound). Workers divide it among themselves
	// (see package worker).
	MaxInFlight int
	// Rate bounds the items per second the workers start, all together
	// (0: no bound).
	Rate float64
	// TenantMaxInFlight and TenantRate are the same bounds for each tenant
	// of the queue (0: none).
	TenantMaxInFlight int
	TenantRate        float64
	// DedupWindow is how long the queue remembers the ids of items that
	// ended (acked, dead, cancelled, or taken by the claim of an
	// at-most-once item): an enqueue of such an id within the window adds
	// nothing and reports it done (Enqueued.Done), so that an enqueue
	// retried after an unknown outcome never runs its work twice. 0 means
	// the default, DefaultDedupWindow (a day); set DedupOff to remember
	// nothing. Make it longer than producers may retry, and at least the
	// period of the unique keys enqueued (NewItem.UniqueKey). At
	// microsecond precision; negative values are refused.
	DedupWindow time.Duration
	// DedupOff turns the dedup window off: ended ids are not recorded, and
	// an id is deduplicated only while its item is in the items table.
	DedupOff bool
}

// DefaultDedupWindow is the dedup window of a queue that does not set one
// (Settings.DedupWindow), and of a queue never configured.
const DefaultDedupWindow = 24 * time.Hour

// dedupWindow returns the window to store (stored at microsecond
// precision; 0: off).
func (s Settings) dedupWindow() time.Duration {
	switch {
	case s.DedupOff:
		return 0
	case s.DedupWindow == 0:
		return DefaultDedupWindow
	}
	return s.DedupWindow
}

// Validate reports settings that cannot be stored.
func (s Settings) Validate() error {
	switch {
	case s.MaxInFlight < 0 || s.TenantMaxInFlight < 0:
		return fmt.Errorf("claim: settings: negative max in flight (%d, tenant %d)", s.MaxInFlight, s.TenantMaxInFlight)
	case s.Rate < 0 || s.TenantRate < 0 || math.IsNaN(s.Rate) || math.IsNaN(s.TenantRate) ||
		math.IsInf(s.Rate, 0) || math.IsInf(s.TenantRate, 0):
		return fmt.Errorf("claim: settings: rates must be finite and not negative (%v, tenant %v)", s.Rate, s.TenantRate)
	case s.DedupWindow < 0:
		return fmt.Errorf("claim: settings: negative dedup window %v (use DedupOff to remember no ended ids)", s.DedupWindow)
	case s.DedupWindow > 0 && s.DedupWindow < time.Microsecond:
		return fmt.Errorf("claim: settings: dedup window %v is below the database's precision of 1µs", s.DedupWindow)
	case s.DedupOff && s.DedupWindow != 0:
		return fmt.Errorf("claim: settings: DedupOff with a dedup window of %v: set one or the other", s.DedupWindow)
	}
	return nil
}

// Settings reads the queue's settings (the zero Settings if it was never
// configured). DedupWindow is the stored window (DefaultDedupWindow unless
// set otherwise), or 0 with DedupOff.
func (q *Queue) Settings(ctx context.Context) (Settings, error) {
	if err := q.ready(ctx); err != nil {
		return Settings{}, fmt.Errorf("claim: reading the settings of %q: %w", q.opts.Queue, err)
	}
	var s Settings
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		r, stored, err := q.store.QueueSettings(ctx, q.db, q.opts.Queue)
		if err != nil || !stored {
			s = Settings{}
			return store.Classify(err)
		}
		s = Settings{Fair: r.Fair, AtMostOnce: r.AtMostOnce, MaxInFlight: int(r.MaxInFlight), Rate: r.Rate,
			TenantMaxInFlight: int(r.TenantMaxInFlight), TenantRate: r.TenantRate,
			DedupWindow: r.DedupWindow, DedupOff: r.DedupWindow <= 0}
		return nil
	})
	if err != nil {
		return Settings{}, fmt.Errorf("claim: reading the settings of %q: %w", q.opts.Queue, err)
	}
	return s, nil
}

// Configure stores the queue's settings, replacing all of them. A queue
// without a row in the queues table gets one with one part: give a queue
// its parts (worker.Options.Parts, partition.EnsureParts) before
// configuring it.
func (q *Queue) Configure(ctx context.Context, s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: configuring %q: %w", q.opts.Queue, err)
	}
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return store.Classify(q.store.ConfigureQueue(ctx, q.db, q.opts.Queue, store.QueueSettingsRow{
			Fair: s.Fair, AtMostOnce: s.AtMostOnce, MaxInFlight: int64(s.MaxInFlight), Rate: s.Rate,
			TenantMaxInFlight: int64(s.TenantMaxInFlight), TenantRate: s.TenantRate, DedupWindow: s.dedupWindow()}))
	})
	if err != nil {
		return fmt.Errorf("claim: configuring %q: %w", q.opts.Queue, err)
	}
	q.plainUntil.Store(0) // this Queue sees the change at once
	q.spread.forget()     // this process's enqueues see the new tenant limit at once
	return nil
}
