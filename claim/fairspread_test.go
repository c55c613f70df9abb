package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// In a fair queue, a tenant's items without a key are spread over the parts
// by turn (consecutive turns in parts claim.SpreadStride apart), so every part holds its
// share of every tenant's backlog; a tenant with a limit (its own, or the
// queue's default tenant limit) keeps its one part, as do items with a key,
// and in a plain queue nothing changes.
func TestFairQueueSpreadsTenantsOverParts(t *testing.T) {
	t.Parallel()
	const parts, n = 8, 40
	pool, q := fairQueueWithParts(t, parts)
	ctx := context.Background()
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"limited": &claim.Limit{MaxInFlight: 3}}}); err != nil {
		t.Fatal(err)
	}
	enqueueTenant := func(tenant, key string) {
		t.Helper()
		items := make([]claim.NewItem, n)
		for i := range items {
			items[i] = claim.NewItem{Payload: []byte("x"), Tenant: tenant, Key: key}
		}
		// Two calls: the second continues from the tenant's last turn.
		if _, err := q.Enqueue(ctx, items[:n/2]...); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Enqueue(ctx, items[n/2:]...); err != nil {
			t.Fatal(err)
		}
	}
	// perPart returns how many of tenant's items each part holds.
	perPart := func(tenant string) []int {
		t.Helper()
		counts := make([]int, parts)
		rows, err := pool.Query(ctx, `SELECT part, count(*) FROM crdbwork_items WHERE tenant = $1 GROUP BY part`, tenant)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p, c int64
			if err := rows.Scan(&p, &c); err != nil {
				t.Fatal(err)
			}
			counts[p] = int(c)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return counts
	}
	onePart := func(tenant string, part int) {
		t.Helper()
		counts := perPart(tenant)
		if counts[part] != n {
			t.Errorf("%s: items per part %v; want all %d in part %d", tenant, counts, n, part)
		}
	}

	enqueueTenant("spread", "")
	if counts := perPart("spread"); fmt.Sprint(counts) != fmt.Sprint([]int{5, 5, 5, 5, 5, 5, 5, 5}) {
		t.Errorf("spread: items per part %v; want 5 in each of the %d parts", counts, parts)
	}
	// Consecutive turns go to parts SpreadStride apart.
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT part, lag(part) OVER (ORDER BY turn_at) AS prev FROM crdbwork_items WHERE tenant = 'spread') AS s
		WHERE prev IS NOT NULL AND part <> (prev + $2) % $1`, parts, claim.SpreadStride%parts).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Errorf("spread: %d items whose part does not follow their previous turn's", bad)
	}

	enqueueTenant("limited", "")
	onePart("limited", claim.PartOf("", "limited", parts))
	enqueueTenant("keyed", "k1")
	onePart("keyed", claim.PartOf("k1", "keyed", parts))

	// A default tenant limit: no tenant is spread.
	s, err := q.Settings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.TenantMaxInFlight = 10
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy}); err != nil {
		t.Fatal(err)
	}
	enqueueTenant("default-limited", "")
	onePart("default-limited", claim.PartOf("", "default-limited", parts))

	// A plain queue: the tenant's part.
	s.Fair, s.TenantMaxInFlight = false, 0
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy}); err != nil {
		t.Fatal(err)
	}
	enqueueTenant("plain", "")
	onePart("plain", claim.PartOf("", "plain", parts))
}

// TestFairClaimReadsEachPartUpToItsShare: in a fair queue a claim over
// several parts reads each part up to its share of the claim (⌈1.5·n/k⌉),
// not up to the whole claim, and the parts that gave their whole share are
// read again for the rest: a claim comes back full whenever its parts hold
// enough claimable items, however they are spread. A plain queue's claim
// still takes the best n across the parts.
func TestFairClaimReadsEachPartUpToItsShare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		fair bool
		// others: items in each of parts 1 to 3, after part 0's 60 in turn
		// order.
		others int
		// fromPart0: how many of the claim's 40 items part 0 gives.
		fromPart0 int
	}{
		{"fair, every part holds items", true, 10, 15},         // its share; the other 25 from parts 1 to 3
		{"fair, the other parts empty", true, 0, 40},           // its share, then the rest
		{"plain, every part holds items", false, 10, 40},       // the best 40 across the parts
		{"fair, the other parts hold a few", true, 2, 15 + 19}, // its share, 6 of the others, then part 0 again
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ctx := context.Background()
			s := startSession(t, ctx, pool)
			exec := func(q string, args ...any) {
				t.Helper()
				if _, err := pool.Exec(ctx, q, args...); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			q := newQueue(t, pool, claim.Options{Queue: "q"})
			if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: c.fair}}); err != nil {
				t.Fatal(err)
			}
			exec(`UPDATE crdbwork_queues SET num_parts = 8 WHERE name = 'q'`)
			for p := range 4 {
				exec(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, s.ID(), p)
			}
			// Part 0: 60 items at turns 1..60 ms; parts 1 to 3: c.others
			// each, after them.
			exec(`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, tenant)
			      SELECT gen_random_uuid(), 'q', 0, now() - INTERVAL '1 hour', now() - INTERVAL '1 hour' + g * INTERVAL '1 millisecond', '\x00'::BYTEA, 't'
			      FROM generate_series(1, 60) AS g`)
			exec(`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, tenant)
			      SELECT gen_random_uuid(), 'q', 1 + g % 3, now() - INTERVAL '1 hour', now() - INTERVAL '1 hour' + (100 + g) * INTERVAL '1 millisecond', '\x00'::BYTEA, 't'
			      FROM generate_series(1, $1) AS g`, 3*c.others)
			got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 40, Parts: []int{0, 1, 2, 3}})
			if err != nil {
				t.Fatal(err)
			}
			part0 := 0
			var last time.Time
			for _, it := range got {
				if it.Part == 0 {
					part0++
					if it.TurnAt.Before(last) {
						t.Errorf("part 0's items out of turn order: %v after %v", it.TurnAt, last)
					}
					last = it.TurnAt
				}
			}
			if len(got) != 40 || part0 != c.fromPart0 {
				t.Fatalf("claimed %d items, %d of part 0; want 40, %d of part 0", len(got), part0, c.fromPart0)
			}
			// Part 0's items claimed are its earliest.
			var behind int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = 'q' AND part = 0 AND claim IS NULL
			    AND turn_at < (SELECT max(turn_at) FROM crdbwork_items WHERE queue = 'q' AND part = 0 AND claim IS NOT NULL)`).Scan(&behind); err != nil {
				t.Fatal(err)
			}
			if behind != 0 {
				t.Errorf("%d of part 0's items left unclaimed before one claimed", behind)
			}
		})
	}
}

// fairQueueWithParts returns a fresh database's pool and its default
// queue, made fair with the given number of parts.
func fairQueueWithParts(t *testing.T, parts int) (*pgxpool.Pool, *claim.Queue) {
	t.Helper()
	pool := setup(t)
	ctx := context.Background()
	if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	return pool, q
}
