// Package claim is the item side of crdbwork: enqueue items, claim them for a
// session, and acknowledge each exactly once.
//
// A Queue is what producers and administrators use: Enqueue and EnqueueTx,
// Ack, AckMany, Nack and Release, and the queue's settings, limits, pause
// and dead items. The consumer protocol is bound to a session: a Claimer
// (Queue.Claimer) claims items for its session, extends their leases, and
// releases what a claim with an unknown outcome took. Package worker runs
// that protocol; few programs need it directly.
//
// A claim is the claiming session's id written into the item. It is a
// foreign key to the session row with ON DELETE SET NULL (and, in parts mode,
// to the session's part row as well), so when a session dies or gives up a
// part, the database itself releases its claims.
//
// Every claim increments the item's claim token, which never goes down, and
// takes a lease (Options.Lease) by the database clock. Ack deletes the item,
// only if it is still claimed by the same session with the same token, in
// one serializable transaction together with the caller's function that
// records the result; AckMany acks many items with one statement and can
// record their results in bulk. At most one ack of an item can ever commit,
// and an ack is reported only once its COMMIT succeeded: a lost claim returns
// ErrClaimLost and commits nothing, and an outcome the database left unknown
// (a lost COMMIT answer, CockroachDB's 40003) returns ErrOutcomeUnknown.
//
// Every claimed item ends: a claim whose lease runs out (a hung handler, a
// claim whose answer was lost) is released by any session's Reap,
// Claimer.Extend keeps a long handler's lease, and an item whose attempts are used up
// without an ack or a nack (a crash loop) is never claimed again and ends in
// the dead-items table. Pause stops the claims of a queue.
//
// Items have a priority (lower runs first), a vesting time (delayed items
// and backoff), a number of attempts, and a part fixed at enqueue from the
// item's key. A failed item is requeued with exponential backoff and jitter,
// or moved to the dead-items table when it runs out of attempts or its
// error is marked Permanent.
//
// The dead-items table keeps every death: ids are the caller's, so an id may
// be enqueued again after its item died, and die again; each death is its
// own row (DeadItem.Death), listed by DeadItems, and Requeue puts
// back the newest (RequeueOptions.Death a given one) while the others stay as
// history. A move the database refuses for something about one item never
// holds up the rest: Reap runs all its steps and moves every other item,
// reporting the one it could not move (ReapError, with its id), and a Nack
// whose move is refused still ends the claim (ErrDeadLetterFailed).
//
// A Buffer lets many goroutines that enqueue one item each share statements
// (group commit for producers), each still told only what committed.
//
// # Enqueues are idempotent on ids, beyond the item's life
//
// An enqueue (Enqueue, a Buffer, package schedule) whose outcome is unknown
// returns ErrOutcomeUnknown with the items' ids. Enqueue the same items again
// with NewItem.ID set to those ids: nothing is added twice, whatever happened
// meanwhile. An item still queued or running is found in the items table; one
// that already ended — acked, moved to the dead items, cancelled, or taken by
// the claim of an at-most-once item — is found among the queue's ended ids,
// which every statement that ends an item records in the same statement, and
// is not run again (Enqueued.Done reports it). Ended ids are kept for the
// queue's dedup window (Policy.DedupWindow, DefaultDedupWindow — a day —
// unless set otherwise; Policy.DedupOff keeps none) and then pruned, in
// bounded batches, by every worker session's Reap (the prune-ended step): a retry must
// come within the window. Ids are per queue: the same id may be an item of
// one queue and, after it ended, be enqueued into another.
//
// NewItem.UniqueKey (with NewItem.UniquePeriod) uses the same mechanism for
// unique jobs: the item's id is derived from the queue, the key and the
// period (UniqueID), so a second enqueue of the key in the same period is
// a duplicate while the first is queued and for the dedup window after it
// ended.
package claim
