package claim

import (
	"slices"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/wake"
)

// Wake-ups. On PostgreSQL every enqueue path (Enqueue, EnqueueTx, Buffer's
// flushes, Requeue, and through EnqueueTx the schedule
// runner) sends one notification on the queue's channel in its own
// transaction, unless Options.NoNotify: PostgreSQL delivers it at commit
// and never for a transaction that rolls back, and merges the identical
// notifications of one transaction into one. Workers of every process
// listen for it (package worker) and claim at once instead of at their
// next poll. After its commit, an enqueue also signals this process's own
// workers of the queue directly (Wake), on both engines: CockroachDB has no
// LISTEN, so there enqueues made in the worker's own process wake it at
// once, and the others are found by the worker process's idle probe
// (worker.WakeProbe, one read per queue every 30 ms while workers idle)
// or by the poll.

// notifies reports whether enqueues send the PostgreSQL notification
// (ready has run).
func (q *Queue) notifies() bool {
	e := q.engine.Load()
	return e != nil && e.dialect == store.Postgres && !q.opts.NoNotify
}

// Wake wakes this process's idle workers of the queue (those of any Queue
// with the same name and tables): they claim at once rather than at their
// next poll. Enqueue, Buffer and Requeue call it after they commit. Call it
// after committing a transaction in which EnqueueTx added items that are
// due at once: EnqueueTx cannot know when, or whether, the caller commits.
// (On PostgreSQL the notification EnqueueTx sends in the transaction wakes
// the workers of every process at commit anyway; on CockroachDB, which has
// no notifications, Wake wakes this process's workers at once, before the
// idle probe's next round, worker.WakeProbe, finds the items.) A Wake with
// nothing to claim costs one claim statement per idle worker.
func (q *Queue) Wake() { wake.Signal(q.channel) }

// payload is the wake-up hint of b's items that are due at once: their key
// hashes, which give their parts (see package internal/wake), or "" (any
// part) for more than wake.MaxHints of them.
func (b *batch) payload() string {
	var hs []int64
	for i := range b.items {
		if b.items[i].Delay > 0 || slices.Contains(hs, b.hashes[i]) {
			continue
		}
		if hs = append(hs, b.hashes[i]); len(hs) > wake.MaxHints {
			return "" // items of many parts
		}
	}
	return wake.Payload(hs)
}

// dueNow reports whether b wakes idle workers: whenever it has items.
// An item due later wakes them too (since version 0.6): a worker that
// waits on its listener claims only every worker.Options.ListenPoll, and
// the claim its wake-up causes finds nothing, after which the worker looks
// up when the first unclaimed item vests and claims then. (The payload's
// hints name only the items due at once: "" for a batch of delayed items,
// any part.)
func (b *batch) dueNow() bool { return len(b.items) > 0 }
