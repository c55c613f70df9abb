package claim_test

import (
	"context"
	"fmt"
	"testing"

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
	const parts, n = 8, 40
	pool := setup(t)
	ctx := context.Background()
	if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	if err := q.Configure(ctx, claim.Settings{Fair: true}); err != nil {
		t.Fatal(err)
	}
	if err := q.SetTenantLimit(ctx, "limited", claim.Limit{MaxInFlight: 3}); err != nil {
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
	if err := q.Configure(ctx, s); err != nil {
		t.Fatal(err)
	}
	enqueueTenant("default-limited", "")
	onePart("default-limited", claim.PartOf("", "default-limited", parts))

	// A plain queue: the tenant's part.
	s.Fair, s.TenantMaxInFlight = false, 0
	if err := q.Configure(ctx, s); err != nil {
		t.Fatal(err)
	}
	enqueueTenant("plain", "")
	onePart("plain", claim.PartOf("", "plain", parts))
}
