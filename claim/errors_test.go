package claim_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
)

// RetryDelay finds the delay of RetryAfter anywhere in an error's chain, and
// reports errors that carry none.
func TestRetryDelay(t *testing.T) {
	t.Parallel()
	base := errors.New("rate limited")
	for _, tc := range []struct {
		name string
		err  error
		d    time.Duration
		ok   bool
	}{
		{"marked", claim.RetryAfter(time.Minute, base), time.Minute, true},
		{"wrapped", fmt.Errorf("sending: %w", claim.RetryAfter(2*time.Second, base)), 2 * time.Second, true},
		{"permanent and marked", claim.Permanent(claim.RetryAfter(time.Hour, base)), time.Hour, true},
		{"negative delay", claim.RetryAfter(-time.Second, base), 0, true},
		{"zero delay", claim.RetryAfter(0, base), 0, true},
		{"plain", base, 0, false},
		{"nil", nil, 0, false},
		{"nil marked", claim.RetryAfter(time.Minute, nil), 0, false},
	} {
		d, ok := claim.RetryDelay(tc.err)
		if d != tc.d || ok != tc.ok {
			t.Errorf("%s: RetryDelay = %v, %v; want %v, %v", tc.name, d, ok, tc.d, tc.ok)
		}
	}
}
