package claim

import (
	"errors"
	"time"
)

type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: Nack moves the item to the dead-items
// table at once instead of retrying it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e retryAfterError) Error() string { return e.err.Error() }
func (e retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err so that Nack makes the item claimable again after
// delay instead of the exponential backoff (for example, a rate limit's
// Retry-After). The attempt still counts.
func RetryAfter(delay time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return retryAfterError{err, max(delay, 0)}
}

// RetryDelay reports the delay err was marked with by RetryAfter (anywhere
// in its chain), the delay Nack gives the item instead of the backoff, and
// whether it was marked at all. A handler's test asserts with it what
// its handler asked for:
//
//	if d, ok := claim.RetryDelay(res.Err); !ok || d != time.Minute {
//		t.Fatalf("retry delay %v, %v; want 1m", d, ok)
//	}
func RetryDelay(err error) (time.Duration, bool) { return retryAfter(err) }

func retryAfter(err error) (time.Duration, bool) {
	var r retryAfterError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}
