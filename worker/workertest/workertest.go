// Package workertest tests a worker.Handler against a real database, one item
// at a time, without running a Worker.
//
// Work enqueues one item in a queue, claims it and runs the handler exactly
// as a worker on that queue does — through the same code — then reports
// how the attempt ended, as a worker would (acked, retried, dead, snoozed,
// cancelled, or dropped for an at-most-once item), why, and where the item
// is now (Result.State). Give it the handler's *claim.Queue (its name,
// tables and retry policy), or nil for a fresh queue on Options.DB:
//
//	res, err := workertest.Work(ctx, nil, handle, claim.NewItem{Payload: []byte("ada")}, workertest.Options{DB: pool})
//	if err != nil {
//		t.Fatal(err)
//	}
//	if res.Outcome != claim.Acked {
//		t.Fatalf("outcome %v: %v", res.Outcome, res.Err)
//	}
//
// The item's result, written by the handler's Record, is then in the database
// for the test to check. Work applies the crdbwork schema if it is missing,
// so a test needs only a pool on a database it may write to.
//
// Tables gives a test crdbwork tables of its own, in a schema dropped when
// the test ends, so that tests run in parallel on one database; pass them
// in Options.Tables (or the claim.Options of the queue given to Work) and to
// everything else the test builds. RequireEnqueued,
// RequireEnqueuedN and RequireNotEnqueued check what the code under test
// enqueued (payload, JSON payload, key, tenant, priority, count):
//
//	tables := workertest.Tables(t, pool)
//	// ... run the producer under test with claim.Options{Tables: tables} ...
//	workertest.RequireEnqueued(t, pool, tables, "emails",
//		workertest.HasJSON(welcome{To: "ada@example.com"}), workertest.HasKey("ada@example.com"))
package workertest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// settleTimeout bounds the ack, nack or release, and closing the session.
const settleTimeout = 30 * time.Second

// cancelPoll is how often Work looks for a cancel of the item while its
// handler runs (a worker looks at every heartbeat and on the queue's
// cancel notification).
const cancelPoll = 25 * time.Millisecond

// Options configure Work. The zero value is valid with a queue; without one
// (q nil), DB is required.
type Options struct {
	// DB is the database of the fresh queue Work makes when it is given
	// none (q nil): named "workertest-" and a random id, on the tables in
	// Tables, with claim's default policy (25 attempts, backoff from 1 s).
	// With a queue, DB and Tables must be left zero: the queue's are used.
	DB worker.DB
	// Tables names the crdbwork tables of the fresh queue (see DB).
	Tables crsql.Tables
	// ItemTimeout bounds the handler, as worker.Options.ItemTimeout does
	// (an item's own claim.NewItem.Timeout bounds it instead). Default
	// worker.DefaultItemTimeout.
	ItemTimeout time.Duration
	// Cleanup, if set, is given a function that deletes what Work left in
	// the fresh queue it made (q nil): the item (retried or dead) and the
	// queue's rows. Pass the test's t.Cleanup, so that the rows stay for
	// the test to inspect and are gone when it ends. A queue given to Work
	// is the caller's, and is left alone; Cleanup must then be nil.
	Cleanup func(func())
	// BatchRecord, if set, runs in the ack transaction as
	// worker.Options.BatchRecord does, with the item's request (and the
	// value its handler set with worker.RecordValue).
	BatchRecord claim.BatchRecord
}

// batchSettler acks through claim.Queue.AckMany with a batch record, as
// a worker's settle goroutines do.
type batchSettler struct {
	*claim.Queue
	batch claim.BatchRecord
}

func (b batchSettler) Ack(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error) error {
	return b.AckValue(ctx, it, record, nil)
}

func (b batchSettler) AckValue(ctx context.Context, it claim.Item, record func(context.Context, pgx.Tx) error, value any) error {
	return b.AckMany(ctx, []claim.AckRequest{{Item: it, Record: record, Value: value}}, claim.AckOptions{Batch: b.batch})[0]
}

// Result is what Work did with the item.
type Result struct {
	// Item is the item as the handler received it (Attempt 1).
	Item claim.Item
	// Outcome is how the attempt ended, as a worker reports it
	// (worker.Observer):
	//
	//   - claim.Acked: the ack, with the handler's Record, committed;
	//   - claim.Retried: the item was nacked, and is claimable again after
	//     a backoff (or a claim.RetryAfter delay), its attempt counted;
	//   - claim.Dead: it was moved to the dead items (a claim.Permanent
	//     error, its last attempt, or its last allowed snooze);
	//   - claim.Snoozed: the handler returned worker.Snooze: the item is
	//     claimable again after the delay, its attempt not counted;
	//   - claim.Cancelled: the item was cancelled while its handler ran
	//     (claim.Queue.CancelItem, from the handler or from anywhere else):
	//     as in a worker, the handler's context was cancelled with a
	//     *claim.CancelledError (worker.Cancelled tells), and the item
	//     ended as cancelled, its result not written;
	//   - claim.Dropped: an at-most-once item (NewItem.AtMostOnce) whose
	//     handler or Record failed: its claim deleted it, so it is not
	//     retried.
	Outcome claim.Outcome
	// Err is why the item was not acked: the handler's error, a recovered
	// panic ("handler panic: ..."), a timeout (wrapping
	// context.DeadlineExceeded), the Record's error, or the cancel's cause
	// (wrapping claim.ErrCancelled). Nil when Acked.
	Err error
	// State is where the item is after the attempt, read from the database
	// once it settled.
	State State
}

// State is where an item is, as Work reads it after the attempt: in its
// queue again (Queued), among the dead items (Dead), or ended (Ended
// says how); an acked or dropped item is neither queued nor dead.
type State struct {
	// Queued reports that the item is in its queue's items table (retried
	// or snoozed): claimable from VestingAt (database clock), with Attempts
	// counted so far, its LastError and its Snoozes.
	Queued    bool
	VestingAt time.Time
	Attempts  int
	LastError string
	Snoozes   int
	// Dead reports that the item is among the queue's dead items; Reason
	// is its death's reason (claim.ReasonFailed, ReasonPermanent, or
	// "snoozed too often", for instance) and LastError its last error.
	Dead   bool
	Reason string
	// Ended is the outcome recorded when the item left the items table, as
	// the queue's ended ids hold it: "acked", "dead", "cancelled", or
	// "taken" (an at-most-once item, which its claim took, whatever its
	// handler did). "" while the item is queued, or when the queue keeps
	// no ended ids (claim.Policy.DedupOff).
	Ended string
}

// Work runs h on one item of q exactly as a worker on q does, against a
// real database: it applies the schema if it is missing, enqueues item (its
// Delay is ignored: the item is claimable at once) in q, starts a session,
// claims the item and runs h outside any transaction, bounded by
// opts.ItemTimeout and with a panic recovered as an error. If h succeeds, the
// item is acked with h's Record inside the serializable ack transaction;
// otherwise it is nacked with the error, so it is retried or dead-lettered as
// q's retry policy (claim.Options.MaxAttempts, BackoffBase, BackoffMax) says,
// or snoozed (worker.Snooze). An at-most-once item (NewItem.AtMostOnce, or
// the queue's claim.Policy.AtMostOnce) is taken by its claim and dropped if
// h fails. While h runs, Work looks for a cancel of the item every 25 ms and
// cancels h's context as a worker does (claim.Queue.CancelItem, called by h
// itself or by the test). Result.Outcome says how the attempt ended and
// Result.State where the item is now. The session is closed before Work
// returns.
//
// q should hold no other claimable item. With q nil, Work makes a fresh
// queue on opts.DB (see Options.DB), which holds none:
//
//	res, err := workertest.Work(ctx, nil, handle, item, workertest.Options{DB: pool})
//
// A failing handler is not an error of Work: it is reported in Result. Work
// returns an error when it could not run the item as a worker would: a
// database failure, another item claimed first from q, ctx ending before
// h returned (the item is then released, as a stopping worker releases it,
// and the error wraps h's), or an ack, nack or snooze that did not settle
// the item (its claim was lost other than by a cancel, or the database
// failed for the whole settle timeout: the error says why, and the item's
// lease or session releases it). The handler's context carries ctx's values
// and ends with ctx.
func Work(ctx context.Context, q *claim.Queue, h worker.Handler, item claim.NewItem, opts Options) (Result, error) {
	switch {
	case h == nil:
		return Result{}, errors.New("workertest: nil handler")
	case q == nil && opts.DB == nil:
		return Result{}, errors.New("workertest: no queue, and no Options.DB to make one on")
	case q != nil && (opts.DB != nil || opts.Tables != (crsql.Tables{}) || opts.Cleanup != nil):
		return Result{}, errors.New("workertest: Options.DB, Tables and Cleanup are for the fresh queue of a nil queue; the given queue has its own")
	case opts.ItemTimeout < 0:
		return Result{}, fmt.Errorf("workertest: item timeout %v is negative", opts.ItemTimeout)
	}
	if opts.ItemTimeout == 0 {
		opts.ItemTimeout = worker.DefaultItemTimeout
	}
	if q == nil {
		queue, tables := "workertest-"+uuid.NewString(), opts.Tables
		var err error
		if q, err = claim.New(opts.DB, claim.Options{Queue: queue, Tables: tables}); err != nil {
			return Result{}, fmt.Errorf("workertest: %w", err)
		}
		if opts.Cleanup != nil {
			db := opts.DB
			opts.Cleanup(func() { dropQueue(db, tables, queue) })
		}
	}
	db, tables := q.DB(), q.Options().Tables
	if err := ensureSchema(ctx, db, tables); err != nil {
		return Result{}, err
	}
	sess, err := session.Start(ctx, db, session.Options{Name: "workertest", Tables: tables})
	if err != nil {
		return Result{}, fmt.Errorf("workertest: starting a session: %w", err)
	}
	res, err := work(ctx, q, sess, h, item, opts)
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if cerr := sess.Close(closeCtx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("workertest: closing the session: %w", cerr))
	}
	return res, err
}

// work enqueues, claims and runs the item in sess.
func work(ctx context.Context, q *claim.Queue, sess *session.Session, h worker.Handler, item claim.NewItem, opts Options) (Result, error) {
	item.Delay = 0
	ids, err := q.Enqueue(ctx, item)
	if err != nil {
		return Result{}, fmt.Errorf("workertest: enqueueing the item: %w", err)
	}
	id := ids.IDs[0]
	items, err := q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err == nil && (len(items) == 0 || items[0].ID != id) {
		err = fmt.Errorf("queue %q holds other items: use an empty queue (or none, for a fresh one)", q.Name())
		if len(items) == 0 {
			err = fmt.Errorf("item %s was not claimable (claimed by another session?)", id)
		}
	}
	if err != nil {
		// Leave the queue as it was: give back another item, drop ours.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		for _, it := range items {
			if rerr := q.Release(bg, it); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		if _, cerr := q.CancelItem(bg, id, claim.CancelOptions{}); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return Result{}, fmt.Errorf("workertest: claiming the item: %w", err)
	}
	it := items[0]
	var settler attempt.Settler = q
	if opts.BatchRecord != nil {
		settler = batchSettler{q, opts.BatchRecord}
	}
	// The handler runs as in a worker: its parent context is the session's,
	// which ends when ctx does (or the session is lost), and then the item
	// is given back rather than nacked; a cancel of the item cancels it with
	// the cancel's cause, as a worker's maintenance loop does.
	parent, cancel := context.WithCancelCause(sess.Context())
	defer cancel(nil)
	stop := watchCancels(parent, q.Claimer(sess.ID()), it, cancel)
	run := attempt.Run(parent, q, it, func(ctx context.Context, it claim.Item) (func(context.Context, pgx.Tx) error, error) {
		return h(ctx, it)
	}, attempt.Options{
		Settle:     settler,
		Timeout:    opts.ItemTimeout,
		TryTimeout: settleTimeout,
		GiveBack:   func() bool { return sess.Context().Err() != nil },
	})
	stop()
	res := Result{Item: it, Err: run.Err}
	switch run.Outcome {
	case claim.Acked, claim.Retried, claim.Dead, claim.Snoozed, claim.Cancelled, claim.Dropped:
		res.Outcome = run.Outcome
	case claim.Released:
		return res, fmt.Errorf("workertest: item %s released: the context ended before the handler returned (%w): %w",
			it.ID, context.Cause(sess.Context()), run.Err)
	default:
		why := run.SettleErr
		if why == nil {
			why = run.Err
		}
		if why == nil {
			why = errors.New("no outcome")
		}
		return res, fmt.Errorf("workertest: item %s was not settled (outcome %v, the ack, nack or snooze did not take): %w", it.ID, run.Outcome, why)
	}
	bg, cancelRead := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancelRead()
	st, err := readState(bg, q, it.ID)
	if err != nil {
		return res, err
	}
	res.State = st
	return res, nil
}

// watchCancels looks for a cancel of it, the item the session of c holds,
// every cancelPoll until stop is called, and cancels the handler's parent
// context with the cancel's cause when it finds one (as a worker's
// checkCancels does). A failed read is tried again at the next poll.
func watchCancels(ctx context.Context, c claim.Claimer, it claim.Item, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(cancelPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			reqs, err := c.CancelRequests(ctx)
			if err != nil {
				continue
			}
			for _, r := range reqs {
				if r.ID == it.ID && r.Token == it.Token {
					cancel(r.Cause)
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// readState reads where item id of q is after its attempt.
func readState(ctx context.Context, q *claim.Queue, id uuid.UUID) (State, error) {
	stmts := store.New(q.Options().Tables)
	db := q.DB()
	var st State
	err := func() error {
		d, found, err := stmts.ItemsGet(ctx, db, id)
		if err != nil {
			return err
		}
		if found && d.Queue == q.Name() {
			st.Queued, st.VestingAt, st.Attempts, st.LastError, st.Snoozes = true, d.VestingAt, int(d.Attempts), d.LastError, int(d.Snoozes)
			return nil
		}
		deaths, queues, err := stmts.DeadOfID(ctx, db, id, 10)
		if err != nil {
			return err
		}
		for i, d := range deaths {
			if queues[i] == q.Name() {
				st.Dead, st.Reason, st.LastError, st.Attempts = true, d.Reason, d.LastError, d.Attempts
				break
			}
		}
		_, st.Ended, err = stmts.EndedOutcome(ctx, db, q.Name(), id)
		return err
	}()
	if err != nil {
		return State{}, fmt.Errorf("workertest: reading the state of item %s: %w", id, store.Classify(err))
	}
	return st, nil
}

// dropQueue deletes the rows of queue: its items, dead items, owned parts
// and its row in the queues table. Errors are ignored: it is a cleanup, and
// a test that dropped its database already is fine.
func dropQueue(db worker.DB, t crsql.Tables, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	_ = store.New(t).SchemaDropQueueRows(ctx, db, queue)
}

// ensureSchema applies the schema unless it is in place. Apply is idempotent
// but two concurrent first applications can collide (PostgreSQL's CREATE ...
// IF NOT EXISTS is not safe against a concurrent creation), so a failed Apply
// is tried again, and forgiven once the schema is in place.
func ensureSchema(ctx context.Context, db worker.DB, t crsql.Tables) error {
	if crsql.Check(ctx, db, t) == nil {
		return nil
	}
	var err error
	for try := range 5 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("workertest: applying the schema: %w", errors.Join(err, ctx.Err()))
			case <-time.After(time.Duration(try) * 50 * time.Millisecond):
			}
		}
		if err = crsql.Apply(ctx, db, t); err == nil || crsql.Check(ctx, db, t) == nil {
			return nil
		}
		if errors.Is(err, crsql.ErrSchemaNewer) {
			break
		}
	}
	return fmt.Errorf("workertest: applying the schema: %w", err)
}
