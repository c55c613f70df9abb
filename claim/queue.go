package claim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults for Options.
const (
	DefaultQueue       = "default"
	DefaultMaxAttempts = 25
	DefaultMaxPayload  = 1 << 20
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Hour
	// DefaultLease is the lease every claim takes unless Options.Lease says
	// otherwise: long enough that ordinary handlers never need Extend.
	DefaultLease = 5 * time.Minute
)

var (
	// ErrClaimLost is returned by Ack, AckMany, Nack and Release when the
	// item is no longer claimed by this claim: the session was deleted, the
	// part was given up, or the item was acked, released or cancelled. The
	// transaction was rolled back; nothing was recorded.
	ErrClaimLost = errors.New("claim lost: the item is no longer claimed by this session")
	// ErrNotOwner is returned by Claimer.Claim when the session (or
	// one of the parts) no longer exists in the database.
	ErrNotOwner = errors.New("session or part no longer exists")
	// ErrPayloadTooLarge is returned by Enqueue for a payload or metadata over
	// Options.MaxPayload. Nothing is enqueued.
	ErrPayloadTooLarge = errors.New("payload too large")
	// ErrOutcomeUnknown is wrapped by every error of a call whose outcome is
	// unknown: CockroachDB answered "result is ambiguous" (SQLSTATE 40003),
	// or the connection was lost while the statement or COMMIT was in
	// flight. The work may or may not have been done: such a call is never
	// reported as done, nor as failed. An ack with an unknown outcome may
	// have committed; a claim may have claimed items (see
	// Claimer.ReleaseForgotten);
	// an enqueue may have added its items: it returns their ids, and
	// enqueueing the same items again with NewItem.ID set to them adds
	// nothing twice, even if they were acked meanwhile, within the queue's
	// dedup window (see the package documentation). An enqueue that failed
	// before writing anything (its fair turns read, its schema check) is a
	// plain failure, never an unknown outcome.
	// It is the same value as the internal retry package's, so errors.Is
	// works on every error of this package.
	ErrOutcomeUnknown = retry.ErrOutcomeUnknown
)

// DB is the database claim works on: a *pgxpool.Pool (or a *pgx.Conn)
// satisfies it. It is sql.Pool, the one database type of crdbwork's
// packages: a value of claim.DB, partition.DB or worker.DB is any of them.
type DB = crsql.Pool

// Options configure a Queue. The zero value is valid.
type Options struct {
	// Queue is the queue's name. Default "default". At most
	// MaxQueueNameLength bytes of valid UTF-8, without NUL bytes.
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
	// Lease is the lease every claim takes, by the database clock: an item
	// whose claim is neither acked, nacked, released nor extended within it
	// is released by any session's Reap (its attempt counted). Default
	// DefaultLease (5 min). A claim request may ask for another
	// (ClaimRequest.Lease): a worker on a queue whose Lease is zero claims
	// with its own default (see package worker).
	Lease time.Duration
	// NoNotify turns off the PostgreSQL notification (pg_notify) that every
	// enqueue sends in its transaction to wake idle workers of other
	// processes at commit (see package worker's Options.NoWake). Without
	// it, those workers claim the items at their next poll. Enqueues still
	// wake this process's own workers. A notifying commit takes a lock
	// that serializes the commits of notifying transactions on the server:
	// turn it off for producers that commit many small transactions at
	// once and whose workers need no quick pickup. Ignored on CockroachDB,
	// which has no notifications. Default: on.
	NoNotify bool
	// Hooks, if not nil, wrap every enqueue of the queue (Enqueue,
	// EnqueueTx, Buffer.Enqueue) and are told of every claim, ack
	// transaction, nack and release (see Hooks). Package otelcrdbwork's
	// add the producer's trace context to the items' Headers and make
	// the steps spans. Default: none.
	Hooks Hooks
	// MaxSnoozes is how often one item may be snoozed (Snooze): the
	// snooze after that moves it to the dead items with reason
	// ReasonSnoozedTooOften. Default DefaultMaxSnoozes (100);
	// UnlimitedSnoozes (-1): no bound, a snooze never moves an item to the
	// dead items (SnoozeUnlimited lifts the bound for one snooze).
	MaxSnoozes int
	// SequencedClaimTimeout bounds how long one claim statement of a
	// sequenced queue may run (and so hold the key heads it has locked,
	// which other claims skip): past it the database stops the statement,
	// nothing is claimed, and the claim fails with ErrSequencedClaimTimeout
	// (package worker logs it and claims again at its next poll). Default
	// DefaultSequencedClaimTimeout (10 s); negative: no bound.
	// docs/sequences.md, "Cost", says what makes a sequenced claim long.
	SequencedClaimTimeout time.Duration
}

// Queue enqueues, claims and acknowledges the items of one queue.
// It is safe for concurrent use.
type Queue struct {
	db    DB
	given Options // as given to New (see Options)
	store *store.Store
	opts  Options
	next  atomic.Uint64 // round-robin hash for items without a key
	stats counters
	// engine is set once the schema version was found to be this code's,
	// for the server's engine; nil until then.
	engine atomic.Pointer[engine]
	// heads caches the fair queue's head per priority (see stamp);
	// plainUntil, in Unix nanoseconds, is until when the queue is taken
	// to be not fair without asking again.
	heads      headCache
	plainUntil atomic.Int64
	// spread caches which tenants a fair enqueue spreads over the parts
	// (see spreads).
	spread spreadCache
	// channel is the queue's wake-up channel (store.Store.NotifyChannel).
	channel string
	// deadCount bounds the queue's dead items between the prune-dead step's exact
	// checks (retention.go).
	deadCount deadCountState

	// seq is what the Queue last read of its queue's sequencing (sequence.go).
	seq sequenceState

	// deps is the state of dependencies (depends.go).
	deps depsState
}

// engine holds what differs between CockroachDB and PostgreSQL, set by ready.
type engine struct {
	dialect   store.Dialect // the statements' twins to run (see store.Store)
	claimInTx bool          // claims need an explicit SERIALIZABLE transaction
}

// maxLease bounds Options.Lease and Extend's duration (a year): far beyond
// any handler, far below what overflows an interval.
const maxLease = 365 * 24 * time.Hour

// New returns a Queue on db. It does no I/O. The first call that touches
// items checks the schema version once (and again after a failure): an error
// wrapping crsql.ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaNewer means
// the schema is not this code's.
func New(db DB, opts Options) (*Queue, error) {
	given := opts
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
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
	}
	if opts.MaxSnoozes == 0 {
		opts.MaxSnoozes = DefaultMaxSnoozes
	}
	if opts.SequencedClaimTimeout == 0 {
		opts.SequencedClaimTimeout = DefaultSequencedClaimTimeout
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
	case opts.MaxSnoozes < 0 && opts.MaxSnoozes != UnlimitedSnoozes:
		return nil, fmt.Errorf("claim: MaxSnoozes %d is negative (UnlimitedSnoozes, -1, for no bound)", opts.MaxSnoozes)
	case opts.Lease < time.Millisecond || opts.Lease > maxLease:
		return nil, fmt.Errorf("claim: Lease %v must be between 1ms and %v", opts.Lease, maxLease)
	}
	if err := opts.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if err := store.CheckQueueName(opts.Queue); err != nil {
		return nil, fmt.Errorf("claim: %w (MaxQueueNameLength)", err)
	}
	q := &Queue{db: db, store: store.New(opts.Tables), opts: opts, given: given}
	q.channel = q.store.NotifyChannel(opts.Queue)
	q.next.Store(rand.Uint64())
	return q, nil
}

// ready checks the schema version on the first call (cached after success)
// and picks the engine's dialect (the statements' twins; see store.Store) and
// the isolation of claim transactions.
//
// On CockroachDB, claims run in an explicit SERIALIZABLE transaction: it
// refuses SKIP LOCKED under READ COMMITTED, the default of some 23.2+
// clusters. On PostgreSQL a claim is its single statement, committed by
// itself at the server's default isolation (READ COMMITTED unless
// configured otherwise), the isolation SKIP LOCKED is designed for there:
// under SERIALIZABLE, concurrent claimers abort each other with
// serialization failures (measured: 89 retries for 312 claims of 8
// concurrent sessions in TestConcurrentSessionsAckEachItemExactlyOnce), and
// BEGIN and COMMIT would cost two more round trips per claim. Either way a
// row is claimed by one transaction only: the claim locks it and re-checks
// claim IS NULL. Acks, nacks and everything else that fences on a claim are
// SERIALIZABLE transactions or single statements on both.
func (q *Queue) ready(ctx context.Context) error { return q.readyOn(ctx, q.db) }

// readyOn is ready with the checks run through db: EnqueueTx runs them in
// the caller's transaction, so that a first call made while the caller holds
// a connection of a small pool does not wait for a second one.
func (q *Queue) readyOn(ctx context.Context, db crsql.DB) error {
	if q.engine.Load() != nil {
		return nil
	}
	if err := crsql.Check(ctx, db, q.opts.Tables); err != nil {
		return err
	}
	dialect, err := store.DetectDialect(ctx, db)
	if err != nil {
		return err
	}
	q.engine.Store(&engine{dialect: dialect, claimInTx: dialect == store.Cockroach})
	return nil
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.opts.Queue }

// DB returns the database the queue works on, for what is built on the
// queue (a worker, a schedule runner) to run its own statements there.
func (q *Queue) DB() DB { return q.db }

// Options returns the options the queue was created with, as given to New:
// a zero field stands for its default (Name returns the queue's name with
// the default filled in). What is built on the queue reads its name, tables
// and policies here, so they are defined once: a worker takes its lease
// from Lease, or its own default when Lease is zero (see package worker).
func (q *Queue) Options() Options { return q.given }
