package claim

import (
	"fmt"
	"math"
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
