package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Dependencies (NewItem.After; docs/dependencies.md). An item whose
// prerequisites are not all acked is kept out of the items table, in
// crdbwork_waiting, so that no claim of any version can hand it out. The
// ack of its last prerequisite moves it into the items table, in short
// bounded transactions right after the ack's (releaseAcked), which run for the acked
// items the ack's own statement found waited for (one seek of the edges per
// acked item: an ack of items nothing waits for runs nothing more, and no
// process skips a release it needs); anything else that ends
// a prerequisite (a death, a cancel, an ack by an older worker, a release
// that failed or never ran) is found by Reap's dependency step (sweepDeps),
// which releases or ends the dependents.

// MaxAfter bounds the prerequisites of one item (NewItem.After).
const MaxAfter = 10000

// Errors of an enqueue with prerequisites (NewItem.After). Nothing of the
// call is enqueued.
var (
	// ErrPrerequisiteUnknown: a prerequisite is not an item of the queue
	// (queued or waiting), did not end in it within its dedup window, is
	// not among its dead items, and is not an earlier item of the call:
	// never enqueued, or ended so long ago that the queue forgot it.
	ErrPrerequisiteUnknown = errors.New("prerequisite unknown: not queued, waiting, or ended within the queue's dedup window")
	// ErrPrerequisiteDied: a prerequisite already ended without an ack (dead
	// or cancelled): the item could never run.
	ErrPrerequisiteDied = errors.New("prerequisite ended without an ack (dead or cancelled)")
	// ErrPrerequisiteOtherQueue: a prerequisite is an item of another queue.
	// Prerequisites must be items of the dependent's own queue.
	ErrPrerequisiteOtherQueue = errors.New("prerequisite is an item of another queue")
	// ErrNoDedupWindow: the queue's dedup window is zero
	// (Policy.DedupWindow): it keeps no memory of ended ids, which is how
	// a prerequisite acked without releasing its dependents at once (by a
	// version-4 worker, or an ack whose release failed) is told apart from
	// one that died.
	ErrNoDedupWindow = errors.New("dependencies need the queue's dedup window (Settings.DedupWindow) above zero")
)

// PrereqEnds is a set of ways a prerequisite can end without an ack
// (NewItem.RunAfter): a dependent runs anyway after those, as if the
// prerequisite had been acked (Oban's ignore_discarded and
// ignore_cancelled), instead of ending dead.
type PrereqEnds uint8

// The ends of PrereqEnds.
const (
	// PrereqDied: the prerequisite moved to the dead items (attempts used
	// up, a permanent failure, a crash loop, its deadline, or its own
	// prerequisite's death).
	PrereqDied PrereqEnds = 1 << iota
	// PrereqCancelled: the prerequisite was cancelled.
	PrereqCancelled
)

// String returns the set's ends, such as "died|cancelled" ("" if none).
func (e PrereqEnds) String() string {
	var parts []string
	if e&PrereqDied != 0 {
		parts = append(parts, "died")
	}
	if e&PrereqCancelled != 0 {
		parts = append(parts, "cancelled")
	}
	if rest := e &^ (PrereqDied | PrereqCancelled); rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint8(rest)))
	}
	return strings.Join(parts, "|")
}

// bits returns the store's RunAfter bits of the set.
func (e PrereqEnds) bits() int64 {
	var b int64
	if e&PrereqDied != 0 {
		b |= store.RunAfterDead
	}
	if e&PrereqCancelled != 0 {
		b |= store.RunAfterCancelled
	}
	return b
}

// runsAfter reports whether a prerequisite that ended with outcome (a
// store outcome) lets the dependent run.
func (e PrereqEnds) runsAfter(outcome string) bool {
	switch outcome {
	case store.OutcomeDead:
		return e&PrereqDied != 0
	case store.OutcomeCancelled:
		return e&PrereqCancelled != 0
	}
	return false
}

// Prereq names an item of another queue that an item waits for
// (NewItem.AfterIn).
type Prereq struct {
	Queue string    // the prerequisite's queue
	ID    uuid.UUID // the prerequisite's id
}

// String returns "queue/id".
func (p Prereq) String() string { return p.Queue + "/" + p.ID.String() }

// hasPrereqs reports whether the item waits for anything (After or AfterIn).
func (it *NewItem) hasPrereqs() bool { return len(it.After) > 0 || len(it.AfterIn) > 0 }

// prereqsBytes is what a row of prerequisites in other queues weighs in a
// statement (rowBytes).
func prereqsBytes(ps []Prereq) int {
	n := 0
	for _, p := range ps {
		n += 16 + len(p.Queue)
	}
	return n
}

// ReasonDependencyDied starts the reason of an item that died because a
// prerequisite ended without an ack: "dependency died: <id>".
const ReasonDependencyDied = "dependency died: "

// sweepBatch and sweepBatches bound the dependency step of one Reap: it
// reads at most sweepBatches batches of sweepBatch edges, going on from
// where the previous Reap stopped.
const (
	sweepBatch   = 1000
	sweepBatches = 10
)

// checkAfter validates the items' prerequisites (once their ids are
// fixed): at most MaxAfter each, no zero id, none repeated, not the item's
// own, and an item of the call only if it comes earlier (so no cycle can
// form: every prerequisite exists before its dependent).
func (b *batch) checkAfter() error {
	var at map[uuid.UUID]int
	for i := range b.items {
		after := b.items[i].After
		if !b.items[i].hasPrereqs() {
			continue
		}
		b.deps = true
		if n := len(after) + len(b.items[i].AfterIn); n > MaxAfter {
			return fmt.Errorf("claim: item %d: %w: %d prerequisites, the limit is %d (MaxAfter)", i, errBadInput, n, MaxAfter)
		}
		in := make(map[Prereq]bool, len(b.items[i].AfterIn))
		for _, p := range b.items[i].AfterIn {
			switch {
			case p.Queue == "":
				return fmt.Errorf("claim: item %d: %w: a prerequisite of AfterIn has no queue", i, errBadInput)
			case p.Queue == b.queue:
				return fmt.Errorf("claim: item %d: %w: prerequisite %s of AfterIn is of the item's own queue: list it in After", i, errBadInput, p)
			case p.ID == uuid.Nil:
				return fmt.Errorf("claim: item %d: %w: prerequisite %s of AfterIn is the zero id", i, errBadInput, p)
			case p.ID == b.ids[i]:
				return fmt.Errorf("claim: item %d: %w: the item waits for itself (%s)", i, errBadInput, p)
			case in[p]:
				return fmt.Errorf("claim: item %d: %w: prerequisite %s is listed twice", i, errBadInput, p)
			case len(p.Queue) > MaxQueueNameLength:
				return fmt.Errorf("claim: item %d: %w: the queue name of prerequisite %s is %d bytes, the limit is %d", i, errBadInput, p.ID, len(p.Queue), MaxQueueNameLength)
			}
			in[p] = true
		}
		if at == nil {
			at = make(map[uuid.UUID]int, len(b.ids))
			for j, id := range b.ids {
				at[id] = j
			}
		}
		seen := make(map[uuid.UUID]bool, len(after))
		for _, p := range after {
			switch j, inCall := at[p]; {
			case p == uuid.Nil:
				return fmt.Errorf("claim: item %d: %w: a prerequisite is the zero id", i, errBadInput)
			case seen[p]:
				return fmt.Errorf("claim: item %d: %w: prerequisite %s is listed twice", i, errBadInput, p)
			case p == b.ids[i]:
				return fmt.Errorf("claim: item %d: %w: the item waits for itself (%s)", i, errBadInput, p)
			case inCall && j > i:
				return fmt.Errorf("claim: item %d: %w: prerequisite %s is item %d of the call, which comes after it (list prerequisites first)", i, errBadInput, p, j)
			}
			seen[p] = true
		}
	}
	return nil
}

// enqueueDeps is Enqueue for a batch with prerequisites: one transaction,
// retried whole.
func (q *Queue) enqueueDeps(ctx context.Context, b *batch) (Enqueued, error) {
	err := retry.Do(ctx, nil, func(ctx context.Context) error { return store.Classify(q.stamp(ctx, q.db, b)) })
	if err != nil {
		return Enqueued{}, fmt.Errorf("claim: enqueueing %d items into %q: reading the tenants' turns (nothing was enqueued): %w",
			len(b.items), q.opts.Queue, plain(err))
	}
	var res Enqueued
	err = retry.Tx(ctx, q.db, q.stats.retried("enqueue"), func(ctx context.Context, tx pgx.Tx) error {
		res = b.result()
		if err := q.writeDeps(ctx, tx, b, true, &res); err != nil {
			return err
		}
		if q.notifies() && b.dueNow() && res.Added() > 0 {
			return q.store.Notify(ctx, tx, q.channel, "")
		}
		return nil
	})
	res, err = q.finish(b, res, err)
	if err == nil && res.Added() > 0 && b.dueNow() {
		q.Wake()
	}
	return res, err
}

// subset returns the batch of b's items idx, with their ids, hashes and
// turns, and the positions (in idx) of given and generated ids.
func (b *batch) subset(idx []int) *batch {
	given := make(map[int]bool, len(b.given))
	for _, i := range b.given {
		given[i] = true
	}
	s := &batch{items: make([]NewItem, len(idx)), ids: make([]uuid.UUID, len(idx)), hashes: make([]int64, len(idx)),
		headers: make([][]byte, len(idx)), orders: b.orders, pos: make([]int, len(idx))}
	if b.turns != nil {
		s.turns = make([]*time.Time, len(idx))
	}
	for n, i := range idx {
		s.items[n], s.ids[n], s.hashes[n], s.headers[n] = b.items[i], b.ids[i], b.hashes[i], b.headers[i]
		s.pos[n] = b.pos0(i)
		s.items[n].After, s.items[n].AfterIn = nil, nil
		if b.turns != nil {
			s.turns[n] = b.turns[i]
		}
		if given[i] {
			s.given = append(s.given, n)
		} else {
			s.generated = append(s.generated, n)
		}
	}
	return s
}

// writeSubset writes b's items idx (all without prerequisites left to
// wait for) as plain items, and copies what happened into res.
func (q *Queue) writeSubset(ctx context.Context, db crsql.DB, b *batch, idx []int, useCopy bool, res *Enqueued) error {
	if len(idx) == 0 {
		return nil
	}
	s := b.subset(idx)
	sres := s.result()
	if err := q.write(ctx, db, s, useCopy, &sres); err != nil {
		return err
	}
	for n, i := range idx {
		res.New[i], res.Done[i] = sres.New[n], sres.Done[n]
	}
	return nil
}

// writeDeps writes a batch with prerequisites through db, a transaction:
//
//  1. caller-given ids that are waiting items already are duplicates, and so
//     are those of items with prerequisites that are items of the queue or
//     ended in it within its dedup window (done): a retried enqueue answers
//     what happened to its items, whatever their prerequisites became since;
//  2. the items without prerequisites are written as Enqueue writes them;
//  3. every prerequisite is classified (Store.ItemsDepsClassify): queued or
//     waiting (or an item of the call being added) counts as pending,
//     acked (or taken, for an at-most-once item: delivered) as satisfied;
//     dead, cancelled, another queue's or unknown fails the call;
//  4. items with no pending prerequisite are written as plain items, the
//     others as waiting items with their edges.
func (q *Queue) writeDeps(ctx context.Context, db crsql.DB, b *batch, useCopy bool, res *Enqueued) error {
	name := q.opts.Queue
	// 1. Ids already waiting.
	dup := map[int]bool{}
	if len(b.given) > 0 {
		ids := make([]uuid.UUID, len(b.given))
		for n, i := range b.given {
			ids[n] = b.ids[i]
		}
		states, err := q.store.ItemsDepsClassify(ctx, db, q.engine.Load().dialect, name, ids)
		if err != nil {
			return err
		}
		var ended []uuid.UUID
		at := make(map[uuid.UUID]int)
		for n, st := range states {
			i := b.given[n]
			switch st.State {
			case store.PrereqWaiting:
				dup[i] = true
			case store.PrereqOther:
				return fmt.Errorf("item %d: %w: id %s is an item of queue %q", i, ErrIDInOtherQueue, b.ids[i], st.Queue)
			case store.PrereqQueued:
				// In the items table: a duplicate (Enqueue's insert would
				// skip it), not to be refused for prerequisites that have
				// died since it was added.
				if b.items[i].hasPrereqs() {
					dup[i] = true
				}
			case store.PrereqUnknown:
			default:
				// Ended (acked, dead, cancelled, taken): done, if within
				// the dedup window (EnqueueFound applies it), unless the
				// item's UniqueStates let it run again after that end.
				if b.items[i].hasPrereqs() && b.items[i].UniqueStates.blocks(st.State) {
					ended = append(ended, b.ids[i])
					at[b.ids[i]] = i
				}
			}
		}
		if len(ended) > 0 {
			found, err := q.store.ItemsEnqueueFound(ctx, db, name, ended)
			if err != nil {
				return err
			}
			for _, f := range found {
				if i, ok := at[f.ID]; ok && f.Ended {
					dup[i], res.Done[i] = true, true
				}
			}
		}
	}
	if st, stored, err := q.store.QueueSettings(ctx, db, name); err != nil {
		return err
	} else if stored && st.DedupWindow <= 0 {
		return fmt.Errorf("%w: queue %q", ErrNoDedupWindow, name)
	}
	// 2. Items without prerequisites.
	var plainIdx, depIdx []int
	for i := range b.items {
		switch {
		case dup[i]:
		case !b.items[i].hasPrereqs():
			plainIdx = append(plainIdx, i)
		default:
			depIdx = append(depIdx, i)
		}
	}
	if err := q.writeSubset(ctx, db, b, plainIdx, useCopy, res); err != nil {
		return err
	}
	if len(depIdx) == 0 {
		return nil
	}
	// 3. The prerequisites.
	inCall := make(map[uuid.UUID]int, len(b.ids))
	for i, id := range b.ids {
		inCall[id] = i
	}
	var prereqs []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, i := range depIdx {
		for _, p := range b.items[i].After {
			if !seen[p] {
				seen[p] = true
				prereqs = append(prereqs, p)
			}
		}
	}
	state := make(map[uuid.UUID]string, len(prereqs))
	for start := 0; start < len(prereqs); start += insertRows {
		chunk := prereqs[start:min(start+insertRows, len(prereqs))]
		states, err := q.store.ItemsDepsClassify(ctx, db, q.engine.Load().dialect, name, chunk)
		if err != nil {
			return err
		}
		for _, st := range states {
			state[st.ID] = st.State
			if st.State == store.PrereqOther {
				return fmt.Errorf("%w: %s is an item of queue %q", ErrPrerequisiteOtherQueue, st.ID, st.Queue)
			}
		}
	}
	// 3b. The prerequisites in other queues (AfterIn), each classified
	// in its own queue, whose dedup window must be on: it is how the
	// sweep tells an acked prerequisite from a dead one there.
	crossState := map[Prereq]string{}
	byQueue := map[string][]uuid.UUID{}
	var queues []string
	for _, i := range depIdx {
		for _, p := range b.items[i].AfterIn {
			if _, ok := crossState[p]; ok {
				continue
			}
			crossState[p] = store.PrereqUnknown
			if byQueue[p.Queue] == nil {
				queues = append(queues, p.Queue)
			}
			byQueue[p.Queue] = append(byQueue[p.Queue], p.ID)
		}
	}
	for _, pq := range queues {
		if st, stored, err := q.store.QueueSettings(ctx, db, pq); err != nil {
			return err
		} else if stored && st.DedupWindow <= 0 {
			return fmt.Errorf("%w: queue %q, of prerequisites in AfterIn", ErrNoDedupWindow, pq)
		}
		ids := byQueue[pq]
		for start := 0; start < len(ids); start += insertRows {
			states, err := q.store.ItemsDepsClassify(ctx, db, q.engine.Load().dialect, pq, ids[start:min(start+insertRows, len(ids))])
			if err != nil {
				return err
			}
			for _, st := range states {
				if st.State == store.PrereqOther {
					return fmt.Errorf("%w: %s is an item of queue %q, not of %q", ErrPrerequisiteOtherQueue, st.ID, st.Queue, pq)
				}
				crossState[Prereq{Queue: pq, ID: st.ID}] = st.State
			}
		}
	}
	// 4. Each item's pending prerequisites.
	var now, later []int
	var remaining []int
	var edgeFrom, edgeTo []uuid.UUID
	var acrossQueue []string
	var acrossFrom, acrossTo []uuid.UUID
	for _, i := range depIdx {
		pending := 0
		for _, p := range b.items[i].AfterIn {
			switch st := crossState[p]; st {
			case store.PrereqQueued, store.PrereqWaiting:
				pending++
			case store.OutcomeAcked, store.OutcomeTaken:
			case store.OutcomeDead, store.OutcomeCancelled:
				if !b.items[i].RunAfter.runsAfter(st) {
					return fmt.Errorf("item %d: %w: %s ended as %s", i, ErrPrerequisiteDied, p, st)
				}
			default:
				return fmt.Errorf("item %d: %w: %s", i, ErrPrerequisiteUnknown, p)
			}
		}
		for _, p := range b.items[i].After {
			switch st := state[p]; st {
			case store.PrereqQueued, store.PrereqWaiting:
				pending++
			case store.OutcomeAcked, store.OutcomeTaken:
			case store.OutcomeDead, store.OutcomeCancelled:
				if b.items[i].RunAfter.runsAfter(st) {
					continue // satisfied, as by an ack
				}
				return fmt.Errorf("item %d: %w: %s ended as %s", i, ErrPrerequisiteDied, p, st)
			default:
				// Not found: an earlier item of the call, being added now
				// (a duplicate of the call would have been found), or
				// unknown.
				if j, ok := inCall[p]; !ok || j >= i || dup[j] {
					return fmt.Errorf("item %d: %w: %s", i, ErrPrerequisiteUnknown, p)
				}
				pending++
			}
		}
		if pending == 0 {
			now = append(now, i)
			continue
		}
		later = append(later, i)
		remaining = append(remaining, pending)
	}
	if err := q.writeSubset(ctx, db, b, now, useCopy, res); err != nil {
		return err
	}
	if len(later) == 0 {
		return nil
	}
	for start := 0; start < len(later); {
		end := start
		bytes := 0
		for end < len(later) && end-start < insertRows && (end == start || bytes+rowBytes(&b.items[later[end]]) <= chunkBytes) {
			bytes += rowBytes(&b.items[later[end]])
			end++
		}
		rows := make([]store.WaitingRow, 0, end-start)
		for n := start; n < end; n++ {
			i := later[n]
			it := &b.items[i]
			rows = append(rows, store.WaitingRow{EnqueueRow: store.EnqueueRow{ID: b.ids[i], Hash: b.hashes[i], Key: it.Key,
				Priority: it.Priority, Delay: it.Delay, MaxAttempts: q.maxAttempts(it), Payload: it.Payload,
				Metadata: it.Metadata, Tenant: it.Tenant, TTL: it.TTL, AtMostOnce: it.AtMostOnce,
				Headers: b.headers[i], Order: b.order(i), Frees: it.UniqueStates.frees(), Timeout: it.Timeout, Kind: it.Kind}, Remaining: remaining[n],
				RunAfter: it.RunAfter.bits()})
		}
		added, err := q.store.ItemsDepsInsertWaiting(ctx, db, q.engine.Load().dialect, name, rows)
		if err != nil {
			return err
		}
		got := make(map[uuid.UUID]bool, len(added))
		for _, id := range added {
			got[id] = true
		}
		var notAdded []int
		for n := start; n < end; n++ {
			i := later[n]
			if !got[b.ids[i]] {
				notAdded = append(notAdded, i)
				continue
			}
			res.New[i], res.Waiting[i] = true, true
			for _, p := range b.items[i].After {
				// An edge for each pending prerequisite only: one that
				// ended already is satisfied (acked, taken, or dead or
				// cancelled under RunAfter) and not counted in remaining,
				// so an edge from it would be released, and counted, once
				// more by the reaper.
				switch state[p] {
				case store.OutcomeAcked, store.OutcomeTaken, store.OutcomeDead, store.OutcomeCancelled:
				default:
					edgeFrom, edgeTo = append(edgeFrom, p), append(edgeTo, b.ids[i])
				}
			}
			for _, p := range b.items[i].AfterIn {
				if st := crossState[p]; st == store.PrereqQueued || st == store.PrereqWaiting {
					acrossQueue, acrossFrom, acrossTo = append(acrossQueue, p.Queue), append(acrossFrom, p.ID), append(acrossTo, b.ids[i])
				}
			}
		}
		if err := q.explainNotAdded(ctx, db, b, notAdded, res); err != nil {
			return err
		}
		start = end
	}
	for start := 0; start < len(edgeFrom); start += insertRows {
		end := min(start+insertRows, len(edgeFrom))
		if err := q.store.ItemsDepsInsertEdges(ctx, db, name, edgeFrom[start:end], edgeTo[start:end]); err != nil {
			return err
		}
	}
	for start := 0; start < len(acrossFrom); start += insertRows {
		end := min(start+insertRows, len(acrossFrom))
		if err := q.store.ItemsDepsInsertAcross(ctx, db, name, acrossQueue[start:end], acrossFrom[start:end], acrossTo[start:end]); err != nil {
			return err
		}
	}
	return nil
}

// explainNotAdded finds out why the waiting items idx were not added: an
// item of another queue fails the call; an ended id is done; the others
// are duplicates of queued or waiting items.
func (q *Queue) explainNotAdded(ctx context.Context, db crsql.DB, b *batch, idx []int, res *Enqueued) error {
	if len(idx) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(idx))
	for n, i := range idx {
		ids[n] = b.ids[i]
	}
	states, err := q.store.ItemsDepsClassify(ctx, db, q.engine.Load().dialect, q.opts.Queue, ids)
	if err != nil {
		return err
	}
	for n, st := range states {
		i := idx[n]
		switch st.State {
		case store.PrereqQueued, store.PrereqWaiting:
		case store.PrereqOther:
			return fmt.Errorf("item %d: %w: id %s is an item of queue %q", i, ErrIDInOtherQueue, b.ids[i], st.Queue)
		default:
			res.Done[i] = true
		}
	}
	return nil
}

// releaseBatch bounds one release transaction: the edges it reads, and so
// the dependents it locks and moves. A release of more edges (the root of a
// wide fan-out) takes several transactions, each committed before the next
// starts, so that its first dependents are claimable while it goes on and
// no transaction holds a dependent for long.
const releaseBatch = 1000

// releaseTxOptions are the options of the transactions that release and
// end dependents: READ COMMITTED on PostgreSQL, where the releases of a
// fan-in's prerequisites all lower the join's count: each waits for the
// row lock of the one before and then counts from its committed value,
// where SERIALIZABLE transactions would fail and retry one another (the
// count stays exact: each edge is deleted, and counted, by one transaction
// only, under its dependent's lock). SERIALIZABLE on CockroachDB.
func releaseTxOptions(d store.Dialect) pgx.TxOptions {
	if d == store.Postgres {
		return pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	}
	return pgx.TxOptions{IsoLevel: pgx.Serializable}
}

// releaseAcked releases the dependents of the items acked (by an ack that
// committed) that items wait for, as the ack itself found (afterAck: one
// seek of the edges per acked item, so an ack of items nothing waits for
// runs nothing more, and no process skips a release it needs), in short
// transactions of their own right after the ack's (releaseTxOptions), each
// of at most releaseBatch edges: the edges from the acked items are
// deleted, their dependents' remaining counts lowered, and those at zero
// moved into the items table. It locks the dependents in id order and waits
// for those another transaction holds: a release, a cancel or a purge,
// which hold them for one batch at most, or a reap's batch (internal/store/items_deps.go,
// "Lock order": no two of them can wait for each other in a cycle).
//
// Its failure (the database, a lost connection, a crash right after the
// ack) loses nothing: the edges of an acked prerequisite stay until a
// session's Reap finds it acked among the ended ids and releases its
// dependents (sweepDeps). So a dependent is released exactly once (the
// move deletes its waiting row) and at the latest by the next Reap.
func (q *Queue) releaseAcked(ctx context.Context, acked []uuid.UUID) {
	if len(acked) == 0 {
		return
	}
	// Dependents in other queues first: their hints are edges of this
	// queue that the release below would leave alone.
	q.releaseAcross(ctx, acked)
	d := q.engine.Load().dialect
	for {
		var res store.ReleaseResult
		err := retry.TxWith(ctx, q.db, releaseTxOptions(d), q.stats.retried("unblock"), func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = q.store.ItemsDepsReleaseBatch(ctx, tx, d, q.opts.Queue, acked, releaseBatch, false)
			if err == nil && len(res.Left) > 0 {
				// Edges of dependents that are gone (none normally).
				var n int64
				n, err = q.store.ItemsDepsDeleteEdgesGone(ctx, tx, d, q.opts.Queue, res.Left)
				res.Edges += int(n)
			}
			if err == nil && len(res.Moved) > 0 && q.notifies() {
				// Other processes' idle workers claim them at once.
				err = q.store.Notify(ctx, tx, q.channel, "")
			}
			return store.Classify(err)
		})
		if err != nil {
			q.stats.releaseFailed.Add(1)
			return
		}
		q.unblocked(len(res.Moved))
		if !res.More || res.Edges == 0 {
			return
		}
	}
}

// sweepDeps is Reap's dependency step: it walks up to sweepBatches ·
// sweepBatch edges of the queue, from where the last sweep stopped, and
// for each prerequisite that is neither queued nor waiting, releases its
// dependents (it was acked, or taken) or ends them, dead with reason
// "dependency died: <id>" (it died, was cancelled, or is unknown), then
// the dependents of those, and so on (settle). It never waits for a
// dependent another transaction holds (a release after an ack, a cancel,
// another session's reap): it leaves it, with its edges, to that
// transaction or to the next sweep, and never fails behind it. A row the
// database refuses is isolated and reported (refused.go).
func (q *Queue) sweepDeps(ctx context.Context) (released, died int, refused []*ReapError, err error) {
	q.deps.mu.Lock()
	defer q.deps.mu.Unlock()
	defer func() {
		q.stats.unblocked.Add(int64(released))
		q.stats.dead.Add(int64(died))
		if released > 0 {
			q.Wake()
		}
	}()
	// The queue's items that wait for items of other queues first
	// (depends_across.go); those it ended are prerequisites of this
	// queue's, settled next.
	// A failure there does not keep this queue's own edges from their
	// sweep below: it is returned after it.
	released, killed, acrossErr := q.sweepAcross(ctx)
	died += len(killed)
	defer func() { err = errors.Join(err, acrossErr) }()
	for len(killed) > 0 {
		r, k, bad, err := q.settleIsolated(ctx, killed)
		released += r
		died += len(k) - countEnded(bad)
		refused = append(refused, bad...)
		if err != nil {
			return released, died, refused, err
		}
		killed = k
	}
	var has bool
	err = retry.Do(ctx, q.stats.retried("reap"), func(ctx context.Context) error {
		var err error
		has, err = q.store.ItemsDepsHasEdges(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil || !has {
		return released, died, refused, err
	}
	d := q.engine.Load().dialect
	for range sweepBatches {
		var edges []uuid.UUID
		err := retry.Do(ctx, q.stats.retried("reap"), func(ctx context.Context) error {
			var err error
			edges, err = q.store.ItemsDepsSweepPrereqs(ctx, q.db, d, q.opts.Queue, q.deps.cursor, sweepBatch)
			return store.Classify(err)
		})
		if err != nil {
			return released, died, refused, err
		}
		var prereqs []uuid.UUID
		for n, p := range edges {
			if n == 0 || p != edges[n-1] {
				prereqs = append(prereqs, p)
			}
		}
		for len(prereqs) > 0 {
			// A row the database refuses is isolated and ended (or left,
			// reported), and the batch goes on without it (refused.go).
			r, killed, bad, err := q.settleIsolated(ctx, prereqs)
			released += r
			died += len(killed) - countEnded(bad) // the refused rows ended are no dependency deaths
			refused = append(refused, bad...)
			if err != nil {
				return released, died, refused, err
			}
			prereqs = killed // their own dependents, the next level
		}
		if len(edges) < sweepBatch {
			q.deps.cursor = uuid.Nil
			break
		}
		q.deps.cursor = edges[len(edges)-1]
	}
	return released, died, refused, nil
}

// settle classifies prereqs and, in the same transaction, releases the
// dependents of the acked (or taken) ones and ends those of the ones that
// ended otherwise, up to releaseBatch edges of each kind per transaction
// (releaseTxOptions), going on while there are more and the last
// transaction did something; it returns how many it released and the ids
// it ended. It skips the dependents another transaction holds (FOR UPDATE
// SKIP LOCKED): a sweep never waits for a release, and never fails behind
// one. Its edges of dependents that are gone are deleted last, in one
// statement, in key order (the lock order of internal/store/items_deps.go).
func (q *Queue) settle(ctx context.Context, prereqs []uuid.UUID) (int, []uuid.UUID, error) {
	d := q.engine.Load().dialect
	var released int
	var killed []uuid.UUID
	for {
		var moved int
		var ended []uuid.UUID
		var more, progress bool
		err := retry.TxWith(ctx, q.db, releaseTxOptions(d), q.stats.retried("reap"), func(ctx context.Context, tx pgx.Tx) error {
			moved, ended, more, progress = 0, nil, false, false
			states, err := q.store.ItemsDepsClassify(ctx, tx, d, q.opts.Queue, prereqs)
			if err != nil {
				return store.Classify(err)
			}
			var acked []uuid.UUID
			// The prerequisites that ended without an ack, by what their
			// dependents may do about it: dead ones and cancelled ones
			// release the dependents whose NewItem.RunAfter says so and
			// end the others; other ends (unknown, another queue's) end
			// every dependent.
			gone := []struct {
				bit      int64
				ids      []uuid.UUID
				outcomes []string
			}{{bit: store.RunAfterDead}, {bit: store.RunAfterCancelled}, {}}
			for _, st := range states {
				switch st.State {
				case store.PrereqQueued, store.PrereqWaiting:
				case store.OutcomeAcked, store.OutcomeTaken:
					acked = append(acked, st.ID)
				default: // dead, cancelled, another queue's, unknown
					g := &gone[2]
					switch st.State {
					case store.OutcomeDead:
						g = &gone[0]
					case store.OutcomeCancelled:
						g = &gone[1]
					}
					g.ids, g.outcomes = append(g.ids, st.ID), append(g.outcomes, st.State)
				}
			}
			var left []store.Edge
			if len(acked) > 0 {
				res, err := q.store.ItemsDepsReleaseBatch(ctx, tx, d, q.opts.Queue, acked, releaseBatch, true)
				if err != nil {
					return store.Classify(err)
				}
				moved, more, left = len(res.Moved), res.More, res.Left
				progress = res.Edges > 0
			}
			for _, g := range gone {
				if len(g.ids) == 0 {
					continue
				}
				if g.bit != 0 {
					res, err := q.store.ItemsDepsReleaseAnyway(ctx, tx, d, q.opts.Queue, g.ids, g.bit, releaseBatch)
					if err != nil {
						return store.Classify(err)
					}
					moved, more = moved+len(res.Moved), more || res.More
					progress = progress || res.Edges > 0
				}
				res, err := q.store.ItemsDepsKillBatch(ctx, tx, d, q.opts.Queue, g.ids, g.outcomes, g.bit, releaseBatch)
				if err != nil {
					return store.Classify(err)
				}
				ended, more, left = append(ended, res.Killed...), more || res.More, append(left, res.Left...)
				progress = progress || len(res.Killed) > 0
			}
			if len(left) > 0 {
				n, err := q.store.ItemsDepsDeleteEdgesGone(ctx, tx, d, q.opts.Queue, left)
				if err != nil {
					return store.Classify(err)
				}
				progress = progress || n > 0
			}
			if moved > 0 && q.notifies() {
				return store.Classify(q.store.Notify(ctx, tx, q.channel, ""))
			}
			return nil
		})
		if err != nil {
			return released, killed, err
		}
		released += moved
		killed = append(killed, ended...)
		if !more || !progress {
			return released, killed, nil
		}
	}
}

// PrereqStatus is one prerequisite of a waiting item, as Dependencies
// reports it.
type PrereqStatus struct {
	ID uuid.UUID
	// Queue is the prerequisite's queue when it is an item of another
	// queue (NewItem.AfterIn); "" for one of this queue.
	Queue string
	// State is "queued" (an item of the queue, not yet acked), "waiting"
	// (itself waiting for others), or how it ended ("acked", "taken",
	// "dead", "cancelled"; the reaper then settles the dependent soon), or
	// "unknown".
	State string
}

// Dependencies is what Queue.Dependencies reports about one id.
type Dependencies struct {
	// Waiting reports whether the id is a waiting item of the queue.
	Waiting bool
	// Remaining is the number of its prerequisites not yet acked, and
	// EnqueuedAt its enqueue time (when Waiting).
	Remaining  int64
	EnqueuedAt time.Time
	// RunAfter is its NewItem.RunAfter (when Waiting): the ends of a
	// prerequisite after which it runs anyway.
	RunAfter PrereqEnds
	// Prereqs are the prerequisites it still waits for, with their states.
	Prereqs []PrereqStatus
	// Dependents are up to the limit given of the items of this queue
	// that wait for it.
	Dependents []uuid.UUID
	// DependentsIn are up to the limit given of the items of other queues
	// that wait for it (their NewItem.AfterIn names it).
	DependentsIn []Prereq
}

// Dependencies reports what id waits for and, up to limit (at least 1),
// which items wait for it, in this queue.
func (q *Queue) Dependencies(ctx context.Context, id uuid.UUID, limit int) (Dependencies, error) {
	var d Dependencies
	if limit < 1 {
		return d, fmt.Errorf("claim: dependencies of %s: limit %d must be at least 1", id, limit)
	}
	if err := q.ready(ctx); err != nil {
		return d, fmt.Errorf("claim: dependencies of %s: %w", id, err)
	}
	err := retry.Tx(ctx, q.db, nil, func(ctx context.Context, tx pgx.Tx) error {
		d = Dependencies{}
		var err error
		var runAfter int64
		if d.Waiting, d.Remaining, d.EnqueuedAt, runAfter, err = q.store.ItemsDepsWaiting(ctx, tx, q.opts.Queue, id); err != nil {
			return store.Classify(err)
		}
		if runAfter&store.RunAfterDead != 0 {
			d.RunAfter |= PrereqDied
		}
		if runAfter&store.RunAfterCancelled != 0 {
			d.RunAfter |= PrereqCancelled
		}
		prereqs, err := q.store.ItemsDepsPrereqs(ctx, tx, q.opts.Queue, id)
		if err != nil {
			return store.Classify(err)
		}
		if len(prereqs) > 0 {
			states, err := q.store.ItemsDepsClassify(ctx, tx, q.engine.Load().dialect, q.opts.Queue, prereqs)
			if err != nil {
				return store.Classify(err)
			}
			for _, st := range states {
				d.Prereqs = append(d.Prereqs, PrereqStatus{ID: st.ID, State: st.State})
			}
		}
		// Its prerequisites in other queues, classified in theirs.
		across, err := q.store.ItemsDepsAcrossPrereqs(ctx, tx, q.opts.Queue, id)
		if err != nil {
			return store.Classify(err)
		}
		for _, e := range across {
			states, err := q.store.ItemsDepsClassify(ctx, tx, q.engine.Load().dialect, e.PrereqQueue, []uuid.UUID{e.Prereq})
			if err != nil {
				return store.Classify(err)
			}
			for _, st := range states {
				d.Prereqs = append(d.Prereqs, PrereqStatus{ID: st.ID, Queue: e.PrereqQueue, State: st.State})
			}
		}
		in, err := q.store.ItemsDepsAcrossDependents(ctx, tx, q.opts.Queue, id, limit)
		if err != nil {
			return store.Classify(err)
		}
		hint := make(map[uuid.UUID]bool, len(in))
		for _, e := range in {
			d.DependentsIn = append(d.DependentsIn, Prereq{Queue: e.DependentQueue, ID: e.Dependent})
			hint[e.Dependent] = true
		}
		// The same-queue edges hold the hints of those (internal/store's
		// items_deps_across.go): left out of Dependents.
		deps, err := q.store.ItemsDepsDependents(ctx, tx, q.opts.Queue, id, limit+len(in))
		for _, dep := range deps {
			if !hint[dep] && len(d.Dependents) < limit {
				d.Dependents = append(d.Dependents, dep)
			}
		}
		return store.Classify(err)
	})
	if err != nil {
		return Dependencies{}, fmt.Errorf("claim: dependencies of %s: %w", id, err)
	}
	return d, nil
}

// waitingCount returns the number of the queue's waiting items: enqueued
// with prerequisites not yet all acked (QueueInfo.Waiting).
func (q *Queue) waitingCount(ctx context.Context) (int64, error) {
	var n int64
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		n, err = q.store.ItemsDepsWaitingCount(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return 0, fmt.Errorf("claim: counting waiting items: %w", err)
	}
	return n, nil
}

// depsState is a Queue's state of dependencies: where its sweep goes on
// (cursor, the last prerequisite swept; mu serializes sweeps).
type depsState struct {
	mu     sync.Mutex
	cursor uuid.UUID
	// acrossCursor is where the sweep of edges from other queues goes on
	// (the last dependent swept).
	acrossCursor uuid.UUID
}

// unblocked counts n dependents released by a committed ack, and wakes
// this process's workers to claim them.
func (q *Queue) unblocked(n int) {
	if n > 0 {
		q.stats.unblocked.Add(int64(n))
		q.Wake()
	}
}

// cancelWaiting cancels the waiting item id, if it is one (Cancel).
func (q *Queue) cancelWaiting(ctx context.Context, id uuid.UUID) (bool, error) {
	var existed bool
	err := retry.Tx(ctx, q.db, q.stats.retried("cancel"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		existed, err = q.store.ItemsDepsCancelWaiting(ctx, tx, q.engine.Load().dialect, id, q.opts.Queue)
		return store.Classify(err)
	})
	return existed, err
}
