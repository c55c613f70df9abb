package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// BatchStatement is a BatchRecord given as one SQL statement: it returns
// the statement, and its arguments, that record the results of acked (the
// requests whose claims held, in request order) in the ack's transaction,
// for example an INSERT of unnest($1::UUID[]). It must not run anything
// itself, and it may be called more than once for the same transaction.
//
// Because it is SQL rather than Go code that runs statements, AckMany can
// send a whole ack transaction in one round trip on PostgreSQL (see
// AckOptions.Statement).
type BatchStatement func(acked []AckRequest) (sql string, args []any)

// pipelineRollbackTimeout bounds the ROLLBACK after a failed pipelined ack.
const pipelineRollbackTimeout = 5 * time.Second

// ackPipelined tries to ack reqs in one round trip: one pgx batch holding
// BEGIN ISOLATION LEVEL SERIALIZABLE, the fenced delete of every item, the
// statements of the items' Exec records, the results' statement
// (opts.Statement) and COMMIT (store.Store.ItemsAckPipeline). The delete
// fails unless every claim still holds, so the results are written only for
// items it deleted, in the same SERIALIZABLE transaction: the same
// exactly-once ack as ackTx.
//
// It reports handled false, having committed nothing, when the pipeline
// does not apply (not PostgreSQL; neither a Statement nor an Exec record;
// a per-item Record that is not Exec's, a Go BatchRecord, an
// at-most-once or a repeated item; a database handle other than a pool or a
// connection) or when the transaction failed in a way that the ordinary ack
// sorts out: a lost claim, a failing results' statement, a serialization
// failure, a refused COMMIT. Then the caller acks the same items the
// ordinary way. If the outcome is unknown (the connection was lost after
// the batch was sent, so COMMIT may have run), it reports handled with an
// error wrapping ErrOutcomeUnknown for every item.
func (q *Queue) ackPipelined(ctx context.Context, reqs []AckRequest, opts AckOptions) (errs []error, handled bool) {
	if opts.Batch != nil || q.engine.Load().dialect != store.Postgres {
		return nil, false
	}
	seen := make(map[uuid.UUID]struct{}, len(reqs))
	execs := 0
	for _, r := range reqs {
		if r.Record != nil && !isExec(r.Record) || r.Item.AtMostOnce {
			return nil, false
		}
		if r.Record != nil {
			execs++
		}
		if _, dup := seen[r.Item.ID]; dup {
			return nil, false
		}
		seen[r.Item.ID] = struct{}{}
	}
	if opts.Statement == nil && execs == 0 {
		return nil, false
	}
	// The Exec records' statements, in request order (they only queue
	// them), then the batch's statement: the order of the ordinary ack.
	collect := &ackTxn{queued: make([]queuedStatement, 0, execs)}
	for _, r := range reqs {
		if r.Record != nil {
			_ = r.Record(ctx, collect)
		}
	}
	records := make([]store.RecordStatement, 0, execs+1)
	for _, s := range collect.queued {
		records = append(records, store.RecordStatement{SQL: s.sql, Args: s.args})
	}
	if opts.Statement != nil {
		var stmt string
		var args []any
		if err := recovered(func() error { stmt, args = opts.Statement(reqs); return nil }); err != nil {
			return nil, false // the ordinary ack calls it again and reports the panic
		}
		records = append(records, store.RecordStatement{SQL: stmt, Args: args})
	}
	conn, release, err := q.holdConn(ctx)
	if err != nil {
		return nil, false
	}
	defer release()
	if conn.PgConn().TxStatus() != 'I' {
		return nil, false // a connection inside a transaction: its COMMIT is not ours to send
	}
	items := make([]Item, len(reqs))
	for i, r := range reqs {
		items[i] = r.Item
	}
	b := q.store.ItemsAckPipeline(claimKeys(items), records)
	br := conn.SendBatch(ctx, b)
	waitedFor, err := store.ReadAckPipeline(br, b)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		q.stats.acked.Add(int64(len(reqs)))
		// The acked items' dependents, as after every ack (the pipeline
		// committed only if every claim held: every item was deleted).
		q.afterAck(ctx, items, waitedFor)
		return make([]error, len(reqs)), true
	}
	// A context that ended mid-batch has closed the connection already
	// (pgx closes it to interrupt the query): then there is nothing to roll
	// back. Otherwise the ROLLBACK is bounded, so that a frozen server
	// cannot hold this goroutine (the pool drops a connection left in a
	// transaction).
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pipelineRollbackTimeout)
	_ = store.RollbackPipeline(rbCtx, conn)
	cancel()
	var pgErr interface{ SQLState() string }
	if retry.Ambiguous(err) || (!errors.As(err, &pgErr) && retry.LostInFlight(err)) {
		errs = make([]error, len(reqs))
		for i, r := range reqs {
			errs[i] = fmt.Errorf("claim: ack of item %s (in a pipelined batch of %d): %w: %w", r.Item.ID, len(reqs), retry.ErrOutcomeUnknown, err)
		}
		return errs, true
	}
	if retry.Retryable(err) {
		q.stats.retried("ack")() // the ordinary ack runs it again
	}
	return nil, false
}

// batchRecord returns what the ordinary ack calls once per transaction:
// opts.Batch, then opts.Statement's statement (nil if neither is set).
func (opts AckOptions) batchRecord() BatchRecord {
	batch, stmt := opts.Batch, opts.Statement
	if stmt == nil {
		return batch
	}
	return func(ctx context.Context, tx pgx.Tx, acked []AckRequest) error {
		if batch != nil {
			if err := batch(ctx, tx, acked); err != nil {
				return err
			}
		}
		sql, args := stmt(acked)
		return Exec(sql, args...)(ctx, tx) // with the COMMIT, in an ack's transaction
	}
}
