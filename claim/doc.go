// Package claim is the item side of crdbwork: enqueue items, claim them for a
// session, and acknowledge each exactly once.
//
// A claim is the claiming session's id written into the item. It is a
// foreign key to the session row with ON DELETE SET NULL (and, in parts mode,
// to the session's part row as well), so when a session dies or gives up a
// part, the database itself releases its claims.
//
// Ack deletes the item, only if the claim is still this session's (and the
// same claim instance and part), in one serializable transaction together
// with the caller's function that records the result. At most one ack of an
// item can ever commit, and an ack is reported only once its COMMIT
// succeeded: a lost claim returns ErrClaimLost and commits nothing.
//
// Items have a priority (lower runs first), a vesting time (delayed items
// and backoff), a number of attempts, and a part fixed at enqueue from the
// item's key. A failed item is requeued with exponential backoff and jitter,
// or moved to the dead-items table when it runs out of attempts or its
// error is marked Permanent.
package claim
