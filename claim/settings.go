package claim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/partition"
)

// Policy is how a queue's items are enqueued and claimed: fairness,
// at-most-once delivery, the queue's and its tenants' default limits, the
// dedup window. It is stored in the database (SettingsUpdate.Policy) so
// that every producer and worker of the queue follows the same one. The
// zero value (a queue never configured) is a plain queue: first in, first
// out within a priority, at-least-once delivery, no limits, the default
// dedup window.
type Policy struct {
	// Fair spreads claims over the tenants with vested work (NewItem.Tenant):
	// enqueue stamps each tenant's items one turn apart, starting from the
	// queue's head, so claims take one item of every backlogged tenant in
	// turn, and a tenant with ten items is not kept waiting behind one with
	// a million. Items without a tenant keep their vesting time as their
	// turn. It applies to items enqueued while it is on (by other
	// processes' Queues from at most a second after UpdateSettings: a Queue
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
// (Policy.DedupWindow), and of a queue never configured.
const DefaultDedupWindow = 24 * time.Hour

// dedupWindow returns the window to store (stored at microsecond
// precision; 0: off).
func (s Policy) dedupWindow() time.Duration {
	switch {
	case s.DedupOff:
		return 0
	case s.DedupWindow == 0:
		return DefaultDedupWindow
	}
	return s.DedupWindow
}

// Validate reports a policy that cannot be stored.
func (s Policy) Validate() error {
	switch {
	case s.MaxInFlight < 0 || s.TenantMaxInFlight < 0:
		return fmt.Errorf("claim: policy: negative max in flight (%d, tenant %d)", s.MaxInFlight, s.TenantMaxInFlight)
	case s.Rate < 0 || s.TenantRate < 0 || math.IsNaN(s.Rate) || math.IsNaN(s.TenantRate) ||
		math.IsInf(s.Rate, 0) || math.IsInf(s.TenantRate, 0):
		return fmt.Errorf("claim: policy: rates must be finite and not negative (%v, tenant %v)", s.Rate, s.TenantRate)
	case s.DedupWindow < 0:
		return fmt.Errorf("claim: policy: negative dedup window %v (use DedupOff to remember no ended ids)", s.DedupWindow)
	case s.DedupWindow > 0 && s.DedupWindow < time.Microsecond:
		return fmt.Errorf("claim: policy: dedup window %v is below the database's precision of 1µs", s.DedupWindow)
	case s.DedupOff && s.DedupWindow != 0:
		return fmt.Errorf("claim: policy: DedupOff with a dedup window of %v: set one or the other", s.DedupWindow)
	}
	return nil
}

// policy reads the queue's policy (the zero Policy if it was never
// configured). DedupWindow is the stored window (DefaultDedupWindow unless
// set otherwise), or 0 with DedupOff.
func (q *Queue) policy(ctx context.Context) (Policy, error) {
	var s Policy
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		r, stored, err := q.store.QueueSettings(ctx, q.db, q.opts.Queue)
		if err != nil || !stored {
			s = Policy{}
			return store.Classify(err)
		}
		s = Policy{Fair: r.Fair, AtMostOnce: r.AtMostOnce, MaxInFlight: int(r.MaxInFlight), Rate: r.Rate,
			TenantMaxInFlight: int(r.TenantMaxInFlight), TenantRate: r.TenantRate,
			DedupWindow: r.DedupWindow, DedupOff: r.DedupWindow <= 0}
		return nil
	})
	return s, err
}

// configure stores the queue's policy, replacing the one stored. A queue
// without a row in the queues table gets one with one part.
func (q *Queue) configure(ctx context.Context, s Policy) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: configuring %q: %w", q.opts.Queue, err)
	}
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return store.Classify(q.store.QueueConfigure(ctx, q.db, q.opts.Queue, store.QueueSettingsRow{
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

// Settings are all of a queue's stored settings, as Queue.Settings reads
// them back: its Policy (embedded: s.Fair, s.MaxInFlight, …), whether it
// is paused, its retention of dead items, its sequencing, its tenants' own
// limits and its number of parts. A queue never configured reads as the
// zero Policy, not paused, the default Retention, not sequenced, no tenant
// limits and one part.
type Settings struct {
	Policy
	// Paused reports that claims of the queue return nothing
	// (SettingsUpdate.Paused).
	Paused bool
	// Retention is how long and how many dead items the queue keeps.
	Retention Retention
	// Sequenced reports that items enqueued with a key are sequenced
	// (SettingsUpdate.Sequenced); SequencedItems that the queue holds
	// sequenced items (enqueued while it was sequenced), whose claims keep
	// their order while any is left; SequenceHold that a death of a
	// sequenced item holds its key (SettingsUpdate.SequenceHold).
	Sequenced, SequencedItems, SequenceHold bool
	// TenantLimits are the tenants' own limits, by tenant: each replaces
	// the Policy's TenantMaxInFlight and TenantRate for its tenant.
	TenantLimits map[string]Limit
	// Parts is the queue's number of parts (1 if it was never set).
	Parts int
}

// Toggle turns a setting of SettingsUpdate on or off; its zero value,
// Keep, leaves it as it is.
type Toggle int8

// The values of a Toggle.
const (
	Keep Toggle = iota // leave the setting as it is
	On                 // turn it on
	Off                // turn it off
)

// SettingsUpdate is what Queue.UpdateSettings changes: each field's zero
// value leaves its setting as it is, so an update names only what it
// changes (claim.SettingsUpdate{Paused: claim.On}).
type SettingsUpdate struct {
	// Parts, when not 0, sets the queue's number of parts (1 to
	// partition.MaxParts), as partition.SetParts does: lowering it moves
	// the items of the removed parts. Workers follow the stored count
	// within their rebalance interval. Set it before the queue's first
	// items so that none has to move (the quick start does).
	Parts int
	// Policy, when not nil, replaces the queue's policy (fairness,
	// at-most-once, default limits, dedup window): read Settings and
	// change its Policy to change one field of it.
	Policy *Policy
	// Paused pauses (On) or resumes (Off) the queue: from the next claim
	// on, the claims (Claimer) of every session return no items until it
	// is resumed. Items already claimed are acked, nacked or released as
	// usual, and enqueues go on.
	Paused Toggle
	// Retention, when not nil, replaces the queue's retention of dead
	// items; the next reap of any worker session applies it.
	Retention *Retention
	// Sequenced turns the queue's sequencing on (On) or off (Off): items
	// enqueued while it is on with a key (NewItem.Key) run one at a time
	// in their key's order (docs/sequences.md).
	Sequenced Toggle
	// SequenceHold sets what a death of one of the queue's sequenced items
	// (moved to the dead items, or cancelled) does to its key: On holds
	// the key's later items (the key is blocked, see BlockedKeys) until the
	// dead item is requeued, deleted, or the key released
	// (ReleaseSequenceKey); Off, the default, lets the key's next item run.
	// Turning it off releases the keys the dead items hold (the dead
	// items stay). Hold needs every worker of the queue at
	// crdbwork 0.6 or newer (schema version 6).
	SequenceHold Toggle
	// TenantLimits sets tenants' own limits, which replace the Policy's
	// TenantMaxInFlight and TenantRate for their tenant (a zero Limit
	// makes the tenant unlimited); a nil Limit removes the tenant's own
	// limit (the Policy's applies again). Workers pick them up within
	// their limits' refresh interval (worker.LimitOptions.Refresh). A
	// tenant is at most MaxKeyLength bytes of valid UTF-8, without NUL
	// bytes, as NewItem.Tenant.
	TenantLimits map[string]*Limit
}

// validate reports an update that cannot be stored, before anything is.
func (u SettingsUpdate) validate() error {
	if u.Parts < 0 || u.Parts > partition.MaxParts {
		return fmt.Errorf("claim: %d parts: the number of parts must be between 1 and %d", u.Parts, partition.MaxParts)
	}
	if u.Policy != nil {
		if err := u.Policy.Validate(); err != nil {
			return err
		}
	}
	if u.Retention != nil {
		if err := u.Retention.Validate(); err != nil {
			return err
		}
	}
	for name, t := range map[string]Toggle{"Paused": u.Paused, "Sequenced": u.Sequenced, "SequenceHold": u.SequenceHold} {
		if t < Keep || t > Off {
			return fmt.Errorf("claim: settings update: %s is %d, not Keep, On or Off", name, t)
		}
	}
	for tenant, l := range u.TenantLimits {
		if tenant == "" {
			return errors.New("claim: a tenant limit needs a tenant name")
		}
		if err := store.CheckText("the tenant", tenant, MaxKeyLength); err != nil {
			return fmt.Errorf("claim: setting a tenant's limit: %w (MaxKeyLength)", err)
		}
		if l != nil {
			if err := l.Validate(); err != nil {
				return fmt.Errorf("claim: the limit of tenant %q: %w", tenant, err)
			}
		}
	}
	return nil
}

// UpdateSettings stores the settings u names and leaves the others as they
// are. It checks all of u before it stores anything: an update it refuses
// changes nothing. It then stores them in the order of SettingsUpdate's
// fields, each in its own transaction, parts first (a queue without a row
// in the queues table gets one, with one part unless u sets Parts); if
// one fails, those before it are stored and the error says which failed.
// Every change is idempotent: run the update again.
func (q *Queue) UpdateSettings(ctx context.Context, u SettingsUpdate) error {
	if err := u.validate(); err != nil {
		return err
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: updating the settings of %q: %w", q.opts.Queue, err)
	}
	if u.Parts > 0 {
		if err := partition.SetParts(ctx, q.db, q.opts.Tables, q.opts.Queue, u.Parts); err != nil {
			return fmt.Errorf("claim: updating the settings of %q: %w", q.opts.Queue, err)
		}
	}
	if u.Policy != nil {
		if err := q.configure(ctx, *u.Policy); err != nil {
			return err
		}
	}
	if u.Paused != Keep {
		if err := q.setPaused(ctx, u.Paused == On); err != nil {
			return err
		}
	}
	if u.Retention != nil {
		if err := q.setRetention(ctx, *u.Retention); err != nil {
			return err
		}
	}
	if u.Sequenced != Keep {
		if err := q.setSequenced(ctx, u.Sequenced == On); err != nil {
			return err
		}
	}
	if u.SequenceHold != Keep {
		if _, err := q.setSequenceHold(ctx, u.SequenceHold == On); err != nil {
			return err
		}
	}
	tenants := make([]string, 0, len(u.TenantLimits))
	for t := range u.TenantLimits {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	for _, t := range tenants {
		var err error
		if l := u.TenantLimits[t]; l != nil {
			err = q.setTenantLimit(ctx, t, *l)
		} else {
			_, err = q.removeTenantLimit(ctx, t)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Settings reads all of the queue's stored settings back.
func (q *Queue) Settings(ctx context.Context) (Settings, error) {
	if err := q.ready(ctx); err != nil {
		return Settings{}, fmt.Errorf("claim: reading the settings of %q: %w", q.opts.Queue, err)
	}
	var s Settings
	var err error
	if s.Policy, err = q.policy(ctx); err != nil {
		return Settings{}, fmt.Errorf("claim: reading the settings of %q: %w", q.opts.Queue, err)
	}
	if s.Paused, err = q.paused(ctx); err != nil {
		return Settings{}, err
	}
	if s.Retention, err = q.retention(ctx); err != nil {
		return Settings{}, err
	}
	seq, err := q.sequencing(ctx)
	if err != nil {
		return Settings{}, err
	}
	s.Sequenced, s.SequencedItems, s.SequenceHold = seq.On, seq.Items, seq.Hold
	if s.TenantLimits, err = q.tenantLimits(ctx); err != nil {
		return Settings{}, err
	}
	if s.Parts, err = partition.Parts(ctx, q.db, q.opts.Tables, q.opts.Queue); err != nil {
		return Settings{}, fmt.Errorf("claim: reading the settings of %q: %w", q.opts.Queue, err)
	}
	return s, nil
}
