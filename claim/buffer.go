package claim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults for BufferOptions.
const (
	// DefaultBufferMaxItems bounds the items of one flush.
	DefaultBufferMaxItems = 1000
	// DefaultBufferFlushTimeout bounds one flush.
	DefaultBufferFlushTimeout = time.Minute
)

// ErrBufferClosed is returned by Buffer.Enqueue after Close. Nothing is
// enqueued.
var ErrBufferClosed = errors.New("claim: the buffer is closed")

// BufferOptions configure a Buffer. The zero value is valid.
type BufferOptions struct {
	// MaxItems bounds the items one flush writes. A flush also stops
	// taking items at 8 MiB of payload, metadata and keys (the bound of one
	// enqueue statement), so that it stays one statement or one short
	// transaction. Default DefaultBufferMaxItems (1000).
	MaxItems int
	// MaxWait, if positive, lets a flush wait up to this long after the
	// oldest waiting item arrived for more items, until MaxItems have come.
	// The default, 0, never waits: a flush starts as soon as a flusher is
	// free, and the items that arrive while it runs form the next one
	// (group commit). A lone caller then pays no delay at all; under load
	// batches grow by themselves to what arrives during one flush.
	MaxWait time.Duration
	// Flushers is the number of flushes that may run at once, each on its
	// own connection. Default 1: the next batch accumulates while the
	// flush in flight runs.
	Flushers int
	// FlushTimeout bounds one flush, fallback included. A flush is not
	// bound to any caller's context (a caller that gives up does not
	// cancel the statement that carries the others' items), so it needs a
	// bound of its own. Default DefaultBufferFlushTimeout (1 min).
	FlushTimeout time.Duration
}

// BufferStats counts what a Buffer did since it was created.
type BufferStats struct {
	// Flushes counts the enqueue calls (each one statement or one
	// transaction) the buffer made, fallback calls included.
	Flushes int64
	// Items counts the items those calls committed (added, or found
	// already present).
	Items int64
	// Splits counts group failures that were retried as two halves (see
	// Buffer).
	Splits int64
	// Largest is the largest number of items of one flush.
	Largest int64
	// Waiting is the number of items waiting for a flush now.
	Waiting int64
}

// Buffer enqueues items of many concurrent callers with shared statements:
// group commit for producers. Each Enqueue call waits for the flush that
// carries its item and is told only what committed.
//
// Flushes run on goroutines of the buffer (Options.Flushers of them,
// default 1). A flush takes every item that arrived since the last one
// took its items (at most MaxItems and 8 MiB) and writes them as one
// Queue.Enqueue call does, through the same code: one INSERT … ON CONFLICT
// DO NOTHING statement, or one transaction (COPY for many generated ids;
// several statements for caller-given ids; items with prerequisites,
// NewItem.After, added as waiting items). Every option of NewItem means what
// it means to Enqueue. While it runs, new items wait for the next flush, so
// batches are as large as the arrival rate times the flush's latency, and
// a lone caller's item is written at once.
//
// Each caller's item is validated by Enqueue before it joins a batch (an
// item Queue.Enqueue would refuse is refused to its caller alone) and gets
// its id then (NewItem.ID, or a generated one), so that the flush's rows
// are fixed across its retries. Outcomes per caller:
//
//   - the flush committed: the item's id, whether it was new, and if not,
//     whether it had already ended (see Enqueued);
//   - the flush's outcome is unknown (ErrOutcomeUnknown): every caller of
//     that flush gets an error wrapping ErrOutcomeUnknown and its item's id;
//     enqueueing again with NewItem.ID set to it is idempotent;
//   - the flush failed before reaching the database or because the
//     database refused service (a connection failure, the server shutting
//     down, the flush timing out before anything was sent): nothing of it
//     committed, and every caller gets that error;
//   - the flush failed otherwise (the server refused a statement: for
//     example one item's caller-given id belongs to another queue; or an
//     item's prerequisites were refused: ErrPrerequisiteUnknown,
//     ErrPrerequisiteDied, ErrPrerequisiteOtherQueue, ErrNoDedupWindow): the
//     batch is split into halves, each flushed again, down to single items,
//     so that only the items at fault fail (a bad item among n costs about
//     2·log2(n) statements);
//   - the caller's context ends first: if its item had not yet been taken
//     by a flush, it is withdrawn and the context's error returned (nothing
//     enqueued); if it was in a flush in flight, the error wraps
//     ErrOutcomeUnknown and comes with the id. Either way, the flush goes on
//     for the other callers.
//
// Two waiting items with the same caller-given id never share a flush (the
// second waits for the next one, which finds it present). An item's
// prerequisites must exist when its flush runs, as for Enqueue: items of
// earlier flushes, or items of the same flush that came before it (a
// producer that waits for Enqueue's answer before it enqueues the
// dependent is always in order). A Buffer is safe for concurrent use; Close
// it to stop its flushers.
type Buffer struct {
	q    *Queue
	opts BufferOptions

	mu      sync.Mutex
	pending []*bufRequest
	closed  bool
	wake    chan struct{} // a flusher may have work (capacity 1)
	done    sync.WaitGroup

	flushes, items, splits, largest, waiting atomic.Int64
}

// bufRequest is one caller's item.
type bufRequest struct {
	item    NewItem
	id      uuid.UUID
	hash    int64
	headers []byte    // the item's headers as JSON (nil: none)
	given   bool      // the caller chose the id
	arrived time.Time // when Enqueue queued it
	state   int       // reqPending, reqInFlight or reqWithdrawn; under Buffer.mu
	result  chan bufResult
}

const (
	reqPending = iota
	reqInFlight
	reqWithdrawn
)

type bufResult struct {
	isNew, done bool
	waiting     bool // added as a waiting item (NewItem.After)
	err         error
}

// NewBuffer returns a Buffer that enqueues into q, and starts its flushers.
func NewBuffer(q *Queue, opts BufferOptions) (*Buffer, error) {
	if q == nil {
		return nil, errors.New("claim: NewBuffer: nil queue")
	}
	if opts.MaxItems == 0 {
		opts.MaxItems = DefaultBufferMaxItems
	}
	if opts.Flushers == 0 {
		opts.Flushers = 1
	}
	if opts.FlushTimeout == 0 {
		opts.FlushTimeout = DefaultBufferFlushTimeout
	}
	switch {
	case opts.MaxItems < 1 || opts.MaxItems > insertRows:
		return nil, fmt.Errorf("claim: BufferOptions.MaxItems %d must be between 1 and %d", opts.MaxItems, insertRows)
	case opts.MaxWait < 0:
		return nil, fmt.Errorf("claim: BufferOptions.MaxWait %v is negative", opts.MaxWait)
	case opts.Flushers < 1:
		return nil, fmt.Errorf("claim: BufferOptions.Flushers %d must be at least 1", opts.Flushers)
	case opts.FlushTimeout < 0:
		return nil, fmt.Errorf("claim: BufferOptions.FlushTimeout %v is negative", opts.FlushTimeout)
	}
	b := &Buffer{q: q, opts: opts, wake: make(chan struct{}, 1)}
	b.done.Add(opts.Flushers)
	for range opts.Flushers {
		go b.flusher()
	}
	return b, nil
}

// Enqueue adds item to the queue, sharing a statement with the items of
// other callers that wait at the same time, and reports what happened to
// it as Queue.Enqueue does for one item (see Enqueued): its id, whether
// this call added it, and if not, whether its id had already ended in the
// queue within the dedup window (Done) or is still queued; for an item with
// prerequisites (NewItem.After), whether it was added as a waiting item
// (Waiting, nil otherwise, as from Enqueue). See Buffer for
// the outcomes: on an error wrapping ErrOutcomeUnknown, only the id is set
// (enqueue the item again with NewItem.ID set to it to make sure: within
// the queue's dedup window that adds nothing that was already added, even
// if a worker already acked it); on any other error nothing was enqueued
// and the Enqueued is zero.
func (b *Buffer) Enqueue(ctx context.Context, item NewItem) (Enqueued, error) {
	return b.q.hooked(ctx, []NewItem{item}, func(ctx context.Context, items []NewItem) (Enqueued, error) {
		return b.enqueueOne(ctx, items[0])
	})
}

// enqueueOne is Enqueue without the queue's Hooks.
func (b *Buffer) enqueueOne(ctx context.Context, item NewItem) (Enqueued, error) {
	id, res, err := b.enqueue(ctx, item)
	switch {
	case err == nil:
		e := Enqueued{IDs: []uuid.UUID{id}, New: []bool{res.isNew}, Done: []bool{res.done}}
		if item.hasPrereqs() {
			e.Waiting = []bool{res.waiting} // as Enqueue: nil without After
		}
		return e, nil
	case id != uuid.UUID{}:
		return Enqueued{IDs: []uuid.UUID{id}}, err
	}
	return Enqueued{}, err
}

func (b *Buffer) enqueue(ctx context.Context, item NewItem) (uuid.UUID, bufResult, error) {
	if err := ctx.Err(); err != nil {
		return uuid.UUID{}, bufResult{}, fmt.Errorf("claim: buffered enqueue: %w", err)
	}
	pb, err := b.q.prepare([]NewItem{item})
	if err != nil {
		return uuid.UUID{}, bufResult{}, err
	}
	r := &bufRequest{item: item, id: pb.ids[0], hash: pb.hashes[0], headers: pb.headers[0], given: len(pb.given) == 1,
		arrived: time.Now(), result: make(chan bufResult, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return uuid.UUID{}, bufResult{}, ErrBufferClosed
	}
	b.pending = append(b.pending, r)
	b.waiting.Add(1)
	b.mu.Unlock()
	b.signal()

	select {
	case res := <-r.result:
		return b.answer(r, res)
	case <-ctx.Done():
	}
	b.mu.Lock()
	state := r.state
	if state == reqPending {
		r.state = reqWithdrawn
		b.waiting.Add(-1)
	}
	b.mu.Unlock()
	select {
	case res := <-r.result: // answered meanwhile: the truth beats a guess
		return b.answer(r, res)
	default:
	}
	if state == reqPending {
		return uuid.UUID{}, bufResult{}, fmt.Errorf("claim: buffered enqueue: withdrawn before its flush: %w", ctx.Err())
	}
	return r.id, bufResult{}, fmt.Errorf("claim: buffered enqueue of item %s: the caller gave up while its flush was in flight: %w: %w",
		r.id, ErrOutcomeUnknown, ctx.Err())
}

// answer turns a flush's result into Enqueue's.
func (b *Buffer) answer(r *bufRequest, res bufResult) (uuid.UUID, bufResult, error) {
	switch {
	case res.err == nil:
		return r.id, res, nil
	case errors.Is(res.err, ErrOutcomeUnknown):
		return r.id, bufResult{}, fmt.Errorf("claim: buffered enqueue of item %s: %w", r.id, res.err)
	default:
		return uuid.UUID{}, bufResult{}, fmt.Errorf("claim: buffered enqueue: %w", res.err)
	}
}

// signal wakes a flusher, if none is already about to wake.
func (b *Buffer) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Close stops the buffer: Enqueue calls that come after it fail with
// ErrBufferClosed, the items already waiting are flushed, and Close returns
// when every flush has finished (each caller has its answer), or with
// ctx's error when ctx ends first (the flushes go on and answer their
// callers). Closing twice is allowed.
func (b *Buffer) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.signal()
	finished := make(chan struct{})
	go func() {
		b.done.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("claim: closing the buffer: %w", ctx.Err())
	}
}

// Stats returns a snapshot of the buffer's counters.
func (b *Buffer) Stats() BufferStats {
	return BufferStats{Flushes: b.flushes.Load(), Items: b.items.Load(), Splits: b.splits.Load(), Largest: b.largest.Load(), Waiting: b.waiting.Load()}
}

// flusher takes batches and flushes them until the buffer is closed and
// nothing waits.
func (b *Buffer) flusher() {
	defer b.done.Done()
	var linger *time.Timer
	for {
		batch, wait, stop := b.take()
		if stop {
			b.signal() // let the other flushers see it too
			return
		}
		if batch == nil {
			if wait > 0 {
				if linger == nil {
					linger = time.NewTimer(wait)
				} else {
					linger.Reset(wait)
				}
				select {
				case <-b.wake:
				case <-linger.C:
				}
				linger.Stop()
			} else {
				<-b.wake
			}
			continue
		}
		b.mu.Lock()
		more := len(b.pending) > 0
		b.mu.Unlock()
		if more {
			b.signal() // another flusher may take them now
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opts.FlushTimeout)
		b.flush(ctx, batch)
		cancel()
	}
}

// take returns the next batch, marked in flight; or, when none is due, how
// long to wait at most before looking again (0: until woken); or stop once
// the buffer is closed and empty.
func (b *Buffer) take() (batch []*bufRequest, wait time.Duration, stop bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Drop withdrawn requests from the front.
	live := b.pending[:0]
	for _, r := range b.pending {
		if r.state == reqPending {
			live = append(live, r)
		}
	}
	clear(b.pending[len(live):])
	b.pending = live
	if len(b.pending) == 0 {
		return nil, 0, b.closed
	}
	if b.opts.MaxWait > 0 && !b.closed && len(b.pending) < b.opts.MaxItems {
		if left := b.opts.MaxWait - time.Since(b.pending[0].arrived); left > 0 {
			return nil, left, false
		}
	}
	var ids map[uuid.UUID]bool
	bytes := 0
	rest := b.pending[:0]
	for _, r := range b.pending {
		size := rowBytes(&r.item)
		full := len(batch) == b.opts.MaxItems || (len(batch) > 0 && bytes+size > chunkBytes)
		if !full && r.given {
			if ids == nil {
				ids = make(map[uuid.UUID]bool)
			}
			full = ids[r.id] // the same id waits for the next flush
			ids[r.id] = true
		}
		if full {
			rest = append(rest, r)
			continue
		}
		r.state = reqInFlight
		b.waiting.Add(-1)
		batch = append(batch, r)
		bytes += size
	}
	clear(b.pending[len(rest):])
	b.pending = rest
	return batch, 0, false
}

// flush writes reqs with one enqueue call and answers its callers,
// splitting it on a failure that may be one item's fault.
func (b *Buffer) flush(ctx context.Context, reqs []*bufRequest) {
	res, err := b.write(ctx, reqs)
	if err != nil && len(reqs) > 1 && itemsMayBeAtFault(err) {
		b.splits.Add(1)
		half := len(reqs) / 2
		b.flush(ctx, reqs[:half])
		b.flush(ctx, reqs[half:])
		return
	}
	for i, r := range reqs {
		if err != nil {
			r.result <- bufResult{err: err}
		} else {
			r.result <- bufResult{isNew: res.New[i], done: res.Done[i], waiting: res.Waiting != nil && res.Waiting[i]}
		}
	}
}

// write enqueues the items of reqs, with their fixed ids and hashes,
// through the write path Enqueue takes (Queue.enqueueBatch): every option
// of NewItem means the same through both (After included: items with
// prerequisites make the flush one transaction that adds them as waiting
// items). The flush's items take their sequence orders (a sequenced
// queue's order among items that share an enqueue time) in the order they
// arrived.
func (b *Buffer) write(ctx context.Context, reqs []*bufRequest) (Enqueued, error) {
	b.flushes.Add(1)
	n := len(reqs)
	eb := &batch{items: make([]NewItem, n), ids: make([]uuid.UUID, n), hashes: make([]int64, n), headers: make([][]byte, n),
		orders: sequenceOrders.Add(int64(n)) - int64(n)}
	for i, r := range reqs {
		eb.items[i], eb.ids[i], eb.hashes[i], eb.headers[i] = r.item, r.id, r.hash, r.headers
		if r.given {
			eb.given = append(eb.given, i)
		} else {
			// A random version 4 id, never in the table: COPY may write it.
			eb.generated = append(eb.generated, i)
		}
		if r.item.hasPrereqs() {
			// Each item's prerequisites were checked alone by Enqueue
			// (prepare); an item of the flush that names a later one
			// of it fails alone (ErrPrerequisiteUnknown, split off).
			eb.deps = true
		}
	}
	res, err := b.q.enqueueBatch(ctx, eb)
	if err == nil {
		b.items.Add(int64(n))
		for l := b.largest.Load(); int64(n) > l && !b.largest.CompareAndSwap(l, int64(n)); l = b.largest.Load() {
		}
	}
	return res, err
}

// itemsMayBeAtFault reports whether a failed flush may have failed because
// of some of its items, so that smaller flushes may succeed: the server
// refused a statement (ErrIDInOtherQueue, a data or constraint error), or
// the write refused some items' prerequisites (ErrPrerequisiteUnknown,
// ErrPrerequisiteDied, ErrPrerequisiteOtherQueue, ErrNoDedupWindow).
// Unknown outcomes are never split (the items may be in the table), nor are
// failures that would fail any flush: nothing answered (the connection, the
// pool, the flush's deadline), or the server refused service (connection
// and resource classes, an operator shutting it down, a missing schema).
func itemsMayBeAtFault(err error) bool {
	if errors.Is(err, ErrOutcomeUnknown) {
		return false
	}
	if errors.Is(err, ErrIDInOtherQueue) || errors.Is(err, ErrPrerequisiteUnknown) || errors.Is(err, ErrPrerequisiteDied) ||
		errors.Is(err, ErrPrerequisiteOtherQueue) || errors.Is(err, ErrNoDedupWindow) {
		// Refusals of some items' ids or prerequisites (ErrNoDedupWindow
		// refuses only the items with prerequisites): the others go on.
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "28", "3D", "3F", "40", "42", "53", "57", "58", "XX":
		// Connection, authorization, missing database or schema,
		// retries used up, undefined tables, resources, operator
		// intervention, system and internal errors.
		return false
	}
	return true
}
