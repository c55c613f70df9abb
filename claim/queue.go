package claim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults for Options.
const (
	DefaultQueue       = "default"
	DefaultMaxAttempts = 25
	DefaultMaxPayload  = 1 << 20
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Hour
)

// enqueueChunk bounds the rows of one INSERT (8 parameters each, far below
// the protocol's 65535).
const enqueueChunk = 500

var (
	// ErrClaimLost is returned by Ack, AckBatch, Nack and Release when the
	// item is no longer claimed by this claim: the session was deleted, the
	// part was given up, or the item was acked, released or cancelled. The
	// transaction was rolled back; nothing was recorded.
	ErrClaimLost = errors.New("claim lost: the item is no longer claimed by this session")
	// ErrNotOwner is returned by Claim and ClaimParts when the session (or
	// one of the parts) no longer exists in the database.
	ErrNotOwner = errors.New("session or part no longer exists")
	// ErrPayloadTooLarge is returned by Enqueue for a payload or metadata over
	// Options.MaxPayload. Nothing is enqueued.
	ErrPayloadTooLarge = errors.New("payload too large")
)

// DB is a connection pool: *pgxpool.Pool satisfies it.
type DB interface {
	crsql.DB
	retry.Beginner
}

// Options configure a Queue. The zero value is valid.
type Options struct {
	// Queue is the queue's name. Default "default".
	Queue string
	// Tables names the crdbwork tables.
	Tables crsql.Tables
	// MaxAttempts is the number of attempts of an enqueued item that does
	// not set its own. Default 25.
	MaxAttempts int
	// MaxPayload bounds the size in bytes of an item's payload and of its
	// metadata. Default 1 MiB.
	MaxPayload int
	// BackoffBase and BackoffMax shape the delay before a failed item runs
	// again: BackoffBase·2^(attempt-1), capped at BackoffMax, with jitter.
	// Defaults 1 s and 1 h.
	BackoffBase, BackoffMax time.Duration
}

// Queue enqueues, claims and acknowledges the items of one queue.
// It is safe for concurrent use.
type Queue struct {
	db    DB
	st    *crsql.Statements
	opts  Options
	next  atomic.Uint64 // round-robin hash for items without a key
	stats counters
}

// New returns a Queue on db. It does no I/O; a missing schema is reported by
// the first call that needs it (wrapping crsql.ErrSchemaMissing).
func New(db DB, opts Options) (*Queue, error) {
	if opts.Queue == "" {
		opts.Queue = DefaultQueue
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = DefaultMaxPayload
	}
	if opts.BackoffBase == 0 {
		opts.BackoffBase = DefaultBackoffBase
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	switch {
	case db == nil:
		return nil, errors.New("claim: nil database")
	case opts.MaxAttempts < 1:
		return nil, fmt.Errorf("claim: MaxAttempts %d must be at least 1", opts.MaxAttempts)
	case opts.MaxPayload < 0:
		return nil, fmt.Errorf("claim: MaxPayload %d is negative", opts.MaxPayload)
	case opts.BackoffBase < 0 || opts.BackoffMax < opts.BackoffBase:
		return nil, fmt.Errorf("claim: backoff base %v and max %v must satisfy 0 <= base <= max", opts.BackoffBase, opts.BackoffMax)
	}
	if err := opts.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	q := &Queue{db: db, st: crsql.NewStatements(opts.Tables), opts: opts}
	q.next.Store(rand.Uint64())
	return q, nil
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.opts.Queue }

// NewItem is an item to enqueue. Only Payload is required.
type NewItem struct {
	// Payload is the item's data, at most Options.MaxPayload bytes.
	Payload []byte
	// Metadata is optional data kept beside the payload (headers, tracing).
	Metadata []byte
	// Key, if set, fixes the item's part: items with the same key land in
	// the same part, so parts mode handles them in order of priority and
	// vesting time. Without a key, items are spread evenly over the parts.
	Key string
	// Priority orders claims: lower values are claimed first. Default 0.
	Priority int
	// Delay postpones the item: it becomes claimable this long after the
	// enqueue, by the database clock.
	Delay time.Duration
	// MaxAttempts overrides Options.MaxAttempts for this item.
	MaxAttempts int
}

// Enqueue adds items to the queue atomically (all or none) and returns their
// ids in order.
func (q *Queue) Enqueue(ctx context.Context, items ...NewItem) ([]uuid.UUID, error) {
	if len(items) <= enqueueChunk {
		var ids []uuid.UUID
		err := retry.Do(ctx, q.stats.retried("enqueue"), func(ctx context.Context) error {
			var err error
			ids, err = q.EnqueueTx(ctx, q.db, items...)
			return err
		})
		return ids, err
	}
	var ids []uuid.UUID
	err := retry.Tx(ctx, q.db, q.stats.retried("enqueue"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		ids, err = q.EnqueueTx(ctx, tx, items...)
		return err
	})
	return ids, err
}

// EnqueueTx adds items through db, typically the caller's own transaction, so
// that the items exist if and only if that transaction commits. It does not
// retry: retrying the caller's transaction is the caller's business.
func (q *Queue) EnqueueTx(ctx context.Context, db crsql.DB, items ...NewItem) ([]uuid.UUID, error) {
	if len(items) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(items))
	args := make([]any, 0, 1+crsql.EnqueueParams*min(len(items), enqueueChunk))
	for i := range items {
		if err := q.validate(i, &items[i]); err != nil {
			return nil, err
		}
	}
	for start := 0; start < len(items); start += enqueueChunk {
		chunk := items[start:min(start+enqueueChunk, len(items))]
		args = append(args[:0], q.opts.Queue)
		for i, it := range chunk {
			id, err := uuid.NewRandom()
			if err != nil {
				return nil, fmt.Errorf("claim: generating item id: %w", err)
			}
			ids[start+i] = id
			var key *string
			var hash uint64
			if it.Key != "" {
				key = &it.Key
				h := fnv.New64a()
				h.Write([]byte(it.Key))
				hash = h.Sum64()
			} else {
				hash = q.next.Add(1)
			}
			payload := it.Payload
			if payload == nil {
				payload = []byte{}
			}
			maxAttempts := it.MaxAttempts
			if maxAttempts == 0 {
				maxAttempts = q.opts.MaxAttempts
			}
			args = append(args, id, int64(hash&math.MaxInt64), key, int64(it.Priority),
				it.Delay.Microseconds(), int64(maxAttempts), payload, it.Metadata)
		}
		if _, err := db.Exec(ctx, q.st.EnqueueRows(len(chunk)), args...); err != nil {
			return nil, fmt.Errorf("claim: enqueueing %d items into %q: %w", len(chunk), q.opts.Queue, crsql.Classify(err))
		}
	}
	q.stats.enqueued.Add(int64(len(items)))
	return ids, nil
}

func (q *Queue) validate(i int, it *NewItem) error {
	switch {
	case len(it.Payload) > q.opts.MaxPayload:
		return fmt.Errorf("claim: item %d: %w: %d bytes, the limit is %d (Options.MaxPayload); store large data elsewhere and enqueue a reference",
			i, ErrPayloadTooLarge, len(it.Payload), q.opts.MaxPayload)
	case len(it.Metadata) > q.opts.MaxPayload:
		return fmt.Errorf("claim: item %d: %w: metadata is %d bytes, the limit is %d (Options.MaxPayload)",
			i, ErrPayloadTooLarge, len(it.Metadata), q.opts.MaxPayload)
	case it.Delay < 0:
		return fmt.Errorf("claim: item %d: negative delay %v", i, it.Delay)
	case it.MaxAttempts < 0:
		return fmt.Errorf("claim: item %d: negative MaxAttempts %d", i, it.MaxAttempts)
	}
	return nil
}

// Item is a claimed item. Keep it as returned: Ack, Nack and Release use its
// claim fields to prove the claim is still this one.
type Item struct {
	ID          uuid.UUID // as returned by Enqueue
	Queue       string
	Part        int    // fixed at enqueue (from Key, if set); moved only by partition.SetParts
	Key         string // "" if none
	Priority    int    // lower values are claimed first
	Attempt     int    // 1 on the first claim; counts claims, including ones lost to a crash
	MaxAttempts int    // after this many attempts, Nack moves the item to the dead-items table
	Payload     []byte
	Metadata    []byte
	EnqueuedAt  time.Time // by the database clock
	VestingAt   time.Time // when the item last became claimable, by the database clock
	LastError   string    // the error of the previous attempt, if any

	// Session is the session that holds the claim.
	Session uuid.UUID
	// InPart reports a parts-mode claim: the claim names the part too, and
	// giving up the part releases it.
	InPart bool
}

// Claim claims up to n vested, unclaimed items of the queue for session, in
// one statement, lowest priority value first, then earliest vesting time.
// Any session may claim any item (no parts). Concurrent claimers never get
// the same item: rows locked by one claimer are skipped by the others.
func (q *Queue) Claim(ctx context.Context, session uuid.UUID, n int) ([]Item, error) {
	return q.claim(ctx, q.st.ClaimAny, session, n)
}

// ClaimParts is Claim restricted to the given parts, which session must own
// (rows in the session-parts table). The claims name the part, so they are
// released when the session gives the part up. If a part is no longer owned,
// it returns an error wrapping ErrNotOwner and claims nothing.
func (q *Queue) ClaimParts(ctx context.Context, session uuid.UUID, parts []int, n int) ([]Item, error) {
	if len(parts) == 0 {
		return nil, nil
	}
	ps := make([]int64, len(parts))
	for i, p := range parts {
		ps[i] = int64(p)
	}
	return q.claim(ctx, q.st.ClaimParts, session, n, ps)
}

func (q *Queue) claim(ctx context.Context, stmt string, session uuid.UUID, n int, extra ...any) ([]Item, error) {
	if n <= 0 {
		return nil, nil
	}
	args := append([]any{session, q.opts.Queue, n}, extra...)
	var items []Item
	err := retry.Do(ctx, q.stats.retried("claim"), func(ctx context.Context) error {
		rows, err := q.db.Query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		items, err = scanItems(rows, session)
		return err
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return nil, fmt.Errorf("claim: claiming in %q for session %s: %w (%v)", q.opts.Queue, session, ErrNotOwner, pgErr.Message)
		}
		return nil, fmt.Errorf("claim: claiming in %q for session %s: %w", q.opts.Queue, session, crsql.Classify(err))
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Priority != items[j].Priority {
			return items[i].Priority < items[j].Priority
		}
		return items[i].VestingAt.Before(items[j].VestingAt)
	})
	q.stats.claimed.Add(int64(len(items)))
	return items, nil
}

func scanItems(rows pgx.Rows, session uuid.UUID) ([]Item, error) {
	defer rows.Close()
	var items []Item
	for rows.Next() {
		var it Item
		var part, prio, attempts, maxAttempts int64
		var key, lastErr *string
		var claimPart *int64
		if err := rows.Scan(&it.ID, &it.Queue, &part, &key, &prio, &attempts, &maxAttempts,
			&it.Payload, &it.Metadata, &it.EnqueuedAt, &it.VestingAt, &lastErr, &claimPart); err != nil {
			return nil, err
		}
		it.Part, it.Priority, it.Attempt, it.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
		if key != nil {
			it.Key = *key
		}
		if lastErr != nil {
			it.LastError = *lastErr
		}
		it.Session, it.InPart = session, claimPart != nil
		items = append(items, it)
	}
	return items, rows.Err()
}

// ackArgs returns the statement and arguments that delete it only if its
// claim is still this claim.
func (q *Queue) ackArgs(it Item) (string, []any) {
	if it.InPart {
		return q.st.AckPart, []any{it.ID, it.Session, int64(it.Attempt), int64(it.Part)}
	}
	return q.st.AckAny, []any{it.ID, it.Session, int64(it.Attempt)}
}

// Ack acknowledges it exactly once. In one serializable transaction it
// deletes the item, only if the claim is still it's claim, and then calls
// record (if not nil) to write the result in the same transaction. The
// transaction is retried whole on serialization failures, so record may run
// more than once; only one run's writes commit.
//
// Ack returns nil only if the transaction committed. If the claim was lost,
// it returns an error wrapping ErrClaimLost and nothing was written. If
// record fails, its error is returned and nothing was written. If the
// connection failed during COMMIT, the error wraps retry.ErrCommitUnknown
// (the item stays claimed or is gone; it is never reported as acked).
func (q *Queue) Ack(ctx context.Context, it Item, record func(ctx context.Context, tx pgx.Tx) error) error {
	stmt, args := q.ackArgs(it)
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, stmt, args...)
		if err != nil {
			return crsql.Classify(err)
		}
		if tag.RowsAffected() == 0 {
			return ErrClaimLost
		}
		if record != nil {
			return record(ctx, tx)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrClaimLost) {
			q.stats.lost.Add(1)
		}
		return fmt.Errorf("claim: ack of item %s: %w", it.ID, err)
	}
	q.stats.acked.Add(1)
	return nil
}

// AckBatch acknowledges many items in one serializable transaction. Each
// item is deleted only if its claim still holds; record (if not nil) is then
// called once with the items whose delete succeeded, in the same
// transaction. It returns those items, only after COMMIT succeeded; the
// others lost their claims and are left alone. On error nothing was acked.
func (q *Queue) AckBatch(ctx context.Context, items []Item, record func(ctx context.Context, tx pgx.Tx, acked []Item) error) ([]Item, error) {
	if len(items) == 0 {
		return nil, nil
	}
	var acked []Item
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		deleted, err := q.deleteClaimed(ctx, tx, items)
		if err != nil {
			return err
		}
		acked = acked[:0]
		for i, it := range items {
			if deleted[i] {
				acked = append(acked, it)
			}
		}
		if record != nil && len(acked) > 0 {
			return record(ctx, tx, acked)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("claim: batch ack of %d items: %w", len(items), err)
	}
	q.stats.acked.Add(int64(len(acked)))
	q.stats.lost.Add(int64(len(items) - len(acked)))
	return acked, nil
}

// AckRequest is one item for AckEach with the function that records its
// result (nil: nothing to record).
type AckRequest struct {
	Item   Item
	Record func(ctx context.Context, tx pgx.Tx) error
}

// AckEach acknowledges many items, each with its own record function, as if
// by one Ack each, but in one transaction when it can. It first runs them all
// in one serializable transaction: each item deleted only if its claim still
// holds, then its record called, in order. If a record fails, that
// transaction is rolled back and every item is acked on its own with Ack, so
// one failing record holds back no other item. A worker uses it to commit
// the results of several handlers together (group commit).
//
// errs[i] is what Ack would have returned for reqs[i]: nil only if a
// committed transaction deleted the item and wrote its record; an error
// wrapping ErrClaimLost if the claim was gone (nothing of it was written);
// the record's error; or an error wrapping retry.ErrCommitUnknown for every
// item of a transaction whose COMMIT had an unknown outcome.
func (q *Queue) AckEach(ctx context.Context, reqs []AckRequest) (errs []error) {
	errs = make([]error, len(reqs))
	switch len(reqs) {
	case 0:
		return errs
	case 1:
		errs[0] = q.Ack(ctx, reqs[0].Item, reqs[0].Record)
		return errs
	}
	items := make([]Item, len(reqs))
	for i, r := range reqs {
		items[i] = r.Item
	}
	var deleted []bool
	err := retry.Tx(ctx, q.db, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if deleted, err = q.deleteClaimed(ctx, tx, items); err != nil {
			return err
		}
		for i, r := range reqs {
			if deleted[i] && r.Record != nil {
				if err := r.Record(ctx, tx); err != nil {
					return recordError{err}
				}
			}
		}
		return nil
	})
	var recErr recordError
	switch {
	case err == nil:
		for i, it := range items {
			if deleted[i] {
				q.stats.acked.Add(1)
			} else {
				q.stats.lost.Add(1)
				errs[i] = fmt.Errorf("claim: ack of item %s: %w", it.ID, ErrClaimLost)
			}
		}
	case errors.As(err, &recErr):
		// Find out whose record failed by acking each on its own.
		for i, r := range reqs {
			errs[i] = q.Ack(ctx, r.Item, r.Record)
		}
	default:
		for i, it := range items {
			errs[i] = fmt.Errorf("claim: ack of item %s (in a batch of %d): %w", it.ID, len(items), err)
		}
	}
	return errs
}

// recordError marks the error of a caller's record function inside AckEach's
// transaction. It unwraps, so that a retryable error still retries it.
type recordError struct{ err error }

func (e recordError) Error() string { return e.err.Error() }
func (e recordError) Unwrap() error { return e.err }

// deleteClaimed deletes each item whose claim still holds, in one round trip,
// and reports which were deleted.
func (q *Queue) deleteClaimed(ctx context.Context, tx pgx.Tx, items []Item) ([]bool, error) {
	b := &pgx.Batch{}
	for _, it := range items {
		stmt, args := q.ackArgs(it)
		b.Queue(stmt, args...)
	}
	br := tx.SendBatch(ctx, b)
	deleted := make([]bool, len(items))
	for i := range items {
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return nil, crsql.Classify(err)
		}
		deleted[i] = tag.RowsAffected() == 1
	}
	return deleted, br.Close()
}

// Outcome says what Nack did with an item.
type Outcome int

// Outcomes of Nack.
const (
	// Retried: the item was released and will vest again after a backoff.
	Retried Outcome = iota
	// Dead: the item was moved to the dead-items table.
	Dead
)

// Nack reports that handling it failed with cause. The item is released with
// its attempt counted and becomes claimable again after an exponential
// backoff with jitter (or the delay of a RetryAfter error); when it has used
// its attempts, or cause is Permanent, it is moved to the dead-items table
// with cause as its last error. The claim is checked as in Ack.
func (q *Queue) Nack(ctx context.Context, it Item, cause error) (Outcome, error) {
	msg := "unknown error"
	if cause != nil {
		msg = cause.Error()
	}
	if it.Attempt >= it.MaxAttempts || IsPermanent(cause) {
		err := retry.Do(ctx, q.stats.retried("nack"), func(ctx context.Context) error {
			var id uuid.UUID
			err := q.db.QueryRow(ctx, q.st.DeadLetter, it.ID, it.Session, int64(it.Attempt), msg).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrClaimLost
			}
			return crsql.Classify(err)
		})
		if err != nil {
			return Dead, q.claimErr("dead-lettering", it, err)
		}
		q.stats.dead.Add(1)
		return Dead, nil
	}
	delay := q.Backoff(it.Attempt)
	if d, ok := retryAfter(cause); ok {
		delay = d
	}
	err := q.update(ctx, "nack", q.st.Nack, it.ID, it.Session, int64(it.Attempt), delay.Microseconds(), msg)
	if err != nil {
		return Retried, q.claimErr("nacking", it, err)
	}
	q.stats.nacked.Add(1)
	return Retried, nil
}

// Release gives the item back without counting the attempt, for example when
// a worker shuts down before handling it. The claim is checked as in Ack.
func (q *Queue) Release(ctx context.Context, it Item) error {
	if err := q.update(ctx, "release", q.st.Release, it.ID, it.Session, int64(it.Attempt)); err != nil {
		return q.claimErr("releasing", it, err)
	}
	q.stats.released.Add(1)
	return nil
}

// update runs a claim-checked single-row statement.
func (q *Queue) update(ctx context.Context, kind, stmt string, args ...any) error {
	return retry.Do(ctx, q.stats.retried(kind), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, stmt, args...)
		if err != nil {
			return crsql.Classify(err)
		}
		if tag.RowsAffected() == 0 {
			return ErrClaimLost
		}
		return nil
	})
}

func (q *Queue) claimErr(what string, it Item, err error) error {
	if errors.Is(err, ErrClaimLost) {
		q.stats.lost.Add(1)
	}
	return fmt.Errorf("claim: %s item %s: %w", what, it.ID, err)
}

// Backoff returns the delay before attempt+1 of a failed item:
// BackoffBase·2^(attempt-1) capped at BackoffMax, with "equal jitter" (a
// random value between half and all of it).
func (q *Queue) Backoff(attempt int) time.Duration {
	d := q.opts.BackoffMax
	if attempt < 1 {
		attempt = 1
	}
	if shift := attempt - 1; shift < 62 && q.opts.BackoffBase <= q.opts.BackoffMax>>shift {
		d = q.opts.BackoffBase << shift
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Cancel deletes an item of this queue whether or not it is claimed, and
// reports whether it existed. A claimed item's pending ack then fails with
// ErrClaimLost.
func (q *Queue) Cancel(ctx context.Context, id uuid.UUID) (bool, error) {
	var n int64
	err := retry.Do(ctx, q.stats.retried("cancel"), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, q.st.Cancel, id, q.opts.Queue)
		n = tag.RowsAffected()
		return crsql.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: cancelling item %s: %w", id, err)
	}
	return n == 1, nil
}

// DeadItem is an item that was moved to the dead-items table: it used up its
// attempts or failed with a Permanent error.
type DeadItem struct {
	ID          uuid.UUID
	Queue       string
	Part        int
	Key         string
	Priority    int
	Attempts    int // attempts made, the last one included
	MaxAttempts int
	Payload     []byte
	Metadata    []byte
	LastError   string // the error of the last attempt
	EnqueuedAt  time.Time
	DiedAt      time.Time
}

// Dead returns up to limit dead items of this queue, the most recent first.
func (q *Queue) Dead(ctx context.Context, limit int) ([]DeadItem, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim: listing dead items of %q: limit %d must be positive", q.opts.Queue, limit)
	}
	var out []DeadItem
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		out = out[:0]
		rows, err := q.db.Query(ctx, q.st.DeadItems, q.opts.Queue, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			d := DeadItem{Queue: q.opts.Queue}
			var key, lastErr *string
			var part, prio, attempts, maxAttempts int64
			if err := rows.Scan(&d.ID, &part, &key, &prio, &attempts, &maxAttempts, &d.Payload, &d.Metadata,
				&lastErr, &d.EnqueuedAt, &d.DiedAt); err != nil {
				return err
			}
			d.Part, d.Priority, d.Attempts, d.MaxAttempts = int(part), int(prio), int(attempts), int(maxAttempts)
			if key != nil {
				d.Key = *key
			}
			if lastErr != nil {
				d.LastError = *lastErr
			}
			out = append(out, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing dead items of %q: %w", q.opts.Queue, crsql.Classify(err))
	}
	return out, nil
}

// Requeue moves a dead item of this queue back into the queue, with its id,
// payload, key and priority, fresh attempts and no delay, and reports
// whether the item was dead. Its part is its old part modulo the queue's
// current number of parts. It is one statement: the item is never in both
// tables, nor in neither.
func (q *Queue) Requeue(ctx context.Context, id uuid.UUID) (bool, error) {
	var n int64
	err := retry.Do(ctx, q.stats.retried("requeue"), func(ctx context.Context) error {
		tag, err := q.db.Exec(ctx, q.st.Requeue, id, q.opts.Queue)
		n = tag.RowsAffected()
		return crsql.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: requeueing dead item %s of %q: %w", id, q.opts.Queue, err)
	}
	if n == 1 {
		q.stats.enqueued.Add(1)
	}
	return n == 1, nil
}
