package claim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Nack reports that handling it failed with cause. A cause that is (or
// wraps) a *SnoozeError snoozes the item instead (see Queue.Snooze: its
// attempt is not counted; it returns Snoozed, or Dead when the item was
// snoozed too often). Otherwise the item is released with
// its attempt counted and becomes claimable again after an exponential
// backoff with jitter (or the delay of a RetryAfter error); when it has used
// its attempts, or cause is Permanent, it is moved to the dead-items table
// with cause as its last error (so is an item whose cause is an
// UnknownKindError or an ArgsError, with reason ReasonUnknownKind or
// ReasonBadArgs and its kind). The claim is checked as in Ack. If the
// database refuses that move for something about the item, the item is held
// out of claims for the reaper instead, and the error wraps
// ErrDeadLetterFailed: the nack is settled, do not retry it.
//
// The error text is stored safely whatever bytes it holds: invalid UTF-8 is
// replaced, NUL bytes become the text \x00, and it is cut to
// MaxErrorText bytes.
//
// An at-most-once item (Item.AtMostOnce) has nothing to nack: the claim
// that handed it out deleted it. Nack returns Dropped and an error wrapping
// ErrClaimLost that says so, at once, without a statement.
func (q *Queue) Nack(ctx context.Context, it Item, cause error) (_ Outcome, nackErr error) {
	if end := q.startStep(ctx, StepNack, []Item{it}); end != nil {
		defer func() { end(nil, nackErr) }()
	}
	if it.AtMostOnce {
		return Dropped, takenErr("nacking", it)
	}
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	msg = safeText(msg)
	if s, ok := snoozeOf(cause); ok {
		return q.snooze(ctx, it, s.Delay, s.Unlimited)
	}
	if err := q.ready(ctx); err != nil {
		return Retried, q.claimErr("nacking", it, err)
	}
	kindDeath := kindReason(cause)
	if it.Attempt >= it.MaxAttempts || IsPermanent(cause) || kindDeath != "" {
		err := retry.Do(ctx, q.stats.retried("nack"), func(ctx context.Context) error {
			reason := ReasonFailed
			switch {
			case kindDeath != "":
				reason = safeText(kindDeath)
			case IsPermanent(cause):
				reason = ReasonPermanent
			}
			held, err := q.store.ItemsDeadLetter(ctx, q.db, it.claimKey(), msg, reason)
			if err == nil && !held {
				return ErrClaimLost
			}
			return store.Classify(err)
		})
		if itemFault(err) {
			return Dead, q.holdForReaper(ctx, it, msg, err)
		}
		if err != nil {
			return Dead, q.claimErr("dead-lettering", it, err)
		}
		q.stats.dead.Add(1)
		return Dead, nil
	}
	delay := q.backoff(it.Attempt)
	if d, ok := retryAfter(cause); ok {
		delay = d
	}
	err := q.update(ctx, "nack", func(ctx context.Context) (bool, error) {
		return q.store.ItemsNack(ctx, q.db, it.claimKey(), delay, msg)
	})
	if err != nil {
		return Retried, q.claimErr("nacking", it, err)
	}
	q.stats.nacked.Add(1)
	return Retried, nil
}

// holdForReaper is Nack's way out when the database refused the item's move
// to the dead items for something about the item (moveErr; see itemFault):
// retrying the move would fail the same way for ever. It releases the claim
// with the item's attempts used up and msg as its last error, so that no
// claim hands the item out again and the reaper moves it once it can, and
// returns an error wrapping ErrDeadLetterFailed and moveErr (or, if the
// release failed too, that failure).
func (q *Queue) holdForReaper(ctx context.Context, it Item, msg string, moveErr error) error {
	exhaust := func(ctx context.Context) (bool, error) { return q.store.ItemsExhaust(ctx, q.db, it.claimKey(), msg) }
	if err := q.update(ctx, "nack", exhaust); err != nil {
		return q.claimErr("dead-lettering", it, fmt.Errorf("the move to the dead items was refused (%w), and holding the item for the reaper failed: %w", moveErr, err))
	}
	return q.claimErr("dead-lettering", it, fmt.Errorf("%w: %w", ErrDeadLetterFailed, moveErr))
}

// Release gives the item back without counting the attempt, for example when
// a worker shuts down before handling it. The claim is checked as in Ack.
// The attempt is given back, but the claim token is not: the next claim gets
// a new one, so this Item can never act on that claim. An at-most-once
// item cannot be given back (its claim deleted it): the error wraps
// ErrClaimLost and says so.
func (q *Queue) Release(ctx context.Context, it Item) (err error) {
	if end := q.startStep(ctx, StepRelease, []Item{it}); end != nil {
		defer func() { end(nil, err) }()
	}
	if it.AtMostOnce {
		return takenErr("releasing", it)
	}
	if err := q.ready(ctx); err != nil {
		return q.claimErr("releasing", it, err)
	}
	release := func(ctx context.Context) (bool, error) { return q.store.ItemsRelease(ctx, q.db, it.claimKey()) }
	if err := q.update(ctx, "release", release); err != nil {
		return q.claimErr("releasing", it, err)
	}
	q.stats.released.Add(1)
	return nil
}

// update runs a claim-checked single-row statement, which reports whether
// the claim held.
func (q *Queue) update(ctx context.Context, kind string, stmt func(ctx context.Context) (bool, error)) error {
	return retry.Do(ctx, q.stats.retried(kind), func(ctx context.Context) error {
		held, err := stmt(ctx)
		if err != nil {
			return store.Classify(err)
		}
		if !held {
			return ErrClaimLost
		}
		return nil
	})
}

// takenErr is the error of a nack, snooze or release of the at-most-once
// item it: the claim that handed it out deleted it (recorded as taken), so
// nothing is left to settle, and nothing is written.
func takenErr(what string, it Item) error {
	return fmt.Errorf("claim: %s item %s: %w: it is an at-most-once item, which the claim that handed it out deleted (it is never retried, snoozed or dead-lettered)",
		what, it.ID, ErrClaimLost)
}

func (q *Queue) claimErr(what string, it Item, err error) error {
	if errors.Is(err, ErrClaimLost) {
		q.stats.lost.Add(1)
	}
	return fmt.Errorf("claim: %s item %s: %w", what, it.ID, err)
}

// backoff returns the delay before attempt+1 of a failed item:
// BackoffBase·2^(attempt-1) capped at BackoffMax, with "equal jitter" (a
// random value between half and all of it).
func (q *Queue) backoff(attempt int) time.Duration {
	d := q.opts.BackoffMax
	if attempt < 1 {
		attempt = 1
	}
	if shift := attempt - 1; shift < 62 && q.opts.BackoffBase <= q.opts.BackoffMax>>shift {
		d = q.opts.BackoffBase << shift
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// MaxErrorText bounds the bytes of an error text stored with an item.
const MaxErrorText = 8 << 10

// safeText returns s as it is stored in an item's or dead item's last error:
// valid UTF-8 (invalid bytes become U+FFFD), without NUL bytes (each becomes
// the four characters \x00: PostgreSQL's text type refuses NUL), and at
// most MaxErrorText bytes (cut at a character boundary, with a note).
func safeText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", `\x00`)
	if len(s) <= MaxErrorText {
		return s
	}
	const note = "… (cut)"
	cut := MaxErrorText - len(note)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + note
}
