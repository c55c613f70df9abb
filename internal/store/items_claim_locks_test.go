package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestPartClaimLocksOnlyWhatItClaims: on PostgreSQL a per-part claim of n
// items over several owned parts locks those n rows and no others
// (pgLockLazily), and still hands out the best n across the parts in
// (priority, turn_at) order. Before, each part's branch locked up to n rows
// and the claim kept n of them: a claim of 20 over four full parts locked
// 80. The claim runs in an open transaction, so that its locks last; a
// second connection counts the queue's unclaimed rows it can lock.
func TestPartClaimLocksOnlyWhatItClaims(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("PostgreSQL's lazy locks (pgLockLazily); CockroachDB's claim locks in its branches")
	}
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (id, expiry) VALUES ($1, INTERVAL '1 hour')`, session); err != nil {
		t.Fatal(err)
	}
	const parts, perPart = 4, 50
	for part := range parts {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, session, part); err != nil {
			t.Fatal(err)
		}
	}
	// Turns interleaved across the parts, so that the best 20 come from
	// every part; two items of part 3 first by priority.
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload, turn_at, priority)
SELECT gen_random_uuid(), 'q', g % $1, '\x'::BYTEA, now() - INTERVAL '1 hour' + g * INTERVAL '1 second',
       CASE WHEN g IN (199, 195) THEN -1 ELSE 0 END
FROM generate_series(0, $2 - 1) AS g`, parts, parts*perPart); err != nil {
		t.Fatal(err)
	}
	s := store.New(crsql.Tables{})
	owned := []int64{0, 1, 2, 3}
	for _, c := range []struct {
		name             string
		limit, partLimit int
	}{
		{"Claim", 20, 0},
		{"ClaimShares", 20, 10}, // each part read up to 10, 40 candidates for 20
	} {
		t.Run(c.name, func(t *testing.T) {
			// The n best in claim order, before the claim (the statement returns
			// them in no particular order).
			var want []uuid.UUID
			rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_items WHERE queue = 'q' AND claim IS NULL
ORDER BY priority, turn_at LIMIT $1`, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id uuid.UUID
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				want = append(want, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if c.partLimit > 0 {
				want = nil // shares: the best of each part's share, checked by count below
			}
			var before int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = 'q' AND claim IS NULL`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			got, err := s.ItemsClaimParts(ctx, tx, store.Postgres,
				store.ClaimArgs{Session: session, Queue: "q", Limit: c.limit, PartLimit: c.partLimit, Lease: time.Minute}, owned)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != c.limit {
				t.Fatalf("claimed %d items, want %d", len(got), c.limit)
			}
			byPart := map[int]int{}
			best := map[uuid.UUID]bool{}
			for _, id := range want {
				best[id] = true
			}
			for _, it := range got {
				byPart[it.Part]++
				if want != nil && !best[it.ID] {
					t.Errorf("claimed item %s (part %d, priority %d, turn %v) is not among the best %d in claim order across the parts",
						it.ID, it.Part, it.Priority, it.TurnAt, c.limit)
				}
			}
			if len(byPart) != parts {
				t.Errorf("claimed from parts %v, want all %d", byPart, parts)
			}
			// Rows the claim's transaction holds are skipped: all but the
			// claimed ones must be lockable by another transaction.
			var lockable int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM crdbwork_items WHERE queue = 'q' AND claim IS NULL
FOR UPDATE SKIP LOCKED) AS s`).Scan(&lockable); err != nil {
				t.Fatal(err)
			}
			if locked := before - lockable; locked != c.limit {
				t.Errorf("the claim of %d items over %d parts holds %d rows' locks, want %d", c.limit, parts, locked, c.limit)
			}
		})
	}
}
