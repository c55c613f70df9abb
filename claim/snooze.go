package claim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// DefaultMaxSnoozes is the most snoozes of one item unless
// Options.MaxSnoozes says otherwise.
const DefaultMaxSnoozes = 100

// UnlimitedSnoozes, as Options.MaxSnoozes, lets the items of a queue be
// snoozed any number of times: no snooze ever moves an item to the dead
// items (SnoozeUnlimited does the same for one snooze). The snoozes are
// still counted (the snoozes column, Stats.Snoozed).
const UnlimitedSnoozes = -1

// noSnoozeLimit is the limit the snooze statement is given for an unlimited
// snooze: the snoozes column (BIGINT) never reaches it.
const noSnoozeLimit = math.MaxInt64

// maxSnoozeDelay bounds a snooze's delay (a year, as a lease).
const maxSnoozeDelay = maxLease

// ReasonSnoozedTooOften is the reason of an item moved to the dead items
// because a handler snoozed it once more after it had been snoozed
// Options.MaxSnoozes times.
const ReasonSnoozedTooOften = "snoozed too often"

// SnoozeError is the error a handler returns to hand its item back for
// Delay without spending an attempt (see Snooze, which makes one). Nack
// recognises it, also wrapped.
type SnoozeError struct {
	// Delay is how long the item waits before it is claimable again.
	Delay time.Duration
	// Unlimited makes this snooze ignore Options.MaxSnoozes: it never
	// moves the item to the dead items (see SnoozeUnlimited).
	Unlimited bool
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %v", e.Delay) }

// Snooze returns the error that hands an item back for d without counting
// its attempt: a handler ends with
//
//	return nil, claim.Snooze(time.Minute) // not ready yet: look again in a minute
//
// (worker.Snooze is the same). The item is released and claimable again
// after d (0: at once), its attempts as they were before this claim, its
// last error unchanged, and its snoozes counted. Snoozes are bounded: the
// snooze after Options.MaxSnoozes moves the item to the dead items with
// reason ReasonSnoozedTooOften. A snooze is fenced on the claim as a nack:
// a lost claim (or a cancel) refuses it. d is cut to [0, 1 year].
func Snooze(d time.Duration) error { return &SnoozeError{Delay: min(max(d, 0), maxSnoozeDelay)} }

// SnoozeUnlimited is Snooze without the bound: this snooze never moves the
// item to the dead items, however often it was snoozed before (what a
// handler polling an outside condition for as long as it takes wants; a
// River or pg-boss user's snooze). Its snoozes are still counted. Set
// Options.MaxSnoozes to UnlimitedSnoozes for every snooze of a queue.
func SnoozeUnlimited(d time.Duration) error {
	return &SnoozeError{Delay: min(max(d, 0), maxSnoozeDelay), Unlimited: true}
}

// snoozeOf returns the snooze cause carries, if any.
func snoozeOf(cause error) (s *SnoozeError, ok bool) {
	if errors.As(cause, &s) && s != nil {
		return &SnoozeError{Delay: min(max(s.Delay, 0), maxSnoozeDelay), Unlimited: s.Unlimited}, true
	}
	return nil, false
}

// Snooze hands it back for d without counting its attempt (see the
// function Snooze): it is claimable again after d, and its snoozes are
// counted. It returns Snoozed, or Dead when the item had been snoozed
// Options.MaxSnoozes times already: it is then moved to the dead items
// with reason ReasonSnoozedTooOften. The claim is checked as in Ack (an
// error wrapping ErrClaimLost: nothing was done). Nack does the same for a
// cause that is a *SnoozeError. An at-most-once item cannot be snoozed (its
// claim deleted it): Snooze returns Dropped and an error wrapping
// ErrClaimLost that says so. With Options.MaxSnoozes set to
// UnlimitedSnoozes it never returns Dead; Nack with a cause made by the
// function SnoozeUnlimited snoozes one item without the bound.
func (q *Queue) Snooze(ctx context.Context, it Item, d time.Duration) (Outcome, error) {
	return q.snooze(ctx, it, d, false)
}

func (q *Queue) snooze(ctx context.Context, it Item, d time.Duration, unlimited bool) (Outcome, error) {
	if it.AtMostOnce {
		return Dropped, takenErr("snoozing", it)
	}
	d = min(max(d, 0), maxSnoozeDelay)
	if err := q.ready(ctx); err != nil {
		return Snoozed, q.claimErr("snoozing", it, err)
	}
	limit := q.opts.MaxSnoozes
	if unlimited || limit == UnlimitedSnoozes {
		limit = noSnoozeLimit
	}
	var snoozed bool
	err := retry.Do(ctx, q.stats.retried("snooze"), func(ctx context.Context) error {
		var err error
		snoozed, err = q.store.ItemsSnooze(ctx, q.db, it.claimKey(), d, limit)
		return store.Classify(err)
	})
	if err != nil {
		return Snoozed, q.claimErr("snoozing", it, err)
	}
	if snoozed {
		q.stats.snoozed.Add(1)
		return Snoozed, nil
	}
	// Not snoozed: the claim was lost, or the item used its snoozes. The
	// move to the dead items is fenced on the claim too, so it tells them
	// apart: it moves only an item this claim still holds.
	times := fmt.Sprintf("%d times", limit)
	if limit == 1 {
		times = "once"
	}
	msg := fmt.Sprintf("snoozed %s, the most Options.MaxSnoozes allows, and snoozed again", times)
	err = retry.Do(ctx, q.stats.retried("snooze"), func(ctx context.Context) error {
		held, err := q.store.ItemsDeadLetter(ctx, q.db, it.claimKey(), msg, ReasonSnoozedTooOften)
		if err == nil && !held {
			return ErrClaimLost
		}
		return store.Classify(err)
	})
	if itemFault(err) {
		return Dead, q.holdForReaper(ctx, it, msg, err)
	}
	if err != nil {
		return Snoozed, q.claimErr("snoozing", it, err)
	}
	q.stats.dead.Add(1)
	return Dead, nil
}
