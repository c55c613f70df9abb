package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// FairFront returns the (skip+1)-th earliest turn of a queue's unclaimed
// items of one priority and that item's part, leaving out claimed items,
// other priorities and other queues; with fewer items, nothing.
func TestFairFront(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newSchemaDB(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// q, priority 0: turns base+0..9 µs in parts 0..9; the first two
	// claimed; priority 1 and queue "other" have earlier turns.
	for _, s := range []string{
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
		 SELECT gen_random_uuid(), 'q', g, 0, $1::TIMESTAMPTZ, $1::TIMESTAMPTZ + g * INTERVAL '1 microsecond', '\x00'::BYTEA FROM generate_series(0, 9) AS g`,
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
		 SELECT gen_random_uuid(), 'q', 15, 1, $1::TIMESTAMPTZ, $1::TIMESTAMPTZ - INTERVAL '1 second', '\x00'::BYTEA FROM generate_series(0, 2)`,
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
		 SELECT gen_random_uuid(), 'other', 14, 0, $1::TIMESTAMPTZ, $1::TIMESTAMPTZ - INTERVAL '1 second', '\x00'::BYTEA FROM generate_series(0, 2)`,
	} {
		if _, err := pool.Exec(ctx, s, base); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var session string
	if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 minute') RETURNING id::TEXT`).Scan(&session); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET claim = $1, claim_token = 1, lease_until = now() + INTERVAL '1 minute'
		WHERE queue = 'q' AND priority = 0 AND part < 2`, session); err != nil {
		t.Fatal(err)
	}
	stmts := store.New(crsql.Tables{})
	// Both twins answer alike (either text runs on either engine).
	for _, d := range []store.Dialect{store.Postgres, store.Cockroach} {
		for _, c := range []struct {
			skip, part int
			ok         bool
		}{{0, 2, true}, {3, 5, true}, {7, 9, true}, {8, 0, false}} {
			turn, part, ok, err := stmts.ItemsFairFront(ctx, pool, d, "q", 0, c.skip)
			if err != nil {
				t.Fatal(err)
			}
			if ok != c.ok || (ok && (part != c.part || !turn.Equal(base.Add(time.Duration(c.part)*time.Microsecond)))) {
				t.Errorf("%v: FairFront skipping %d: %v, part %d, %v; want part %d, %v", d, c.skip, turn, part, ok, c.part, c.ok)
			}
		}
	}
}
