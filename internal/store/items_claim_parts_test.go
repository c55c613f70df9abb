package store_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestClaimShapesAreUncorrelated: the per-part claims and the fair turns'
// reads must not be correlated subqueries over a set of parts or pairs
// (LATERAL, or a subquery fed by unnest of a parameter): CockroachDB's
// optimizer may decorrelate those into scans of every matching row
// (cockroachdb/cockroach#68299, #165983). Each per-part branch reads one
// part given as its own parameter, and the k-part claim has k of them.
func TestClaimShapesAreUncorrelated(t *testing.T) {
	t.Parallel()
	p := store.NewPartClaimStatements(crsql.Tables{})
	st := store.NewStatements(crsql.Tables{})
	check := func(name, s string) {
		t.Helper()
		// PostgreSQL's per-part claims lock each candidate they reach by
		// its row version (pgLockLazily): a LATERAL of one TID each,
		// which no rule turns into a scan; CockroachDB's text has none.
		s = lazyLock.ReplaceAllString(s, "")
		if strings.Contains(strings.ToUpper(s), "LATERAL") || strings.Contains(s, "unnest(") {
			t.Errorf("%s is a correlated shape (LATERAL or unnest):\n%s", name, s)
		}
	}
	// A part is a parameter, on PostgreSQL hidden as (SELECT $n::BIGINT)
	// (pgPlanOnce).
	partEq := regexp.MustCompile(`part = (\$\d+|\(SELECT \$\d+::BIGINT\))`)
	for k := 1; k <= store.MaxPartBranches; k++ {
		for _, d := range []store.Dialect{store.Postgres, store.Cockroach} {
			s := p.Claim(d, k)
			check("Claim", s)
			if got := len(partEq.FindAllString(s, -1)); got != k {
				t.Errorf("Claim(%v, %d) reads %d parts", d, k, got)
			}
			if again := p.Claim(d, k); again != s {
				t.Errorf("Claim(%v, %d) is not stable", d, k)
			}
			shares := p.ClaimShares(d, k)
			check("ClaimShares", shares)
			if got := len(partEq.FindAllString(shares, -1)); got != k {
				t.Errorf("ClaimShares(%v, %d) reads %d parts", d, k, got)
			}
			// The same statement but for each branch's limit: its own
			// parameter after the parts.
			share, limit := fmt.Sprintf("LIMIT $%d\n", 6+k), "LIMIT $3\n"
			if d == store.Postgres {
				// Its branches end at their limits: they do not lock
				// (pgLockLazily).
				share, limit = fmt.Sprintf("LIMIT (SELECT $%d::BIGINT)) AS p", 6+k), "LIMIT (SELECT $3::BIGINT)) AS p"
			}
			if got := strings.Count(shares, share); got != k || strings.ReplaceAll(shares, share, limit) != s {
				t.Errorf("ClaimShares(%v, %d) is not Claim with each branch's limit %q (%d branches):\n%s", d, k, share, got, shares)
			}
		}
		s := p.Pick(k)
		check("Pick", s)
		if got := len(partEq.FindAllString(s, -1)); got != k {
			t.Errorf("Pick(%d) reads %d parts", k, got)
		}
	}
	fair := store.NewFairStatements(crsql.Tables{})
	tenantEq := regexp.MustCompile(`tenant = \$(\d+)`)
	for k := 1; k <= store.MaxFairPairs; k++ {
		s := fair.Lasts(k)
		check("Lasts", s)
		if got := len(tenantEq.FindAllString(s, -1)); got != k {
			t.Errorf("Lasts(%d) reads %d tenants", k, got)
		}
	}
	check("FairHead", st.FairHead)
	check("PostgresFairHead", st.PostgresFairHead)
	for _, k := range []int{0, store.MaxPartBranches + 1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Claim of %d parts did not panic", k)
				}
			}()
			p.Claim(store.Postgres, k)
		}()
	}
}
