package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
)

// TestClaimPartsOrderAcrossParts: a session owning k parts claims, call
// after call, exactly the best n unclaimed items of its parts in (priority,
// turn) order, each once, whether its parts fit one per-part claim
// statement (k <= store.MaxPartBranches) or need several picks in one
// transaction (k above it). Items of parts it does not own are never
// claimed, and neither are items of tenants it skips.
func TestClaimPartsOrderAcrossParts(t *testing.T) {
	t.Parallel()
	for _, k := range []int{1, 5, store.MaxPartBranches, store.MaxPartBranches + 1, 2*store.MaxPartBranches + 7} {
		t.Run(fmt.Sprint(k, " parts"), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			s := startSession(t, ctx, pool)
			const total = 48 // parts of the queue: the session owns 0..k-1
			exec := func(q string, args ...any) {
				t.Helper()
				if _, err := pool.Exec(ctx, q, args...); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			exec(`INSERT INTO crdbwork_queues (name, num_parts) VALUES ('q', $1)`, total)
			owned := make([]int, k)
			for p := range k {
				owned[p] = p
				exec(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, s.ID(), p)
			}
			// 20 items per part, priorities 0..2, turns spread so that the
			// best items are scattered over the parts; every fifth item
			// belongs to tenant "skip".
			exec(`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload, tenant)
			      SELECT gen_random_uuid(), 'q', g % $1, (g * 7) % 3, now() - INTERVAL '1 hour',
			             now() - INTERVAL '1 hour' + ((g * 7919) % 10007) * INTERVAL '1 millisecond', '\x00'::BYTEA,
			             CASE WHEN g % 5 = 0 THEN 'skip' END
			      FROM generate_series(1, $1 * 20) AS g`, total)
			q := newQueue(t, pool, claim.Options{Queue: "q"})
			seen := map[uuid.UUID]bool{}
			for call := 0; ; call++ {
				want := bestUnclaimed(t, pool, k, 7)
				got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 7, Parts: owned, SkipTenants: []string{"skip"}})
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(want) {
					t.Fatalf("call %d: claimed %d items, want %d", call, len(got), len(want))
				}
				for i, it := range got {
					if it.ID != want[i] {
						t.Fatalf("call %d: item %d is %s (part %d, priority %d, turn %v), want %s: not the best in (priority, turn) order", call, i, it.ID, it.Part, it.Priority, it.TurnAt, want[i])
					}
					if seen[it.ID] || it.Part >= k || it.Tenant == "skip" || !it.InPart {
						t.Fatalf("call %d: item %s (part %d, tenant %q, in part %v) claimed twice, outside the owned parts, of a skipped tenant, or not as a part claim", call, it.ID, it.Part, it.Tenant, it.InPart)
					}
					seen[it.ID] = true
				}
				if len(got) == 0 {
					break
				}
			}
			if want := k * 20 * 4 / 5; len(seen) != want {
				t.Fatalf("claimed %d items in all, want %d (every item of the owned parts but the skipped tenant's)", len(seen), want)
			}
		})
	}
}

// bestUnclaimed returns the ids of the best n unclaimed items of parts
// 0..k-1 of queue q without tenant "skip", in claim order.
func bestUnclaimed(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, k, n int) []uuid.UUID {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT id FROM crdbwork_items
		WHERE queue = 'q' AND part < $1 AND claim IS NULL AND tenant IS DISTINCT FROM 'skip'
		ORDER BY priority, turn_at LIMIT $2`, k, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestClaimManyPartsNotOwner: a claim over more parts than one statement
// reads, one of which the session does not own, fails with ErrNotOwner and
// claims nothing when that part's item is among the best.
func TestClaimManyPartsNotOwner(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	k := store.MaxPartBranches + 4
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ('q', $1)`, k); err != nil {
		t.Fatal(err)
	}
	parts := make([]int, k)
	for p := range k {
		parts[p] = p
		if p == k-1 {
			continue // not owned
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, s.ID(), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, turn_at, payload)
		SELECT gen_random_uuid(), 'q', g % $1, CASE WHEN g % $1 = $1 - 1 THEN 0 ELSE 1 END, now(), now(), '\x00'::BYTEA
		FROM generate_series(1, $1 * 3) AS g`, k); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 5, Parts: parts})
	if !errors.Is(err, claim.ErrNotOwner) || len(got) != 0 {
		t.Fatalf("Claim with an unowned part = %d items, %v; want ErrNotOwner", len(got), err)
	}
	var held int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d items claimed after the refused claim (%v)", held, err)
	}
}

// TestClaimManyPartsAtMostOnce: at-most-once items claimed by a session
// that owns more parts than one statement reads are deleted by the claim,
// in its transaction, and handed out once.
func TestClaimManyPartsAtMostOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	k := store.MaxPartBranches + 3
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ('q', $1)`, k); err != nil {
		t.Fatal(err)
	}
	parts := make([]int, k)
	for p := range k {
		parts[p] = p
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, s.ID(), p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, at_most_once, max_attempts)
		SELECT gen_random_uuid(), 'q', g % $1, now(), now() - g * INTERVAL '1 millisecond', '\x00'::BYTEA, g % 2 = 0, CASE WHEN g % 2 = 0 THEN 1 ELSE 25 END
		FROM generate_series(1, $1 * 2) AS g`, k); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2 * k, Parts: parts})
	if err != nil {
		t.Fatal(err)
	}
	amo := 0
	for _, it := range got {
		if it.AtMostOnce {
			amo++
		}
	}
	var left, leftAMO int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE at_most_once) FROM crdbwork_items`).Scan(&left, &leftAMO); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2*k || amo != k || left != k || leftAMO != 0 {
		t.Fatalf("claimed %d items (%d at most once); %d left in the table (%d at most once); want %d claimed, %d at most once and deleted, %d left", len(got), amo, left, leftAMO, 2*k, k, k)
	}
}
