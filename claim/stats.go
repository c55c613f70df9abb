package claim

import (
	"sync"
	"sync/atomic"
)

// Stats counts what a Queue did since it was created. Every count is of
// committed work only: Acked counts acks whose COMMIT succeeded.
type Stats struct {
	// Enqueued, Claimed, Acked and Released count items; Nacked counts
	// items nacked for a retry and Dead those moved to the dead-items table.
	Enqueued, Claimed, Acked, Nacked, Released, Dead int64
	// Reaped counts items whose expired leases Reap released (the items it
	// moved to the dead items count in Dead).
	Reaped int64
	// Unblocked counts waiting items (NewItem.After) moved into the items
	// table because their last prerequisite was acked, by this Queue's
	// acks or its Reap. Dependents that died with a prerequisite count in
	// Dead.
	Unblocked int64
	// ReleaseFailures counts releases of an ack's dependents that failed
	// after the ack committed (the database, a connection): the next Reap
	// releases those dependents instead.
	ReleaseFailures int64
	// LostClaims counts acks, nacks and releases refused because the claim
	// was gone.
	LostClaims int64
	// Retries counts serialization-failure retries by statement kind:
	// "enqueue", "claim", "ack", "nack", "release", "cancel", "requeue",
	// "extend", "reap", "pause", "unblock" (the release of an ack's dependents).
	Retries map[string]int64
}

type counters struct {
	enqueued, claimed, acked, nacked, released, dead, lost, reaped atomic.Int64
	unblocked, releaseFailed                                       atomic.Int64
	retries                                                        sync.Map // kind → *atomic.Int64
}

// retried returns the callback that counts one retry of kind.
func (c *counters) retried(kind string) func() {
	return func() {
		v, _ := c.retries.LoadOrStore(kind, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
}

// Stats returns a snapshot of the queue's counters.
func (q *Queue) Stats() Stats {
	c := &q.stats
	s := Stats{
		Enqueued: c.enqueued.Load(), Claimed: c.claimed.Load(), Acked: c.acked.Load(),
		Nacked: c.nacked.Load(), Released: c.released.Load(), Dead: c.dead.Load(),
		LostClaims: c.lost.Load(), Reaped: c.reaped.Load(), Unblocked: c.unblocked.Load(), ReleaseFailures: c.releaseFailed.Load(), Retries: map[string]int64{},
	}
	c.retries.Range(func(k, v any) bool {
		s.Retries[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return s
}
