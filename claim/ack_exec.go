package claim

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Exec returns a record function (an AckRequest's Record) that runs one SQL
// statement, sql with args, in the ack's transaction: typically the INSERT
// of the item's result.
//
// Unlike a record function that calls tx.Exec itself, it costs no round
// trip of its own: AckMany queues the statement, and sends the queued
// statements of all the items whose claims held together with the
// transaction's COMMIT, in one pipeline. An ack transaction of many items
// is then two round trips, the BEGIN with the fenced delete and the
// statements with COMMIT, instead of one more per item; on PostgreSQL, when
// every record of the transaction is Exec's (or nil) and no BatchRecord is
// set, one round trip: BEGIN, the delete, the statements and COMMIT in one
// pipeline, as with AckOptions.Statement. A statement that
// fails fails the transaction like a failing record function: AckMany acks
// the items again one by one, so that it fails only its own item.
//
// Record functions of both kinds mix in one transaction: before a record
// function runs a statement of its own (any use of its tx), the statements
// queued so far are sent, so it sees their writes, as if each Exec had run
// at once. Called with a transaction of its caller's (not an ack's), the
// function runs the statement at once. Like every record, it may run more
// than once (the transaction is retried whole); args are sent each time and
// must not change.
//
//go:noinline
func Exec(sql string, args ...any) func(ctx context.Context, tx pgx.Tx) error {
	// Not inlined: every record Exec returns runs the same code, which
	// isExec recognizes.
	return func(ctx context.Context, tx pgx.Tx) error {
		if t, ok := tx.(*ackTxn); ok {
			t.queue(sql, args)
			return nil
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("claim: record statement: %w", err)
		}
		return nil
	}
}

// execCode is the code of the records Exec returns.
var execCode = reflect.ValueOf(Exec("")).Pointer()

// isExec reports whether record is one that Exec returned: a record that
// only queues its statement when given an ackTxn (so that the pipelined
// ack can collect it without a transaction; see ackPipelined).
func isExec(record func(ctx context.Context, tx pgx.Tx) error) bool {
	return record != nil && reflect.ValueOf(record).Pointer() == execCode
}

// ackTxn is the transaction an ack's record functions get: a pgx.Tx whose
// statements queued by Exec records wait for the next use of the
// transaction, or for its COMMIT. Every method but Commit and Rollback
// sends the queued statements first; a failure to send them is kept and
// fails the transaction (the server has aborted it anyway).
type ackTxn struct {
	pgx.Tx
	queued []queuedStatement
	// err is the first failure of the queued statements.
	err error
	// ownConn: the transaction runs on a connection the ack holds alone
	// (it began the transaction itself), so its COMMIT may be sent in the
	// queued statements' pipeline; otherwise they are sent first and the
	// transaction committed by Tx.Commit.
	ownConn bool
}

type queuedStatement struct {
	sql  string
	args []any
}

func (t *ackTxn) queue(sql string, args []any) {
	t.queued = append(t.queued, queuedStatement{sql: sql, args: args})
}

// batch returns the queued statements as a batch, and forgets them.
func (t *ackTxn) batch() *pgx.Batch {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(t.queued)+1)}
	for _, s := range t.queued {
		b.Queue(s.sql, s.args...)
	}
	clear(t.queued)
	t.queued = t.queued[:0]
	return b
}

// flush sends the queued statements, if any, in one batch.
func (t *ackTxn) flush(ctx context.Context) error {
	if t.err != nil || len(t.queued) == 0 {
		return t.err
	}
	b := t.batch()
	br := t.Tx.SendBatch(ctx, b)
	err := readStatements(br, b.Len())
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.err = err
	}
	return err
}

// readStatements reads the first n results of br, returning the first
// failure, named by its statement.
func readStatements(br pgx.BatchResults, n int) error {
	for i := range n {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("claim: record statement %d of %d: %w", i+1, n, err)
		}
	}
	return nil
}

// commit sends the queued statements and COMMIT: in one pipeline if the
// transaction is on a connection of the ack's own, otherwise one after the
// other. Its error is not classified (retry.CommitError does).
func (t *ackTxn) commit(ctx context.Context) error {
	if t.err != nil {
		return t.err
	}
	if !t.ownConn || len(t.queued) == 0 {
		if err := t.flush(ctx); err != nil {
			return err
		}
		return t.Tx.Commit(ctx)
	}
	b := t.batch()
	n := b.Len()
	b.Queue("COMMIT")
	br := t.Tx.SendBatch(ctx, b)
	err := readStatements(br, n)
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback // the transaction had failed before
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// The methods a record function uses send the queued statements first.

func (t *ackTxn) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

func (t *ackTxn) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *ackTxn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.Tx.SendBatch(ctx, b)
}

func (t *ackTxn) LargeObjects() pgx.LargeObjects {
	_ = t.flush(context.Background()) // a failure fails the transaction (t.err)
	return t.Tx.LargeObjects()
}

func (t *ackTxn) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

func (t *ackTxn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.Tx.Exec(ctx, sql, args...)
}

func (t *ackTxn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *ackTxn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.flush(ctx); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *ackTxn) Conn() *pgx.Conn {
	_ = t.flush(context.Background()) // a failure fails the transaction (t.err)
	return t.Tx.Conn()
}

// errRow is the row of a QueryRow that could not be sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// ackRollbackTimeout bounds the ROLLBACK of a failed ack transaction on a
// connection of its own, so that a frozen server cannot hold the settle
// goroutine (the connection is then closed: the pool drops it).
const ackRollbackTimeout = 5 * time.Second

// runAck runs one ack transaction of items, retried whole on serialization
// failures and deadlocks: the fenced delete of the items whose claims hold
// (deleteClaimed's), then records with the items it deleted, then COMMIT.
// records gets an ackTxn, so that the statements of Exec records go with
// the COMMIT. On a pool or a connection the transaction is two round trips
// plus what the record functions run themselves: BEGIN with the delete,
// then the queued statements with COMMIT; on another database handle, a
// transaction of retry.TxWith whose queued statements are sent before its
// COMMIT. It returns which items were deleted and which of them items wait
// for; an error means nothing committed, unless it wraps
// ErrOutcomeUnknown.
func (q *Queue) runAck(ctx context.Context, items []Item, records func(ctx context.Context, tx pgx.Tx, deleted []bool) error) (deleted []bool, waitedFor []uuid.UUID, err error) {
	d := q.engine.Load().dialect
	opts := store.AckTxOptions(d)
	switch q.db.(type) {
	case *pgxpool.Pool, *pgx.Conn:
		err = retry.Run(ctx, q.stats.retried("ack"), func(ctx context.Context) error {
			var err error
			deleted, waitedFor, err = q.ackOnConn(ctx, d, opts, items, records)
			return err
		})
		return deleted, waitedFor, err
	}
	err = retry.TxWith(ctx, q.db, opts, q.stats.retried("ack"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if deleted, waitedFor, err = q.deleteClaimed(ctx, tx, items); err != nil {
			return err
		}
		t := &ackTxn{Tx: tx}
		if err := records(ctx, t, deleted); err != nil {
			return err
		}
		return t.flush(ctx)
	})
	return deleted, waitedFor, err
}

// ackOnConn is one try of runAck on a connection of the pool (or the
// connection) that it holds for the transaction.
func (q *Queue) ackOnConn(ctx context.Context, d store.Dialect, opts pgx.TxOptions, items []Item, records func(ctx context.Context, tx pgx.Tx, deleted []bool) error) ([]bool, []uuid.UUID, error) {
	conn, release, err := q.holdConn(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	held := heldItems(items)
	b := q.store.ItemsAckBegin(d, opts, claimKeys(held))
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	gone, waitedFor, err := store.ReadAckBegin(br, b)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		rollbackOwn(ctx, conn, tx)
		return nil, nil, retry.TxError(store.Classify(err))
	}
	deleted := markDeleted(items, gone)
	t := &ackTxn{Tx: tx, ownConn: true}
	if err := records(ctx, t, deleted); err != nil {
		rollbackOwn(ctx, conn, tx)
		return nil, nil, retry.TxError(err)
	}
	if err := t.commit(ctx); err != nil {
		rollbackOwn(ctx, conn, tx)
		return nil, nil, retry.CommitError(fmt.Errorf("commit: %w", err))
	}
	return deleted, waitedFor, nil
}

// rollbackOwn ends the transaction a failed try left open on conn, if any,
// bounded by ackRollbackTimeout.
func rollbackOwn(ctx context.Context, conn *pgx.Conn, tx pgx.Tx) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackRollbackTimeout)
	defer cancel()
	if err := tx.Rollback(rbCtx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		_ = conn.Close(rbCtx)
	}
}

// errNoConn is holdConn's answer for a database handle that is neither a
// pool nor a connection.
var errNoConn = errors.New("claim: the queue's database is neither a *pgxpool.Pool nor a *pgx.Conn")

// holdConn returns the connection an ack pipeline runs on: one acquired
// from the queue's pool (release gives it back) or the queue's own
// connection (release does nothing).
func (q *Queue) holdConn(ctx context.Context) (conn *pgx.Conn, release func(), err error) {
	switch db := q.db.(type) {
	case *pgxpool.Pool:
		c, err := db.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("acquire: %w", err)
		}
		return c.Conn(), c.Release, nil
	case *pgx.Conn:
		return db, func() {}, nil
	}
	return nil, nil, errNoConn
}
