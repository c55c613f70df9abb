package claim_test

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
)

// TestClaimUrgentKeepsLimitedTenantsToOwnedParts: with the limited
// tenants named, the lane takes their items only from the session's own
// parts, and every other item from any part; with every tenant limited,
// only items without a tenant come from other parts.
func TestClaimUrgentKeepsLimitedTenantsToOwnedParts(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	for _, c := range []struct {
		queue string
		req   claim.UrgentRequest
		want  string // part/tenant of the claimed items, sorted
	}{
		{"named", claim.UrgentRequest{LimitedTenants: []string{"lim"}}, "0/ 0/free 0/lim 1/ 1/free"},
		{"all", claim.UrgentRequest{AllTenantsLimited: true}, "0/ 0/free 0/lim 1/"},
		{"none", claim.UrgentRequest{}, "0/ 0/free 0/lim 1/ 1/free 1/lim"},
	} {
		q := newQueue(t, pool, claim.Options{Queue: c.queue})
		var items []claim.NewItem
		for p := range 2 {
			for _, tenant := range []string{"", "free", "lim"} {
				items = append(items, claim.NewItem{Payload: []byte{byte(p)}, Tenant: tenant})
			}
		}
		if _, err := q.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
		// Put each item in the part its payload names.
		if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET part = get_byte(payload, 0) WHERE queue = $1`, c.queue); err != nil {
			t.Fatal(err)
		}
		req := c.req
		req.Max, req.MaxPriority, req.OwnedParts = 100, 0, []int{0}
		got, err := q.Claimer(s.ID()).ClaimUrgent(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, it := range got {
			names = append(names, string(rune('0'+it.Part))+"/"+it.Tenant)
		}
		sort.Strings(names)
		if g := strings.Join(names, " "); g != c.want {
			t.Errorf("%s: the lane claimed %q; want %q", c.queue, g, c.want)
		}
	}
}
