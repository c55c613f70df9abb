package claim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/wake"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Limits of one item, whatever Options say, each checked before anything
// is written. CockroachDB refuses protocol messages over 16 MiB by default
// (sql.conn.max_read_buffer_message_size), so an item must fit, with room
// to spare, in the 8 MiB that enqueue puts in one statement or COPY; and
// the texts that the items' indexes hold must fit in PostgreSQL's bound on
// an index entry (see package sql's MaxKeyLength), or the database would
// refuse the item's row later, when a move of the item writes it into the
// items table (docs/enqueue.md, "Bounds").
const (
	// MaxPayloadLimit bounds Options.MaxPayload: no payload, and no
	// metadata, may exceed it.
	MaxPayloadLimit = 3 << 20
	// MaxKeyLength bounds the length in bytes of NewItem.Key and of
	// NewItem.Tenant (and of the tenant of SettingsUpdate.TenantLimits): 2,048, which,
	// with a queue name of up to MaxQueueNameLength bytes, fits in
	// PostgreSQL's bound on the entry of the indexes that hold them.
	MaxKeyLength = 2048
	// MaxUniqueKeyLength bounds the length in bytes of NewItem.UniqueKey,
	// which is not stored (the item's id is derived from it).
	MaxUniqueKeyLength = 4096
	// MaxQueueNameLength bounds the length in bytes of a queue's name
	// (Options.Queue).
	MaxQueueNameLength = 512
	// MaxHeadersBytes bounds the bytes of NewItem.Headers: the sum of the
	// lengths of its keys and values.
	MaxHeadersBytes = 16 << 10
)

// Bounds of one enqueue statement or COPY.
const (
	// chunkBytes bounds the estimated bytes of the rows of one statement or
	// one COPY: half of CockroachDB's default limit on a message.
	chunkBytes = 8 << 20
	// rowOverhead estimates the bytes a row takes besides its payload,
	// metadata, key and tenant: the id, five integers and the length words of the
	// array or COPY encoding.
	rowOverhead = 96
	// insertRows bounds the rows of one INSERT; copyRows those of one COPY.
	insertRows = 5000
	copyRows   = 50000
	// copyMinRows is the number of generated ids from which an enqueue
	// streams them with COPY: below it, the INSERT (fewer round trips) is
	// as fast.
	copyMinRows = 64
)

// ErrIDInOtherQueue is returned by Enqueue when a caller-given NewItem.ID is
// the id of an item of another queue. Nothing is enqueued.
var ErrIDInOtherQueue = errors.New("the id belongs to an item of another queue")

// NewItem is an item to enqueue. Only Payload is required.
type NewItem struct {
	// ID, if not zero, is the item's id, chosen by the caller; zero means a
	// random one is generated (or, with a UniqueKey, one derived from it).
	// Enqueue is idempotent on ids: an item whose id is already in the
	// queue's items table is left as it is and not added again, and neither
	// is one whose id ended in this queue (acked, dead, cancelled, or taken
	// by the claim of an at-most-once item) within the queue's dedup window
	// (Policy.DedupWindow, a day by default). So an enqueue retried after
	// an unknown outcome never creates a duplicate, nor runs work again
	// that a worker already finished, as long as the retry comes within
	// the window.
	ID uuid.UUID
	// UniqueKey, if set, makes the item unique by this key in its queue
	// (within UniquePeriod, if set), in the manner of River's unique jobs:
	// its id is derived from the queue's name, the key and the start of the
	// period (see UniqueID), so enqueues of the same key in the same period
	// get the same id and the dedup of ids applies: while an item of that
	// key and period is queued or running, and for the queue's dedup window
	// after it ended, another is not added (Enqueued.New is false, and
	// Enqueued.Done says whether it ended). Make the dedup window at least
	// UniquePeriod for the key to stay unique for its whole period. It may
	// not be given together with ID (the derived id is the item's id: retry
	// an unknown outcome with the returned id in ID, or with the same
	// UniqueKey within the same period). At most MaxUniqueKeyLength bytes
	// of valid UTF-8, without NUL bytes.
	UniqueKey string
	// UniquePeriod, if positive, divides time into periods of this length
	// (counted from the Unix epoch, by this process's clock: processes whose
	// clocks disagree may see a boundary at slightly different instants):
	// a UniqueKey is unique within each period, and the next period's
	// enqueue of the key adds a new item. Zero: one period for ever (the
	// key is unique while an item of it is queued or within the dedup
	// window). Only with UniqueKey; at least a microsecond.
	UniquePeriod time.Duration
	// UniqueStates says which states of an earlier item of the same
	// UniqueKey (and period) keep this one out (River's unique states,
	// pg-boss's singleton policies): zero means every state (UniqueAll),
	// as before. An item that is queued, delayed, snoozed, waiting or
	// running always blocks (UniqueLive must be in the set: the id derived
	// from the key is the item's key, and two live items cannot share it);
	// the set chooses which ends block for the queue's dedup window
	// (UniqueAcked, UniqueDead, UniqueCancelled). "One pending at a time,
	// run again when done" is UniqueLive alone. An enqueue that adds an
	// item whose id had ended with an outcome outside the set deletes that
	// ended record (the id is live again). Only with UniqueKey.
	UniqueStates UniqueStates
	// Payload is the item's data, at most Options.MaxPayload bytes.
	Payload []byte
	// Metadata is optional data kept beside the payload (headers, tracing).
	Metadata []byte
	// Key, if set, fixes the item's part: items with the same key land in
	// the same part, so parts mode handles them in order of priority and
	// vesting time. Without a key, items are spread evenly over the parts.
	// At most MaxKeyLength bytes of valid UTF-8, without NUL bytes.
	Key string
	// Priority orders claims: lower values are claimed first. Default 0.
	Priority int
	// Delay postpones the item: it becomes claimable this long after the
	// enqueue, by the database clock.
	Delay time.Duration
	// MaxAttempts overrides Options.MaxAttempts for this item.
	MaxAttempts int
	// Tenant, if set, names who the item belongs to (a user, an account).
	// Fair queues (Policy.Fair) spread claims over tenants, and limits
	// may be set per tenant. Without a Key, a tenant's items share one part
	// (the tenant fixes the part as a key would), so that the part's owner
	// sees all of the tenant's work — except in a fair queue, where the
	// items of a tenant without a limit (its own or the queue's default)
	// are spread over the parts by turn, so that every part holds its
	// share of every tenant's backlog (docs/fairness.md). At most
	// MaxKeyLength bytes of valid UTF-8, without NUL bytes.
	Tenant string
	// TTL, if not zero, gives the item a deadline this long after the
	// enqueue, by the database clock: past it, no claim hands the item out
	// again, and Reap moves it to the dead items with reason "expired" once
	// no claim holds it. A claim made before the deadline may still ack.
	TTL time.Duration
	// Headers travel with the item from its producer to its handler
	// (Item.Headers): trace context (the module otelcrdbwork fills them
	// through Options.Hooks) or any other small string
	// pairs. Stored as a JSON object; nil or empty: none. Keys must not be
	// empty; keys and values are valid UTF-8 without NUL bytes, at most
	// MaxHeadersBytes in all.
	Headers map[string]string
	// AtMostOnce makes the item at-most-once: the claim that hands it out
	// deletes it (see Claimer.Claim), so it is never handed out twice,
	// and it is lost if its handler fails or its process dies. Its
	// MaxAttempts is 1. Policy.AtMostOnce does the same for every item
	// of the queue.
	AtMostOnce bool
	// After lists the items, of this queue, that this one waits for (see
	// docs/dependencies.md): it becomes claimable only once every one of
	// them is acked, and it ends, dead with reason "dependency died: <id>",
	// if one of them dies or is cancelled. Each must exist when the call
	// runs: queued, waiting, or ended within the queue's dedup window, or
	// be an earlier item of the same call. At most MaxAfter ids, none
	// repeated, none the item's own. Nil: the item waits for nothing.
	After []uuid.UUID
	// RunAfter makes the item run anyway when a prerequisite (After) ends
	// in one of these ways instead of being acked: PrereqDied,
	// PrereqCancelled, or both (Oban's ignore_discarded and
	// ignore_cancelled). Such an end then satisfies the prerequisite as an
	// ack would, at enqueue (a prerequisite already dead or cancelled is
	// no ErrPrerequisiteDied) and later (the reaper's dependency step
	// releases the item instead of ending it dead). Zero: any such end
	// ends the item dead with reason "dependency died: <id>", as before. A
	// prerequisite that is forgotten (ErrPrerequisiteUnknown) or of
	// another queue still fails the item. Only with After.
	RunAfter PrereqEnds
	// AfterIn lists items of other queues that this one waits for, as
	// After lists items of its own (docs/dependencies.md, "Prerequisites
	// in other queues"): the item becomes claimable once every prerequisite
	// of After and AfterIn is acked, and the ack of one in its own queue
	// releases it, as an ack in this queue does. Each must be queued,
	// waiting, or ended within its own queue's dedup window (which must be
	// on) when the call runs; RunAfter applies to its ends too. Its queue
	// must not be this one (list those in After). At most MaxAfter ids in
	// After and AfterIn together, none repeated.
	AfterIn []Prereq
	// Timeout, if not zero, is how long one handler run of this item may
	// take, instead of the worker's worker.Options.ItemTimeout (River's
	// per-job timeout, pg-boss's expireInSeconds): the handler's context
	// ends with context.DeadlineExceeded this long after its start, and an
	// attempt that runs out of it is a failed attempt (retried with
	// backoff, dead with its error after its last attempt), however long
	// or short the worker's default. The worker keeps the item's lease
	// over its timeout (docs/timeouts.md). Between MinTimeout and
	// MaxTimeout, at microsecond precision. Workers of schema versions 3
	// to 5 ignore it (they run the item with their own ItemTimeout).
	Timeout time.Duration
	// Kind, if set, names what the item is (River's JobArgs.Kind, an Oban
	// worker): a worker whose handler is a worker.Kinds runs it with the
	// handler registered for the kind, and the payload is its arguments
	// (ArgsItem fills Kind and Payload from typed arguments). "": no kind,
	// as before. At most MaxKindLength bytes of valid UTF-8, without NUL
	// bytes. Workers of schema versions 3 to 5 ignore it: their one handler
	// runs every item (docs/kinds.md, "Rolling upgrades").
	Kind string
}

// MaxKindLength bounds the length in bytes of NewItem.Kind.
const MaxKindLength = 255

// MinTimeout and MaxTimeout bound NewItem.Timeout (zero: none).
const (
	MinTimeout = time.Millisecond
	MaxTimeout = maxLease
)

// UniqueStates is a set of states of an item with a unique key
// (NewItem.UniqueStates): those in which an earlier item of the key keeps a
// new one out.
type UniqueStates uint8

// The states of UniqueStates.
const (
	// UniqueLive: queued (delayed or snoozed included), waiting for
	// prerequisites, or claimed (running). Always in a set.
	UniqueLive UniqueStates = 1 << iota
	// UniqueAcked: acked (or, at most once, taken by a claim) within the
	// queue's dedup window.
	UniqueAcked
	// UniqueDead: moved to the dead items within the dedup window.
	UniqueDead
	// UniqueCancelled: cancelled within the dedup window.
	UniqueCancelled

	// UniqueAll is every state: the default (the zero value means it).
	UniqueAll = UniqueLive | UniqueAcked | UniqueDead | UniqueCancelled
)

// String returns the set's states, such as "live|acked".
func (u UniqueStates) String() string {
	if u == 0 {
		u = UniqueAll
	}
	var parts []string
	for _, s := range []struct {
		bit  UniqueStates
		name string
	}{{UniqueLive, "live"}, {UniqueAcked, "acked"}, {UniqueDead, "dead"}, {UniqueCancelled, "cancelled"}} {
		if u&s.bit != 0 {
			parts = append(parts, s.name)
		}
	}
	if rest := u &^ UniqueAll; rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint8(rest)))
	}
	return strings.Join(parts, "|")
}

// blocks reports whether an earlier item of the key that ended with
// outcome (a store outcome) keeps a new one out.
func (u UniqueStates) blocks(outcome string) bool {
	f := u.frees()
	switch outcome {
	case store.OutcomeAcked, store.OutcomeTaken:
		return f&store.EndedFreesAcked == 0
	case store.OutcomeDead:
		return f&store.EndedFreesDead == 0
	case store.OutcomeCancelled:
		return f&store.EndedFreesCancelled == 0
	}
	return true
}

// frees returns the store's EndedFrees bits of the set: the ends left out
// of it (none for the default, every state).
func (u UniqueStates) frees() int64 {
	if u == 0 {
		return 0
	}
	var f int64
	if u&UniqueAcked == 0 {
		f |= store.EndedFreesAcked
	}
	if u&UniqueDead == 0 {
		f |= store.EndedFreesDead
	}
	if u&UniqueCancelled == 0 {
		f |= store.EndedFreesCancelled
	}
	return f
}

// Enqueued reports what an enqueue did.
type Enqueued struct {
	// IDs are the items' ids, in the order of the items: the caller's
	// NewItem.ID, or the one generated.
	IDs []uuid.UUID
	// New[i] reports whether this call added item i. False means the id
	// was a duplicate and nothing was added for it: either an item with
	// that id is in the queue's items table (enqueued earlier, not yet
	// ended: Done[i] is false), or one ended in this queue within its dedup
	// window (Done[i] is true). An id whose item ended longer ago than the
	// window (or in a queue whose window is off) is enqueued again, as a
	// new item.
	New []bool
	// Done[i] reports whether item i's id ended in this queue (acked, moved
	// to the dead items, cancelled, or taken by the claim of an
	// at-most-once item) within the queue's dedup window and is not in the
	// items table: its work is done (or dead) and was not enqueued again.
	// Always false when New[i] is true. When the call's statements ran
	// outside one transaction (a single item of Enqueue on CockroachDB),
	// Done is read by a second statement: an item acked in between is then
	// reported done rather than queued.
	Done []bool
	// Waiting[i] reports whether this call added item i as a waiting item
	// (NewItem.After named prerequisites not yet acked): it is not
	// claimable until they are. Nil when no item of the call has After.
	Waiting []bool
}

// Added returns the number of items the call added.
func (e Enqueued) Added() int {
	n := 0
	for _, isNew := range e.New {
		if isNew {
			n++
		}
	}
	return n
}

// Enqueue adds items to the queue atomically (all or none) and reports
// what it did (see Enqueued): the items' ids in order, which items this
// call added, and which were not added because their id was already queued
// or had ended. An item whose ID is already in the queue's items table is
// not added again. Many items with generated ids (from 64) are streamed
// with COPY; caller-given ids, and fewer items, go in multi-row INSERT … ON
// CONFLICT DO NOTHING statements. A call of any size is split into
// statements and COPYs of at most 8 MiB, in one transaction.
//
// If err wraps ErrOutcomeUnknown, the items may or may not have been
// enqueued; their ids are returned all the same (Enqueued.IDs; New and Done
// are nil): enqueue the same items with NewItem.ID set to them to make sure
// (the retry's Enqueued says which were new). That adds no duplicate
// whatever happened meanwhile, provided the retry comes within the queue's
// dedup window (Policy.DedupWindow, a day by default): an item still
// queued is found in the items table, and one that a worker already acked
// (or that died, was cancelled, or was taken as an at-most-once item) is
// found among the ended ids, and is not run again. On any other error
// nothing was enqueued and the Enqueued is zero.
func (q *Queue) Enqueue(ctx context.Context, items ...NewItem) (Enqueued, error) {
	return q.hooked(ctx, items, q.enqueue)
}

// enqueue is Enqueue without the Hooks.
func (q *Queue) enqueue(ctx context.Context, items []NewItem) (Enqueued, error) {
	b, err := q.prepare(items)
	if err != nil || len(items) == 0 {
		return Enqueued{}, err
	}
	return q.enqueueBatch(ctx, b)
}

// enqueueBatch writes b, prepared (validated, its ids, hashes, headers and
// sequence orders fixed), outside any transaction of the caller's: the
// write path that Enqueue and a Buffer's flushes share, so that every
// option of NewItem means the same through both. Items with prerequisites
// (NewItem.After) make it one transaction that routes them to the waiting
// items (enqueueDeps); otherwise it is one statement or one transaction
// (enqueueOn).
func (q *Queue) enqueueBatch(ctx context.Context, b *batch) (Enqueued, error) {
	if err := q.ready(ctx); err != nil {
		return Enqueued{}, fmt.Errorf("claim: enqueueing into %q: %w", q.opts.Queue, plain(err))
	}
	if b.deps {
		return q.enqueueDeps(ctx, b)
	}
	return q.enqueueOn(ctx, q.db, b)
}

// enqueueOn writes b through db in one statement or one transaction,
// retried while it fails with a serialization failure.
func (q *Queue) enqueueOn(ctx context.Context, db DB, b *batch) (Enqueued, error) {
	var res Enqueued
	err := retry.Do(ctx, nil, func(ctx context.Context) error { return store.Classify(q.stamp(ctx, db, b)) })
	if err != nil {
		// The turns are only read: nothing was written, whatever the
		// connection did. A plain failure, never an unknown outcome.
		return Enqueued{}, fmt.Errorf("claim: enqueueing %d items into %q: reading the tenants' turns (nothing was enqueued): %w",
			len(b.items), q.opts.Queue, plain(err))
	}
	single := !b.needsTx(true, q.isolated())
	notify := q.notifies() && b.dueNow()
	if single {
		err = retry.Do(ctx, q.stats.retried("enqueue"), func(ctx context.Context) error {
			res = b.result()
			if bd, ok := db.(store.Batcher); ok && notify && len(b.given) == 0 {
				// The INSERT and its notification in one round trip and
				// one implicit transaction.
				return q.insertNotify(ctx, bd, b, &res)
			}
			if err := q.write(ctx, db, b, false, &res); err != nil || !notify {
				return err
			}
			// Committed already: the notification follows in a statement
			// of its own (a database value that cannot pipeline).
			// Its failure is no enqueue's failure (a retry would add
			// the items again): a lost wake-up costs a poll interval.
			_ = q.store.Notify(ctx, db, q.channel, b.payload())
			return nil
		})
	} else {
		err = retry.Tx(ctx, db, q.stats.retried("enqueue"), func(ctx context.Context, tx pgx.Tx) error {
			res = b.result()
			if err := q.write(ctx, tx, b, true, &res); err != nil {
				return err
			}
			if notify && res.Added() > 0 {
				return q.store.Notify(ctx, tx, q.channel, b.payload())
			}
			return nil
		})
	}
	res, err = q.finish(b, res, err) // retry.Do and retry.Tx classify
	if err == nil && res.Added() > 0 && b.dueNow() {
		wake.SignalHashes(q.channel, wake.ParsePayload(b.payload()))
	}
	return res, err
}

// insertNotify writes b, whose ids are all generated and which fits one
// INSERT, together with the queue's wake-up notification.
func (q *Queue) insertNotify(ctx context.Context, db store.Batcher, b *batch, res *Enqueued) error {
	rows := q.enqueueRows(b, all(len(b.items)))
	added, err := q.store.ItemsEnqueueNotify(ctx, db, q.opts.Queue, rows, q.channel, b.payload())
	if err != nil {
		return err
	}
	return markAdded(b, all(len(b.items)), added, res)
}

// EnqueueTx adds items in the caller's transaction tx, so that the items
// exist if and only if tx commits, and reports what it did as Enqueue does
// (see Enqueued: the same fields with the same meaning, for what commits
// with tx). It does not retry, and nothing commits here: on error, roll tx
// back (nothing of the call is unknown; the Enqueued is zero); retrying the
// transaction is the caller's business. Ids and idempotence are as for
// Enqueue; the check against ended ids is as isolated as tx: run it
// SERIALIZABLE (CockroachDB's default; on PostgreSQL, BEGIN ISOLATION LEVEL
// SERIALIZABLE) so that an ack of the same id committing at the same moment
// cannot slip between the check and the insert; under READ COMMITTED such a
// race can add the id again.
func (q *Queue) EnqueueTx(ctx context.Context, tx pgx.Tx, items ...NewItem) (Enqueued, error) {
	return q.hooked(ctx, items, func(ctx context.Context, items []NewItem) (Enqueued, error) {
		return q.enqueueTx(ctx, tx, items)
	})
}

// enqueueTx is EnqueueTx without the Hooks.
func (q *Queue) enqueueTx(ctx context.Context, tx pgx.Tx, items []NewItem) (Enqueued, error) {
	b, err := q.prepare(items)
	if err != nil || len(items) == 0 {
		return Enqueued{}, err
	}
	if err := q.readyOn(ctx, tx); err != nil {
		return Enqueued{}, fmt.Errorf("claim: enqueueing into %q: %w", q.opts.Queue, plain(err))
	}
	res := b.result()
	if err := q.stamp(ctx, tx, b); err != nil {
		return Enqueued{}, fmt.Errorf("claim: enqueueing %d items into %q: reading the tenants' turns: %w", len(items), q.opts.Queue, plain(store.Classify(err)))
	}
	write := q.write
	if b.deps {
		write = q.writeDeps
	}
	if err := write(ctx, tx, b, true, &res); err != nil {
		return Enqueued{}, fmt.Errorf("claim: enqueueing %d items into %q: %w", len(items), q.opts.Queue, store.Classify(err))
	}
	if q.notifies() && b.dueNow() && res.Added() > 0 {
		// No part hint (""): the notifications of several EnqueueTx calls
		// in one transaction are then identical, and PostgreSQL merges
		// them into one.
		if err := q.store.Notify(ctx, tx, q.channel, ""); err != nil {
			return Enqueued{}, fmt.Errorf("claim: enqueueing %d items into %q: sending the wake-up notification: %w", len(items), q.opts.Queue, store.Classify(err))
		}
	}
	q.stats.enqueued.Add(int64(res.Added()))
	return res, nil
}

// finish wraps an error with context and counts the items added.
func (q *Queue) finish(b *batch, res Enqueued, err error) (Enqueued, error) {
	if err != nil {
		err = fmt.Errorf("claim: enqueueing %d items into %q: %w", len(b.items), q.opts.Queue, store.Classify(err))
		if errors.Is(err, ErrOutcomeUnknown) {
			return Enqueued{IDs: b.ids}, err
		}
		return Enqueued{}, err
	}
	q.stats.enqueued.Add(int64(res.Added()))
	return res, nil
}

// errBadInput marks errors found before anything was sent.
var errBadInput = errors.New("bad input")

// copier is what a COPY needs: pgx.Tx, *pgx.Conn and *pgxpool.Pool have it.
type copier interface {
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// batch is one call's items, validated, with the ids and key hashes fixed
// before the first attempt, so that every retry writes the same rows.
type batch struct {
	items  []NewItem
	ids    []uuid.UUID
	hashes []int64
	// turns are the fair turns of the items with a tenant in a fair queue
	// (nil otherwise; see Queue.stamp).
	turns []*time.Time
	// headers are the items' headers as JSON objects (nil: none).
	headers   [][]byte
	given     []int // items whose id the caller chose
	generated []int // items whose id was generated
	// orders is the sequence order of item 0; item i's is orders+i (see
	// sequenceOrders).
	orders int64
	// pos, in a batch made of some of another's items (subset), is each
	// item's place in that batch: its sequence order is orders+pos[i].
	pos  []int
	deps bool // some item has NewItem.After or AfterIn
	// queue is the queue the batch is enqueued into (checkAfter refuses
	// it in AfterIn).
	queue string
}

// needsTx reports whether writing b takes more than one statement, or a
// transaction of its own.
//
// Caller-given ids need one, since an id of another queue's item must fail
// the whole call (checkFound runs after the INSERT) — unless the call has
// a single item: then there is nothing else to undo. Except where a single
// statement is not isolated (!isolated: PostgreSQL, whose statements
// outside a transaction run at READ COMMITTED): there an INSERT of a given
// id that an ack deletes and records as ended at the same moment could miss
// both (its ON CONFLICT waits for the ack and then finds no conflict, while
// its read of the ended ids predates the ack); a SERIALIZABLE transaction
// turns that race into a serialization failure, retried.
func (b *batch) needsTx(canCopy, isolated bool) bool {
	return (len(b.given) > 0 && (len(b.items) > 1 || !isolated)) || (canCopy && len(b.generated) >= copyMinRows) ||
		len(chunks(b.items, all(len(b.items)), insertRows)) > 1
}

// plain strips ErrOutcomeUnknown from err: for failures of work that wrote
// nothing (a read, a check), whose outcome is known whatever the
// connection did. The other errors err wraps stay reachable.
func plain(err error) error {
	if err == nil || !errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	return knownOutcome{msg: strings.ReplaceAll(err.Error(), ErrOutcomeUnknown.Error()+": ", ""), errs: stripUnknown(err)}
}

// knownOutcome is an error whose tree had ErrOutcomeUnknown taken out.
type knownOutcome struct {
	msg  string
	errs []error
}

func (e knownOutcome) Error() string   { return e.msg }
func (e knownOutcome) Unwrap() []error { return e.errs }

// stripUnknown returns the errors of err's tree that do not lead to
// ErrOutcomeUnknown, in place of the wrappers that do.
func stripUnknown(err error) []error {
	if err == nil || err == ErrOutcomeUnknown {
		return nil
	}
	if !errors.Is(err, ErrOutcomeUnknown) {
		return []error{err}
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		var out []error
		for _, e := range u.Unwrap() {
			out = append(out, stripUnknown(e)...)
		}
		return out
	case interface{ Unwrap() error }:
		return stripUnknown(u.Unwrap())
	}
	return nil
}

// uniqueNamespace is the UUID namespace of the ids derived from unique keys.
var uniqueNamespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/crdbwork/crdbwork/claim/unique"))

// UniqueID returns the id Enqueue gives an item of queue with unique key
// key (NewItem.UniqueKey) enqueued at t, with periods of length period
// (NewItem.UniquePeriod; 0: one period for ever): a name-based (version 5)
// UUID of the queue, the key and the start of t's period, counted in whole
// periods from the Unix epoch. Callers may use it to look the item up, or
// to cancel it.
func UniqueID(queue, key string, period time.Duration, t time.Time) uuid.UUID {
	var start int64
	if period > 0 {
		ns := t.UnixNano()
		start = ns - ((ns%int64(period))+int64(period))%int64(period) // floor, before the epoch too
	}
	name := fmt.Sprintf("%d:%s|%d:%s|%d|%d", len(queue), queue, len(key), key, period.Nanoseconds(), start)
	return uuid.NewSHA1(uniqueNamespace, []byte(name))
}

func (b *batch) result() Enqueued {
	res := Enqueued{IDs: b.ids, New: make([]bool, len(b.items)), Done: make([]bool, len(b.items))}
	if b.deps {
		res.Waiting = make([]bool, len(b.items))
	}
	return res
}

// isolated reports whether a single statement outside a transaction is
// serializable: on CockroachDB (whose only isolation of such statements,
// unless a cluster changes its default, is SERIALIZABLE). ready has run.
func (q *Queue) isolated() bool {
	e := q.engine.Load()
	return e != nil && e.claimInTx
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// prepare validates items and fixes their ids and key hashes.
func (q *Queue) prepare(items []NewItem) (*batch, error) {
	b := &batch{items: items, ids: make([]uuid.UUID, len(items)), hashes: make([]int64, len(items)), headers: make([][]byte, len(items)),
		orders: sequenceOrders.Add(int64(len(items))) - int64(len(items)), queue: q.opts.Queue}
	var seen map[uuid.UUID]int
	now := time.Now() // the unique keys' periods, one instant for the call
	for i := range items {
		it := &items[i]
		if err := q.validate(i, it); err != nil {
			return nil, err
		}
		h, err := headersJSON(it.Headers)
		if err != nil {
			return nil, fmt.Errorf("claim: item %d: %w", i, err)
		}
		b.headers[i] = h
		if it.UniqueKey != "" {
			if seen == nil {
				seen = make(map[uuid.UUID]int)
			}
			id := UniqueID(q.opts.Queue, it.UniqueKey, it.UniquePeriod, now)
			if j, dup := seen[id]; dup {
				return nil, fmt.Errorf("claim: items %d and %d: %w: both have unique key %q in the same period (id %s)", j, i, errBadInput, it.UniqueKey, id)
			}
			seen[id] = i
			b.given = append(b.given, i)
			b.ids[i] = id
		} else if it.ID == (uuid.UUID{}) {
			b.generated = append(b.generated, i)
		} else {
			if seen == nil {
				seen = make(map[uuid.UUID]int)
			}
			if j, dup := seen[it.ID]; dup {
				return nil, fmt.Errorf("claim: items %d and %d: %w: both have id %s", j, i, errBadInput, it.ID)
			}
			seen[it.ID] = i
			b.given = append(b.given, i)
			b.ids[i] = it.ID
		}
		var hash uint64
		if it.Key != "" || it.Tenant != "" {
			hash = keyHash(it.Key, it.Tenant)
		} else {
			hash = q.next.Add(1)
		}
		b.hashes[i] = int64(hash & math.MaxInt64)
	}
	if err := randomIDs(b.ids, b.generated); err != nil {
		return nil, err
	}
	if err := b.checkAfter(); err != nil {
		return nil, err
	}
	return b, nil
}

// randomIDs fills ids[i], for i in idx, with random (version 4) UUIDs, from
// one read of the system's random source.
func randomIDs(ids []uuid.UUID, idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	buf := make([]byte, 16*len(idx))
	if _, err := rand.Read(buf); err != nil {
		return fmt.Errorf("claim: generating item ids: %w", err)
	}
	for n, i := range idx {
		copy(ids[i][:], buf[16*n:])
		ids[i][6] = ids[i][6]&0x0f | 0x40 // version 4
		ids[i][8] = ids[i][8]&0x3f | 0x80 // RFC 4122 variant
	}
	return nil
}

func (q *Queue) validate(i int, it *NewItem) error {
	limit := min(q.opts.MaxPayload, MaxPayloadLimit)
	var err error
	switch {
	case len(it.Payload) > limit:
		err = fmt.Errorf("%w: %d bytes, the limit is %d (Options.MaxPayload, at most MaxPayloadLimit); store large data elsewhere and enqueue a reference",
			ErrPayloadTooLarge, len(it.Payload), limit)
	case len(it.Metadata) > limit:
		err = fmt.Errorf("%w: metadata is %d bytes, the limit is %d (Options.MaxPayload, at most MaxPayloadLimit)",
			ErrPayloadTooLarge, len(it.Metadata), limit)
	case len(it.Key) > MaxKeyLength:
		err = fmt.Errorf("%w: the key is %d bytes, the limit is %d (MaxKeyLength)", errBadInput, len(it.Key), MaxKeyLength)
	case !utf8.ValidString(it.Key) || strings.ContainsRune(it.Key, 0):
		err = fmt.Errorf("%w: the key must be valid UTF-8 without NUL bytes", errBadInput)
	case it.UniqueKey != "" && it.ID != (uuid.UUID{}):
		err = fmt.Errorf("%w: both ID and UniqueKey are set: the id of an item with a unique key is derived from it (retry an unknown outcome with the returned id in ID and no UniqueKey, or with the same UniqueKey)", errBadInput)
	case len(it.UniqueKey) > MaxUniqueKeyLength:
		err = fmt.Errorf("%w: the unique key is %d bytes, the limit is %d (MaxUniqueKeyLength)", errBadInput, len(it.UniqueKey), MaxUniqueKeyLength)
	case !utf8.ValidString(it.UniqueKey) || strings.ContainsRune(it.UniqueKey, 0):
		err = fmt.Errorf("%w: the unique key must be valid UTF-8 without NUL bytes", errBadInput)
	case it.UniquePeriod < 0 || (it.UniquePeriod > 0 && it.UniquePeriod < time.Microsecond):
		err = fmt.Errorf("%w: UniquePeriod %v must be 0 (one period) or at least 1µs", errBadInput, it.UniquePeriod)
	case it.UniqueStates != 0 && it.UniqueKey == "":
		err = fmt.Errorf("%w: UniqueStates %v without a UniqueKey", errBadInput, it.UniqueStates)
	case it.UniqueStates&^UniqueAll != 0:
		err = fmt.Errorf("%w: UniqueStates %v has states that do not exist", errBadInput, it.UniqueStates)
	case it.UniqueStates != 0 && it.UniqueStates&UniqueLive == 0:
		err = fmt.Errorf("%w: UniqueStates %v lacks UniqueLive: a queued, waiting or running item of the key always blocks (its id is the key's)", errBadInput, it.UniqueStates)
	case it.RunAfter != 0 && !it.hasPrereqs():
		err = fmt.Errorf("%w: RunAfter %v without After or AfterIn", errBadInput, it.RunAfter)
	case it.RunAfter&^(PrereqDied|PrereqCancelled) != 0:
		err = fmt.Errorf("%w: RunAfter %v has ends that do not exist", errBadInput, it.RunAfter)
	case it.UniquePeriod != 0 && it.UniqueKey == "":
		err = fmt.Errorf("%w: UniquePeriod %v without a UniqueKey", errBadInput, it.UniquePeriod)
	case len(it.Tenant) > MaxKeyLength:
		err = fmt.Errorf("%w: the tenant is %d bytes, the limit is %d (MaxKeyLength)", errBadInput, len(it.Tenant), MaxKeyLength)
	case !utf8.ValidString(it.Tenant) || strings.ContainsRune(it.Tenant, 0):
		err = fmt.Errorf("%w: the tenant must be valid UTF-8 without NUL bytes", errBadInput)
	case it.TTL < 0 || it.TTL > maxLease:
		err = fmt.Errorf("%w: TTL %v must be between 0 (none) and %v", errBadInput, it.TTL, maxLease)
	case it.TTL > 0 && it.TTL < time.Microsecond:
		err = fmt.Errorf("%w: TTL %v is below the database's precision of 1µs", errBadInput, it.TTL)
	case it.Timeout != 0 && (it.Timeout < MinTimeout || it.Timeout > MaxTimeout):
		err = fmt.Errorf("%w: Timeout %v must be 0 (the worker's ItemTimeout) or between %v and %v", errBadInput, it.Timeout, MinTimeout, MaxTimeout)
	case len(it.Kind) > MaxKindLength:
		err = fmt.Errorf("%w: the kind is %d bytes, the limit is %d (MaxKindLength)", errBadInput, len(it.Kind), MaxKindLength)
	case !utf8.ValidString(it.Kind) || strings.ContainsRune(it.Kind, 0):
		err = fmt.Errorf("%w: the kind must be valid UTF-8 without NUL bytes", errBadInput)
	case it.Delay < 0:
		err = fmt.Errorf("%w: negative delay %v", errBadInput, it.Delay)
	case it.MaxAttempts < 0:
		err = fmt.Errorf("%w: negative MaxAttempts %d", errBadInput, it.MaxAttempts)
	}
	if err != nil {
		return fmt.Errorf("claim: item %d: %w", i, err)
	}
	return nil
}

// rowBytes estimates the bytes item it takes in a statement or COPY: every
// variable-length column it fills (payload, metadata, key, tenant) and the
// fixed ones (rowOverhead). A column left out here could push one
// statement past CockroachDB's 16 MiB bound on a message: 5,000 keys and
// tenants of MaxKeyLength bytes alone take 20 MB (TestRowBytesCountsEveryVariableField
// checks that every string and byte slice of NewItem counts). UniqueKey is
// not sent (the id derived from it is) but counts all the same: an
// overestimate of at most MaxUniqueKeyLength bytes, on the safe side.
func rowBytes(it *NewItem) int {
	return rowOverhead + len(it.Payload) + len(it.Metadata) + len(it.Key) + len(it.Tenant) + len(it.UniqueKey) + len(it.Kind) + headersBytes(it.Headers) + 16*len(it.After) + prereqsBytes(it.AfterIn)
}

// chunks splits idx (indexes into items) into runs of at most maxRows rows
// and chunkBytes estimated bytes; an item bigger than that on its own (which
// validate prevents) would make a chunk by itself.
func chunks(items []NewItem, idx []int, maxRows int) [][]int {
	var out [][]int
	start, bytes := 0, 0
	for n, i := range idx {
		size := rowBytes(&items[i])
		if n > start && (n-start == maxRows || bytes+size > chunkBytes) {
			out = append(out, idx[start:n])
			start, bytes = n, 0
		}
		bytes += size
	}
	if start < len(idx) {
		out = append(out, idx[start:])
	}
	return out
}

// write writes b through db and records in res which items were added. With
// useCopy (db is then one transaction that has CopyFrom), items with
// generated ids go by COPY when there are enough of them: their ids are
// random, never in the items table nor among the ended ids, so the COPY
// needs no dedup (a retry after an unknown outcome gives those ids back as
// caller-given ids, which go by INSERT and are checked). Caller-given ids
// always go by INSERT … ON CONFLICT DO NOTHING, which needs no lookup of the
// ids already present (a lookup whose cached plan, on PostgreSQL, may scan
// the table when it was made while the table was small).
func (q *Queue) write(ctx context.Context, db crsql.DB, b *batch, useCopy bool, res *Enqueued) error {
	insert := all(len(b.items))
	if c, ok := db.(copier); ok && useCopy && len(b.generated) >= copyMinRows {
		if err := q.copyRows(ctx, db, c, b, b.generated, res); err != nil {
			return err
		}
		insert = b.given
	}
	for _, chunk := range chunks(b.items, insert, insertRows) {
		if err := q.insertRows(ctx, db, b, chunk, res); err != nil {
			return err
		}
	}
	return q.checkFound(ctx, db, b, res)
}

// insertRows adds the items of chunk with one INSERT … ON CONFLICT DO
// NOTHING, and marks those it added in res.
func (q *Queue) insertRows(ctx context.Context, db crsql.DB, b *batch, chunk []int, res *Enqueued) error {
	added, err := q.store.ItemsEnqueue(ctx, db, q.engine.Load().dialect, q.opts.Queue, q.enqueueRows(b, chunk))
	if err != nil {
		return err
	}
	return markAdded(b, chunk, added, res)
}

// pos0 returns item i's place in the batch b was made from (itself if
// none).
func (b *batch) pos0(i int) int {
	if b.pos != nil {
		return b.pos[i]
	}
	return i
}

// order returns item i's sequence order (see orders).
func (b *batch) order(i int) int64 {
	return b.orders + int64(b.pos0(i))
}

// enqueueRows returns the INSERT rows of the items chunk of b.
func (q *Queue) enqueueRows(b *batch, chunk []int) []store.EnqueueRow {
	rows := make([]store.EnqueueRow, len(chunk))
	for j, i := range chunk {
		it := &b.items[i]
		rows[j] = store.EnqueueRow{ID: b.ids[i], Hash: b.hashes[i], Key: it.Key, Priority: it.Priority, Delay: it.Delay,
			MaxAttempts: q.maxAttempts(it), Payload: it.Payload, Metadata: it.Metadata, Tenant: it.Tenant,
			TTL: it.TTL, AtMostOnce: it.AtMostOnce, Order: b.order(i), Headers: b.headers[i], Frees: it.UniqueStates.frees(),
			Timeout: it.Timeout, Kind: it.Kind}
		if b.turns != nil {
			rows[j].Turn = b.turns[i]
		}
	}
	return rows
}

// markAdded marks in res the items of chunk whose ids the INSERT returned
// (added).
func markAdded(b *batch, chunk []int, added []uuid.UUID, res *Enqueued) error {
	at := make(map[uuid.UUID]int, len(chunk))
	for _, i := range chunk {
		at[b.ids[i]] = i
	}
	for _, id := range added {
		i, ok := at[id]
		if !ok {
			return fmt.Errorf("the insert returned id %s, which it was not given", id)
		}
		res.New[i] = true
	}
	return nil
}

// copyRows streams the items idx (whose ids are not in the table) with COPY, in chunks of
// bounded bytes, computing their parts and vesting times from the queue's
// number of parts and the transaction's timestamp, read (under a share
// lock on the queue's row) in the same transaction.
func (q *Queue) copyRows(ctx context.Context, db crsql.DB, c copier, b *batch, idx []int, res *Enqueued) error {
	parts, now, amo, sequenced, err := q.store.ItemsEnqueueParts(ctx, db, q.opts.Queue)
	if err != nil {
		return err
	}
	if parts < 1 {
		return fmt.Errorf("queue %q has %d parts", q.opts.Queue, parts)
	}
	for _, chunk := range chunks(b.items, idx, copyRows) {
		src := copySource{q: q, b: b, idx: chunk, parts: parts, now: now, amo: amo, sequenced: sequenced}
		n, err := q.store.ItemsEnqueueCopy(ctx, c, q.opts.Queue, len(chunk), src.row)
		if err != nil {
			return err
		}
		if n != int64(len(chunk)) {
			return fmt.Errorf("COPY wrote %d rows of %d", n, len(chunk))
		}
	}
	for _, i := range idx {
		res.New[i] = true
	}
	return nil
}

// copySource computes the COPY rows of idx (from the queue's number of
// parts, the transaction's timestamp and whether the queue is
// at-most-once) as the INSERT computes them in SQL.
type copySource struct {
	q     *Queue
	b     *batch
	idx   []int
	parts int64
	now   time.Time
	amo   bool // the queue is at-most-once
	// sequenced: the queue is sequenced (items with a key get a seq_order)
	sequenced bool
}

// row returns the COPY row of item idx[n].
func (s *copySource) row(n int) store.CopyRow {
	i := s.idx[n]
	it := &s.b.items[i]
	// The delay at microsecond precision, as the INSERT computes it.
	vesting := s.now.Add(time.Duration(it.Delay.Microseconds()) * time.Microsecond)
	amo := it.AtMostOnce || s.amo
	maxAttempts := s.q.maxAttempts(it)
	if amo {
		maxAttempts = 1
	}
	turn := vesting
	if s.b.turns != nil && s.b.turns[i] != nil && (it.Delay.Microseconds() == 0 || s.b.turns[i].After(vesting)) {
		turn = *s.b.turns[i]
	}
	var expires time.Time
	if it.TTL > 0 {
		expires = s.now.Add(time.Duration(it.TTL.Microseconds()) * time.Microsecond)
	}
	var order *int64
	if s.sequenced && it.Key != "" {
		o := s.b.order(i)
		order = &o
	}
	return store.CopyRow{ID: s.b.ids[i], Part: s.b.hashes[i] % s.parts, Key: it.Key, Priority: it.Priority,
		VestingAt: vesting, MaxAttempts: maxAttempts, Payload: it.Payload, Metadata: it.Metadata,
		Tenant: it.Tenant, TurnAt: turn, ExpiresAt: expires, AtMostOnce: amo, SeqOrder: order, Headers: s.b.headers[i],
		Timeout: it.Timeout, Kind: it.Kind}
}

// checkFound looks up the caller-given ids that were not added: it fails
// if one belongs to another queue's item, and marks in res.Done those that
// ended in this queue within its dedup window. (Generated ids are random:
// never present.)
func (q *Queue) checkFound(ctx context.Context, db crsql.DB, b *batch, res *Enqueued) error {
	var present []uuid.UUID
	at := map[uuid.UUID]int{}
	for _, i := range b.given {
		if !res.New[i] {
			present = append(present, b.ids[i])
			at[b.ids[i]] = i
		}
	}
	if len(present) == 0 {
		return nil
	}
	found, err := q.store.ItemsEnqueueFound(ctx, db, q.opts.Queue, present)
	if err != nil {
		return err
	}
	for _, f := range found {
		i, ok := at[f.ID]
		switch {
		case !ok:
			return fmt.Errorf("the lookup of present ids returned id %s, which it was not given", f.ID)
		case !f.Ended:
			return fmt.Errorf("item %d: %w: id %s is an item of queue %q", i, ErrIDInOtherQueue, b.ids[i], f.Queue)
		}
		res.Done[i] = true
	}
	return nil
}

func (q *Queue) maxAttempts(it *NewItem) int {
	if it.MaxAttempts == 0 {
		return q.opts.MaxAttempts
	}
	return it.MaxAttempts
}

// PartOf returns the part, among parts, of an item with this key or,
// without a key, of this tenant, as Enqueue computes it. (Items with
// neither are spread round-robin, and so are, by turn, the items without a
// key of a fair queue's tenants that have no limit: see NewItem.Tenant.)
// Workers use it to find the part that holds a limited tenant's items.
func PartOf(key, tenant string, parts int) int {
	if parts < 1 {
		return 0
	}
	return int(int64(keyHash(key, tenant)&math.MaxInt64) % int64(parts))
}

// keyHash hashes the key, or without one, the tenant.
func keyHash(key, tenant string) uint64 {
	h := fnv.New64a()
	if key != "" {
		h.Write([]byte(key))
	} else {
		h.Write([]byte(tenant))
	}
	return h.Sum64()
}
