// Package schedule enqueues periodic items: one item per period of each
// schedule (an interval, or a cron expression), however many processes run
// the schedule, with no leader election.
//
// A Runner holds a list of schedules and, in Run, enqueues each schedule's
// item at the start of every period. Run one beside each worker (or in any
// process that can reach the database): every runner does the same work,
// and the database decides which one's enqueue counts.
//
// # Exactly one item per period
//
// Periods are computed from the database clock (now() of the enqueueing
// transaction), never from a process's clock: an interval's periods are the
// multiples of it since the Unix epoch; a cron expression's periods start at
// its activation times, in UTC unless the expression begins with
// CRON_TZ=Zone. A period's item has a deterministic id (ItemID: a version 5
// UUID of the queue, the schedule's name and the period's start), and is
// enqueued in one serializable transaction (retried whole, see the
// internal retry package) that also moves the schedule's row in
// crdbwork_schedules to that period:
//
//	SELECT last_period FROM crdbwork_schedules WHERE queue = $1 AND name = $2 FOR UPDATE
//	INSERT INTO crdbwork_schedules … ON CONFLICT (queue, name)
//	    DO UPDATE SET last_period = $3 … WHERE last_period < $3
//	INSERT INTO crdbwork_items … ON CONFLICT (id) DO NOTHING   -- claim.Queue.EnqueueTx
//
// Two runners that race for a period serialize on the schedule's row: the
// second finds the period recorded and enqueues nothing. The recorded
// period, not the item, is what makes a period's item unique: an item that
// was acked (and so deleted) long ago is never enqueued again, which the
// items table's primary key alone could not promise. The id makes a retried
// enqueue after an unknown outcome harmless as well.
//
// # Missed periods
//
// The item of the current period (the one that contains the database's
// now()) is enqueued as soon as a runner sees it, however late. Periods
// before it that got no item, because no runner ran, are missed; a
// schedule's Missed option says what happens to them when a runner comes
// back: CatchUp (the default) enqueues one item for the latest missed
// period, besides the current one; Skip enqueues only the current period's.
// Older missed periods are never enqueued. A schedule that has never run
// (no row) has missed nothing.
//
// # Schedules stored in the database
//
// Besides the schedules a program gives New, a Runner runs its queue's
// schedules stored in the database (schema version 6; unless
// Options.NoStored): Put adds or changes one, Delete removes it, Pause
// stops and resumes one (stored or in code), List shows them, from any
// process (the command crdbwork schedules does the same). Each turn of a
// stored schedule reads its row (spec, pause) under the lock above, so a
// change takes effect at its next period on every runner; Run re-reads the
// stored schedules every Options.Reload (10 s) to find new ones. See
// stored.go and docs/periodic.md.
//
// # Why a Runner beside the worker
//
// The runner needs no session, no part and no lease: the transaction above
// is safe from any number of processes, so binding schedules to the
// worker's session would add nothing but a dependency, and would keep
// producer-only processes from running them. worker.Options is left alone;
// start a Runner with the same pool next to worker.Run (see the examples).
package schedule
