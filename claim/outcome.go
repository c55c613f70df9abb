package claim

import "fmt"

// Outcome says how an attempt at an item ended: what Nack did with it, and
// what a worker (worker.Observer), its attempts and package workertest
// report. The zero Outcome is none of them (no outcome yet).
type Outcome int

// Outcomes of an attempt. Nack returns Retried or Dead (or, for a
// snooze, Snoozed or Dead).
const (
	// Acked: the ack, with the handler's record, committed.
	Acked Outcome = iota + 1
	// Retried: the item was nacked: it is claimable again after a backoff
	// (or a RetryAfter delay), its attempt counted and its last error set.
	Retried
	// Dead: the item was moved to the dead-items table (its attempts were
	// used up, or its error was Permanent), or, if Nack's error wraps
	// ErrDeadLetterFailed, it is held out of claims for the reaper to move.
	Dead
	// Released: the item was given back without counting the attempt (a
	// worker stopping, or its session lost, before the handler finished).
	Released
	// Unsettled: the ack, nack or release did not happen: the claim was
	// lost (another session handles the item, or an earlier ack whose
	// outcome was unknown committed), or the settling gave up because the
	// session ended. The item's lease or its session's end releases it.
	Unsettled
	// Dropped: an at-most-once item (Item.AtMostOnce) whose handler failed
	// or whose record could not be written: its claim deleted it, so it is
	// not retried.
	Dropped
	// Snoozed: the handler snoozed the item (Snooze): it is claimable
	// again after the snooze's delay, its attempt not counted.
	Snoozed
	// Cancelled: the item was cancelled while its handler ran
	// (Queue.CancelItem): it ended as cancelled, its result not written.
	Cancelled
)

// String returns the outcome's name: "acked", "retried", "dead",
// "released", "unsettled", "dropped", "snoozed" or "cancelled" (the label
// values of package metrics).
func (o Outcome) String() string {
	switch o {
	case Acked:
		return "acked"
	case Retried:
		return "retried"
	case Dead:
		return "dead"
	case Released:
		return "released"
	case Unsettled:
		return "unsettled"
	case Dropped:
		return "dropped"
	case Snoozed:
		return "snoozed"
	case Cancelled:
		return "cancelled"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}
