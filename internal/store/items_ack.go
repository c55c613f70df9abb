package store

import (
	"context"
	"errors"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The pipelined ack (issue #19): when an ack transaction's results are
// written by one SQL statement, the whole transaction — BEGIN, the fenced
// delete, the results' statement and COMMIT — is sent in one pgx batch, one
// round trip instead of four. The results' statement and COMMIT are sent
// before the delete's answer is known, so the delete must stop the
// transaction itself when a claim was lost: AckAll is the ack's statement
// (PostgresAckMany, unchanged: the same fence on id, claim and token, the
// same dedup record) whose final SELECT divides by zero unless it deleted
// every item asked for. The error (SQLSTATE 22012) aborts the pipeline:
// PostgreSQL skips the rest of it up to its Sync, COMMIT included, and the
// transaction is rolled back; the caller then acks the same items the
// ordinary way, which reports the lost claims one by one. The transaction
// is SERIALIZABLE, like every ack (AckTxOptions).
//
// It is used on PostgreSQL only. CockroachDB accepts the guard (a BOOL casts
// to INT 1 or 0: https://www.cockroachlabs.com/docs/stable/bool; an integer
// division by zero is an error, 22012), but its handling of BEGIN and COMMIT
// sent as prepared statements in one pipeline is not verified without a
// server here, so on CockroachDB acks keep their one-statement-per-round-
// trip transaction.

// ackAllGuard replaces the final SELECT of the ack's statement: one row, 1
// if the statement deleted $4 items (a division by zero otherwise), and the
// ids of the deleted items that items wait for (hasDependents).
const ackAllGuard = "\nSELECT 1 / ((SELECT count(*) FROM gone) = $4::BIGINT)::INT, ARRAY(SELECT g.id FROM gone AS g WHERE " + hasDependents + ")"

// ackAllOf returns the all-or-nothing form of an ack statement rendered
// for t that ends with the SELECT of the deleted ids (deleteEndedAck).
func ackAllOf(t Tables, ackMany string) string {
	body, ok := strings.CutSuffix(ackMany, rewrite(t, ackedSelect))
	if !ok {
		panic("sql: the ack statement no longer ends with the SELECT of its deleted ids")
	}
	return body + rewrite(t, ackAllGuard)
}

// ackAllLost is the SQLSTATE of AckAll's guard: a claim was lost.
const ackAllLost = "22012"

// RecordStatement is a statement that records results in an ack's
// transaction, with its arguments.
type RecordStatement struct {
	SQL  string
	Args []any
}

// ItemsAckPipeline returns the batch of a whole pipelined ack transaction on
// PostgreSQL: BEGIN ISOLATION LEVEL SERIALIZABLE; the fenced delete of keys
// (the ids must be distinct), which fails unless it deletes every one;
// records in order (the results' statements); COMMIT. Send it on a
// connection that is not in a transaction, read every result, and on any
// failure roll back (RollbackPipeline): the transaction did not commit
// unless the failure is an unknown outcome (the connection lost after the
// batch was sent).
func (s *Store) ItemsAckPipeline(keys []ClaimKey, records []RecordStatement) *pgx.Batch {
	ids, sessions, tokens := fenceArrays(keys)
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(records)+3)}
	b.Queue("BEGIN ISOLATION LEVEL SERIALIZABLE")
	b.Queue(s.ackAll, ids, sessions, tokens, int64(len(keys)))
	for _, r := range records {
		b.Queue(r.SQL, r.Args...)
	}
	b.Queue("COMMIT")
	return b
}

// ReadAckPipeline reads the results of the batch AckPipeline returned, in
// order, and returns the ids of the acked items that items wait for (whose
// dependents the caller releases once it committed). Its error is the
// first statement's that failed (AckPipelineLost tells a lost claim).
func ReadAckPipeline(br pgx.BatchResults, b *pgx.Batch) ([]uuid.UUID, error) {
	var waitedFor [][16]byte
	for i := range b.Len() {
		var err error
		if i == 1 {
			var one int64
			err = br.QueryRow().Scan(&one, &waitedFor)
		} else {
			_, err = br.Exec()
		}
		if err != nil {
			return nil, err
		}
	}
	ids := make([]uuid.UUID, len(waitedFor))
	for i, id := range waitedFor {
		ids[i] = id
	}
	return ids, nil
}

// AckPipelineLost reports whether err is AckAll's guard: some claim of the
// pipelined ack was no longer held, and nothing was written.
func AckPipelineLost(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == ackAllLost
}

// RollbackPipeline ends the transaction a failed pipelined ack left open on
// conn (aborted, or open if the batch was cut short), if any.
func RollbackPipeline(ctx context.Context, conn *pgx.Conn) error {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return nil
	}
	_, err := conn.Exec(ctx, "ROLLBACK")
	return err
}
