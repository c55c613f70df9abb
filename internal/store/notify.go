package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Wake-ups on PostgreSQL: every enqueue sends a notification on its queue's
// channel in its own transaction (PostgreSQL delivers it only if, and when,
// the transaction commits, and collapses identical notifications of one
// transaction into one), and each worker process listens on the channels
// of its queues on one connection of its own. CockroachDB has no LISTEN
// or NOTIFY (its parser refuses both): these statements run on PostgreSQL
// only, and crdbwork's callers check the Dialect first.

// notifyStatement sends the wake-up of one queue: a notification on $1
// with payload $2, a hint of the items' key hashes (package internal/wake:
// "" for items of any part; the channel names the queue, and the claim
// that follows finds the items). Its plan is a Result node: no table is
// read.
const notifyStatement = `SELECT pg_notify($1, $2)`

// maxChannel is PostgreSQL's bound on a channel name (NAMEDATALEN - 1 bytes):
// longer names are truncated by LISTEN but not by pg_notify, so they would
// never match.
const maxChannel = 63

// NotifyChannel returns the notification channel of queue on the Store's
// tables: "crdbwork_" and 32 hex digits of a SHA-256 of the schema, the
// table prefix and the queue's name, 41 bytes in all, whatever their
// lengths and characters. Queues of other table sets (another schema or
// prefix) therefore never share a channel with queue, and the name is
// lowercase ASCII, within PostgreSQL's 63 bytes, and the same on every
// process.
func (s *Store) NotifyChannel(queue string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s|%d:%s|%d:%s", len(s.t.Schema), s.t.Schema, len(s.t.Prefix), s.t.Prefix, len(queue), queue)
	ch := "crdbwork_" + hex.EncodeToString(h.Sum(nil))[:32]
	if len(ch) > maxChannel {
		panic("sql: notification channel longer than 63 bytes") // a constant length: cannot happen
	}
	return ch
}

// Notify sends the wake-up notification on channel (see NotifyChannel)
// with payload through db, in db's transaction when db is one (PostgreSQL
// only). PostgreSQL merges the notifications of one transaction that have
// the same channel and payload.
func (s *Store) Notify(ctx context.Context, db DB, channel, payload string) error {
	_, err := db.Exec(ctx, notifyStatement, channel, payload)
	return err
}

// Batcher sends several statements in one round trip: *pgxpool.Pool and
// *pgx.Conn have it.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ItemsEnqueueNotify is EnqueueInsert followed by the wake-up
// notification on channel with payload, sent together in one round trip (a pipeline
// with one Sync: one implicit transaction, so the notification is
// delivered only if the insert commits). PostgreSQL only.
func (s *Store) ItemsEnqueueNotify(ctx context.Context, db Batcher, queue string, rows []EnqueueRow, channel, payload string) (ids []uuid.UUID, err error) {
	b := &pgx.Batch{}
	b.Queue(s.enq.PostgresInsert, s.enqueueArgs(queue, rows)...)
	b.Queue(notifyStatement, channel, payload)
	br := db.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			ids, err = nil, cerr
		}
	}()
	res, err := br.Query()
	if err != nil {
		return nil, err
	}
	got, err := collectIDs(res)
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	return got, nil
}

// NotifyListen makes conn listen on channel (see NotifyChannel); listening on a
// channel it already listens on does nothing, and costs one round trip.
// PostgreSQL only.
func (s *Store) NotifyListen(ctx context.Context, conn *pgx.Conn, channel string) error {
	_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

// NotifyUnlisten makes conn stop listening on channel. PostgreSQL only.
func (s *Store) NotifyUnlisten(ctx context.Context, conn *pgx.Conn, channel string) error {
	_, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}
