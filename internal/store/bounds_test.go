package store_test

import (
	"context"
	"math/rand"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/dbserver"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// incompressible returns n bytes of random letters and digits, which
// PostgreSQL's compression of index entries cannot shrink.
func incompressible(r *rand.Rand, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.Intn(len(alphabet))]
	}
	return string(b)
}

// TestIndexBoundsMeasured measures, on the real server, the longest text
// that each index holding user text accepts beside a queue name of
// MaxQueueNameLength bytes (text that does not compress), and checks that
// the bounds fit in every one of them: MaxKeyLength for keys and tenants,
// the schedules' 256-byte names, and the queue name alone in the indexes
// that hold only it. The figures are those of docs/enqueue.md ("Bounds")
// and of package sql's MaxKeyLength. CockroachDB has no such limit on an
// index entry: there the inserts at the bounds must pass, and nothing is
// measured.
func TestIndexBoundsMeasured(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	r := rand.New(rand.NewSource(1))
	queue := incompressible(r, store.MaxQueueNameLength)
	cockroach := testdb.Kind(t) == dbserver.Cockroach
	for _, c := range []struct {
		index, insert string
		bound         int  // the bound of the text beside the queue's name
		alone         bool // the text is the queue's name itself, alone in the entry
	}{
		{"crdbwork_items_sequence_order", `INSERT INTO crdbwork_items (id, queue, payload, item_key, seq_order) VALUES ($1, $2, 'x', $3, 1)`, store.MaxKeyLength, false},
		{"crdbwork_items_sequence_claimed", `INSERT INTO crdbwork_items (id, queue, payload, item_key, seq_order, claim, claim_token)
			SELECT $1, $2, 'x', $3, 1, s.id, 1 FROM crdbwork_sessions AS s`, store.MaxKeyLength, false},
		{"crdbwork_items_tenant_turn", `INSERT INTO crdbwork_items (id, queue, payload, tenant) VALUES ($1, $2, 'x', $3)`, store.MaxKeyLength, false},
		{"crdbwork_tenant_limits_pkey", `INSERT INTO crdbwork_tenant_limits (queue, tenant) SELECT $2, $3 WHERE $1::UUID IS NOT NULL`, store.MaxKeyLength, false},
		{"crdbwork_schedules_pkey", `INSERT INTO crdbwork_schedules (queue, name, last_period) SELECT $2, $3, now() WHERE $1::UUID IS NOT NULL`, 256, false},
		{"crdbwork_items (queue alone)", `INSERT INTO crdbwork_items (id, queue, payload) SELECT $1, $3, 'x' WHERE $2::TEXT IS NOT NULL`, store.MaxQueueNameLength, true},
		{"crdbwork_waits_for_pkey", `INSERT INTO crdbwork_waits_for (queue, prereq, dependent) SELECT $3, $1, gen_random_uuid() WHERE $2::TEXT IS NOT NULL`, store.MaxQueueNameLength, true},
		{"crdbwork_ended_pkey", `INSERT INTO crdbwork_ended (queue, id, outcome) SELECT $3, $1, 'acked' WHERE $2::TEXT IS NOT NULL`, store.MaxQueueNameLength, true},
		{"crdbwork_dead_items_by_queue", `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at)
			SELECT $1, $3, 0, 0, 1, 1, 'x', now() WHERE $2::TEXT IS NOT NULL`, store.MaxQueueNameLength, true},
	} {
		// A session for the claimed rows (the foreign key).
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (expiry) SELECT INTERVAL '1 hour' WHERE NOT EXISTS (SELECT 1 FROM crdbwork_sessions)`); err != nil {
			t.Fatal(err)
		}
		fits := func(n int) bool {
			_, err := pool.Exec(ctx, c.insert, uuid.New(), queue, incompressible(r, n))
			return err == nil
		}
		if !fits(c.bound) {
			t.Errorf("%s: a text of %d bytes (the bound) is refused", c.index, c.bound)
			continue
		}
		if cockroach {
			continue
		}
		lo, hi := c.bound, 4096 // lo fits
		for lo < hi {
			m := (lo + hi + 1) / 2
			if fits(m) {
				lo = m
			} else {
				hi = m - 1
			}
		}
		if c.alone {
			t.Logf("%s: a queue name of up to %d bytes fits (bound %d)", c.index, lo, c.bound)
		} else {
			t.Logf("%s: beside a queue name of %d bytes, up to %d bytes fit, %d in all (bound %d)", c.index, len(queue), lo, lo+len(queue), c.bound)
		}
		if entry := lo + len(queue); (c.alone && lo > store.IndexEntryLimit) || (!c.alone && entry > store.IndexEntryLimit) {
			t.Errorf("%s: %d bytes of text fit in an entry: more than PostgreSQL's bound of %d; the measure is wrong (compressed?)", c.index, entry, store.IndexEntryLimit)
		}
	}
}
