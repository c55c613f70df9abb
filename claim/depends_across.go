package claim

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Prerequisites in other queues (NewItem.AfterIn; docs/dependencies.md,
// "Prerequisites in other queues"; internal/store/items_deps_across.go has
// the statements and the hints). An edge from an item of queue A to a
// waiting item of queue B is released by the ack of its prerequisite in A
// (releaseAcross, right after the ack, from the hint the ack's own
// statement finds), or settled by the sweep of B's reaper (sweepAcross),
// which classifies each prerequisite in its own queue: acked or taken
// releases, dead or cancelled releases the dependents whose RunAfter has
// that end and ends the others, unknown or another queue's ends them.

// acrossGroup is the edges of one dependent queue.
type acrossGroup struct {
	queue string
	edges []store.Edge
}

// groupAcross groups edges by dependent queue, in queue order: the
// transactions that lock dependents of several queues lock them in
// (queue, id) order, so that no two wait for each other in a cycle.
func groupAcross(all []store.AcrossEdge) []acrossGroup {
	at := map[string]int{}
	var out []acrossGroup
	for _, e := range all {
		i, ok := at[e.DependentQueue]
		if !ok {
			i = len(out)
			at[e.DependentQueue] = i
			out = append(out, acrossGroup{queue: e.DependentQueue})
		}
		out[i].edges = append(out[i].edges, store.Edge{Prereq: e.Prereq, Dependent: e.Dependent})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].queue < out[j].queue })
	return out
}

// releaseAcross releases the dependents in other queues of the items acked
// (by an ack that committed), in transactions of at most releaseBatch
// edges (releaseTxOptions), waiting for dependents another transaction
// holds, as releaseAcked does for this queue's. A failure is left to the
// dependents' queues' sweeps (counted in Stats.ReleaseFailures).
func (q *Queue) releaseAcross(ctx context.Context, acked []uuid.UUID) {
	d := q.engine.Load().dialect
	for {
		var moved, edges int
		var more bool
		err := retry.TxWith(ctx, q.db, releaseTxOptions(d), q.stats.retried("unblock"), func(ctx context.Context, tx pgx.Tx) error {
			moved, edges, more = 0, 0, false
			all, err := q.store.ItemsDepsAcrossFrom(ctx, tx, d, q.opts.Queue, acked, releaseBatch)
			if err != nil || len(all) == 0 {
				return store.Classify(err)
			}
			more = len(all) >= releaseBatch
			for _, g := range groupAcross(all) {
				res, err := q.store.ItemsDepsAcrossRelease(ctx, tx, d, g.queue, q.opts.Queue, g.edges, false, 0)
				if err != nil {
					return store.Classify(err)
				}
				moved, edges = moved+len(res.Moved), edges+res.Edges
				if len(res.Left) > 0 {
					n, err := q.store.ItemsDepsDeleteAcrossGone(ctx, tx, q.opts.Queue, res.Left)
					if err != nil {
						return store.Classify(err)
					}
					edges += int(n)
				}
				if len(res.Moved) > 0 && q.notifies() {
					if err := q.store.Notify(ctx, tx, q.store.NotifyChannel(g.queue), ""); err != nil {
						return store.Classify(err)
					}
				}
			}
			return nil
		})
		if err != nil {
			q.stats.releaseFailed.Add(1)
			return
		}
		if moved > 0 {
			q.stats.unblocked.Add(int64(moved))
		}
		if !more || edges == 0 {
			return
		}
	}
}

// sweepAcross is the part of Reap's dependency step for this queue's
// items that wait for items of other queues: it walks up to sweepBatches
// batches of sweepBatch of their edges, from where the last sweep stopped,
// classifies the prerequisites in their own queues and settles the edges
// whose prerequisites ended (settleAcross). It returns the dependents it
// released and those it ended (whose own dependents in this queue the
// caller settles next). An edge whose settling fails is left for a later
// walk, and the walk goes on past it: its error is returned after.
func (q *Queue) sweepAcross(ctx context.Context) (released int, killed []uuid.UUID, failed error) {
	d := q.engine.Load().dialect
	for range sweepBatches {
		var all []store.AcrossEdge
		err := retry.Do(ctx, q.stats.retried("reap"), func(ctx context.Context) error {
			var err error
			all, err = q.store.ItemsDepsAcrossInto(ctx, q.db, d, q.opts.Queue, q.deps.acrossCursor, sweepBatch)
			return store.Classify(err)
		})
		if err != nil {
			return released, killed, errors.Join(failed, err)
		}
		byQueue := map[string][]store.AcrossEdge{}
		var queues []string
		for _, e := range all {
			if byQueue[e.PrereqQueue] == nil {
				queues = append(queues, e.PrereqQueue)
			}
			byQueue[e.PrereqQueue] = append(byQueue[e.PrereqQueue], e)
		}
		sort.Strings(queues)
		for _, pq := range queues {
			r, k, err := q.settleAcross(ctx, pq, byQueue[pq])
			released, killed = released+r, append(killed, k...)
			if err != nil && ctx.Err() == nil && len(byQueue[pq]) > 1 {
				// One edge the database refuses (or any failure) must not
				// hold up the others: each alone, the failures kept for
				// the next walk, which comes back to them.
				err = nil
				for _, e := range byQueue[pq] {
					r, k, err1 := q.settleAcross(ctx, pq, []store.AcrossEdge{e})
					released, killed = released+r, append(killed, k...)
					failed = errors.Join(failed, err1)
				}
			}
			failed = errors.Join(failed, err)
			if ctx.Err() != nil {
				return released, killed, failed
			}
		}
		if len(all) < sweepBatch {
			q.deps.acrossCursor = uuid.Nil
			break
		}
		q.deps.acrossCursor = all[len(all)-1].Dependent
	}
	if failed != nil {
		failed = fmt.Errorf("settling the edges from other queues (the others were settled; these are tried again at a later reap): %w", failed)
	}
	return released, killed, failed
}

// settleAcross settles, in one transaction (releaseTxOptions), the edges
// from items of the queue pq to this queue's waiting items: it classifies
// the prerequisites in pq and releases or ends their dependents as settle
// does for this queue's prerequisites, skipping the dependents another
// transaction holds (left to it, or to the next sweep), and deletes the
// edges whose dependents are gone.
func (q *Queue) settleAcross(ctx context.Context, pq string, edges []store.AcrossEdge) (int, []uuid.UUID, error) {
	d := q.engine.Load().dialect
	var prereqs []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, e := range edges {
		if !seen[e.Prereq] {
			seen[e.Prereq] = true
			prereqs = append(prereqs, e.Prereq)
		}
	}
	var moved int
	var ended []uuid.UUID
	err := retry.TxWith(ctx, q.db, releaseTxOptions(d), q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
		moved, ended = 0, nil
		states, err := q.store.ItemsDepsClassify(ctx, tx, d, pq, prereqs)
		if err != nil {
			return store.Classify(err)
		}
		state := make(map[uuid.UUID]string, len(states))
		for _, st := range states {
			state[st.ID] = st.State
		}
		// The edges by how their prerequisite is: acked (released), dead,
		// cancelled (released for RunAfter, else ended), gone otherwise
		// (ended); pending ones are left.
		var acked, dead, cancelled, other []store.Edge
		var ids []uuid.UUID
		var outcomes []string
		for _, e := range edges {
			se := store.Edge{Prereq: e.Prereq, Dependent: e.Dependent}
			switch st := state[e.Prereq]; st {
			case store.PrereqQueued, store.PrereqWaiting:
				continue
			case store.OutcomeAcked, store.OutcomeTaken:
				acked = append(acked, se)
				continue
			case store.OutcomeDead:
				dead = append(dead, se)
			case store.OutcomeCancelled:
				cancelled = append(cancelled, se)
			default:
				other = append(other, se)
			}
			ids, outcomes = append(ids, e.Prereq), append(outcomes, state[e.Prereq])
		}
		var left []store.Edge
		res, err := q.store.ItemsDepsAcrossRelease(ctx, tx, d, q.opts.Queue, pq, acked, true, 0)
		if err != nil {
			return store.Classify(err)
		}
		moved, left = len(res.Moved), append(left, res.Left...)
		for _, g := range []struct {
			bit   int64
			edges []store.Edge
		}{{store.RunAfterDead, dead}, {store.RunAfterCancelled, cancelled}, {0, other}} {
			if len(g.edges) == 0 {
				continue
			}
			if g.bit != 0 {
				res, err := q.store.ItemsDepsAcrossRelease(ctx, tx, d, q.opts.Queue, pq, g.edges, true, g.bit)
				if err != nil {
					return store.Classify(err)
				}
				moved += len(res.Moved)
			}
			kr, err := q.store.ItemsDepsAcrossKill(ctx, tx, d, q.opts.Queue, g.edges, ids, outcomes, g.bit)
			if err != nil {
				return store.Classify(err)
			}
			ended, left = append(ended, kr.Killed...), append(left, kr.Left...)
		}
		if len(left) > 0 {
			if _, err := q.store.ItemsDepsDeleteAcrossGone(ctx, tx, pq, left); err != nil {
				return store.Classify(err)
			}
		}
		if moved > 0 && q.notifies() {
			return store.Classify(q.store.Notify(ctx, tx, q.channel, ""))
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return moved, ended, nil
}
