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
	// Checkpoints and ProgressReports count the checkpoints and progress
	// reports saved (SaveCheckpoint, ReportProgress; refused saves not
	// counted).
	Checkpoints, ProgressReports int64
	// DeadPruned counts dead items this Queue's reaps deleted under the
	// queue's retention (SettingsUpdate.Retention).
	DeadPruned int64
	// Cancelled counts items this Queue ended as cancelled: unclaimed items
	// CancelItem deleted, and running ones it ended after their cancel
	// (EndCancelled, Reap); CancelledRunning counts the latter.
	Cancelled, CancelledRunning int64
	// Snoozed counts snoozes (see Snooze): items handed back with a delay,
	// their attempt not counted. An item snoozed too often is moved to the
	// dead items and counted in Dead instead.
	Snoozed int64
	// Retries counts serialization-failure retries by statement kind:
	// "enqueue", "claim", "ack", "nack", "release", "cancel", "requeue",
	// "extend", "reap", "pause", "checkpoint", "progress", "retention",
	// "snooze", "unblock" (the release of an ack's dependents).
	Retries map[string]int64
}

type counters struct {
	enqueued, claimed, acked, nacked, released, dead, lost, reaped atomic.Int64
	checkpoints, progress, deadPruned                              atomic.Int64
	cancelled, cancelledRunning, snoozed                           atomic.Int64
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
		Checkpoints: c.checkpoints.Load(), ProgressReports: c.progress.Load(), DeadPruned: c.deadPruned.Load(),
		Cancelled: c.cancelled.Load(), CancelledRunning: c.cancelledRunning.Load(), Snoozed: c.snoozed.Load(),
	}
	c.retries.Range(func(k, v any) bool {
		s.Retries[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return s
}
