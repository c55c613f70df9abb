package store

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/crdbwork/crdbwork/sql"
)

// Bounds of the text that crdbwork's indexes hold (docs/enqueue.md,
// "Bounds"). What a table's column accepts is not what its indexes accept:
// on PostgreSQL an index entry (all of its columns together, after the
// server's choice to compress them, which text that does not compress
// gains nothing from) must fit in a third of a page, 2,704 bytes with the
// default 8 KiB pages, and a row whose entry is longer is refused
// (SQLSTATE 54000, "index row size … exceeds btree version 4 maximum
// 2704") by every statement that writes it into the table: an enqueue, but
// also the move of a waiting item or of a dead item back into the items
// table, which have no such index. Measured on PostgreSQL 15 with text
// that does not compress (TestIndexBoundsMeasured): the tightest entries
// are crdbwork_items_sequence_order's (queue, item_key, enqueued_at,
// seq_order, id), which takes a queue name and a key of 2,656 bytes
// together, and crdbwork_items_tenant_turn's (queue, tenant, priority,
// turn_at), 2,672; the primary keys (queue, tenant) of the tenant limits
// and (queue, name) of the schedules take 2,688, crdbwork_waits_for's
// (queue, prereq, dependent) a queue name of 2,660 and the items' indexes
// on the queue alone 2,668.
//
// So the bounds share the entry between the queue's name and the one other
// text of each index: MaxQueueNameLength + MaxKeyLength = 2,560 bytes, 96
// under the tightest measured entry. CockroachDB has no such limit on an
// index entry (its keys are byte strings of any length); its limits are on
// whole messages (16 MiB by default, sql.conn.max_read_buffer_message_size),
// rows (sql.guardrails.max_row_size_err, 512 MiB) and Raft commands
// (kv.raft.command.max_size, 64 MiB), far above one item's bounds. The same
// bounds hold on both engines, so that a queue can move from one to the
// other.
const (
	// MaxQueueNameLength bounds a queue's name, in bytes of UTF-8.
	MaxQueueNameLength = 512
	// MaxKeyLength bounds an item's key and its tenant (claim.NewItem.Key
	// and Tenant), and a tenant named by a tenant limit, in bytes of UTF-8.
	MaxKeyLength = 2048
	// IndexEntryLimit is PostgreSQL's bound on one btree index entry with
	// its default 8 KiB pages: a third of a page, less the page's and the
	// entry's headers.
	IndexEntryLimit = 2704
)

// ErrBadName is wrapped by the errors of CheckQueueName and CheckText: a
// name or text that the schema cannot store (sql.ErrBadName, which
// applications test for).
var ErrBadName = sql.ErrBadName

// CheckQueueName returns an error wrapping ErrBadName if name cannot be a
// queue's name: empty, over MaxQueueNameLength bytes, not valid UTF-8, or
// with a NUL byte (which neither engine's TEXT stores).
func CheckQueueName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: a queue's name must not be empty", ErrBadName)
	}
	return CheckText("the queue name", name, MaxQueueNameLength)
}

// CheckText returns an error wrapping ErrBadName if s, named what in the
// error, is over max bytes, not valid UTF-8, or has a NUL byte.
func CheckText(what, s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrBadName, what, len(s), max)
	case !utf8.ValidString(s) || strings.ContainsRune(s, 0):
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL bytes", ErrBadName, what)
	}
	return nil
}
