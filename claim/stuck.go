package claim

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
)

// ErrDeadLetterFailed is wrapped by Nack's error when the item's move to the
// dead items was refused by the database for something about that item (a
// constraint or a trigger on the dead-items table, a row over a size limit),
// not for a transient failure. The nack is settled nonetheless: the claim
// was released with the item's attempts used up and the cause as its last
// error, so that no claim hands it out again, and the reaper moves it to the
// dead items (reason "crash loop") once the move
// is possible, reporting it (a ReapError with its id) while it is not. Do
// not retry such a nack: its claim is gone.
var ErrDeadLetterFailed = errors.New("the move to the dead items was refused; the item is held, out of claims, for the reaper")

// Reap's steps, as named in ReapError.Step.
const (
	StepLeases    = "leases"    // releasing expired leases
	StepExhausted = "exhausted" // moving crash-looped items (attempts used up)
	StepExpired   = "expired"   // moving items past their deadline
	// StepPruneEnded: forgetting ended ids past the dedup window
	// (the prune-ended step).
	StepPruneEnded = "prune ended"
	// StepPruneDead: deleting dead items beyond the queue's retention
	// (the prune-dead step).
	StepPruneDead = "prune dead"
	// StepCancelled: ending cancelled items whose handlers are gone (their
	// claims released, or their leases run out).
	StepCancelled = "cancelled"

	// StepDependencies: releasing or ending waiting items whose
	// prerequisites ended (NewItem.After).
	StepDependencies = "dependencies"
)

// ReapError is one failure of Reap. Reap runs every step whatever another
// did, and returns its failures joined (errors.Join); ReapErrors lists them.
//
// ID is uuid.Nil when the step itself failed (the database, a connection, a
// context ended): the step's remaining batches are left for the next Reap.
// Otherwise ID is an item (or a waiting item, or, in StepDependencies, a
// prerequisite whose dependents could not be settled) that the step could
// not release or move even alone, for something about that item; every
// other item of the step was released or moved without it. If Ended, the
// item was ended instead: moved to the dead items with reason
// ReasonRefused, Err in its last error. Otherwise it stays as it is (in the
// items table; an unclaimed one is never handed out), and the next Reap
// tries it again.
type ReapError struct {
	Queue string
	Step  string    // StepLeases, StepExhausted, StepExpired, StepPruneEnded, StepPruneDead, StepCancelled or StepDependencies
	ID    uuid.UUID // the item, or uuid.Nil for a failure of the whole step
	Err   error
	// Ended reports that the refused item was moved to the dead items
	// (reason ReasonRefused).
	Ended bool
}

func (e *ReapError) Error() string {
	switch {
	case e.ID == uuid.Nil:
		return fmt.Sprintf("claim: reaping %q, step %s: %v", e.Queue, e.Step, e.Err)
	case e.Ended:
		return fmt.Sprintf("claim: reaping %q, step %s: the database refused item %s, which was moved to the dead items (reason %q): %v",
			e.Queue, e.Step, e.ID, ReasonRefused, e.Err)
	}
	return fmt.Sprintf("claim: reaping %q, step %s: item %s cannot be released or moved: %v", e.Queue, e.Step, e.ID, e.Err)
}

func (e *ReapError) Unwrap() error { return e.Err }

// ReapErrors returns the ReapErrors in err, Reap's error, in order: each
// step's failure or each item that could not be released or moved, once
// each. It returns
// nil for a nil err.
func ReapErrors(err error) []*ReapError {
	var out []*ReapError
	var walk func(error)
	walk = func(err error) {
		var re *ReapError
		switch e := err.(type) {
		case nil:
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		default:
			if errors.As(err, &re) {
				out = append(out, re)
			}
		}
	}
	walk(err)
	return out
}

// itemFault reports whether err is the database refusing a statement for
// something about the rows it wrote, which the same statement without those
// rows would not meet: a data exception (SQLSTATE class 22), an integrity
// constraint (23), a program limit such as a row size (54), or an exception
// raised by a trigger (P0). Serialization failures, connection and server
// failures, and errors of the statement as a whole (a missing column, class
// 42) are not: the same rows would pass another time, or none would.
func itemFault(err error) bool { return store.IsRefusal(err) }
