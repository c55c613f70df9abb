package store_test

import (
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestUrgentClaimStatement: the lane's claim is the any-part claim with the
// priority bound and the limited tenants' parts, on both engines, and
// follows the table names.
func TestUrgentClaimStatement(t *testing.T) {
	t.Parallel()
	st := store.NewStatements(crsql.Tables{})
	u := store.NewUrgentStatements(crsql.Tables{})
	for _, c := range []struct{ name, lane, any string }{
		{"cockroach", u.ForDialect(store.Cockroach), st.ClaimAny},
		{"postgres", u.ForDialect(store.Postgres), st.PostgresClaimAny},
	} {
		if strings.Count(c.lane, "priority <= $6") != 1 {
			t.Errorf("%s: the lane's claim has no single priority bound:\n%s", c.name, c.lane)
		}
		const limited = "(tenant IS NULL OR part = ANY($9::BIGINT[]) OR (NOT $7::BOOL AND NOT (tenant = ANY($8::TEXT[])))) AND "
		if strings.Count(c.lane, limited) != 1 {
			t.Errorf("%s: the lane's claim does not keep limited tenants' items to owned parts:\n%s", c.name, c.lane)
		}
		if got := strings.Replace(c.lane, "priority <= $6 AND "+limited, "", 1); got != c.any {
			t.Errorf("%s: the lane's claim is not the any-part claim plus its bound:\n%s\nwant:\n%s", c.name, c.lane, c.any)
		}
	}
	x := store.NewUrgentStatements(crsql.Tables{Prefix: "x_"})
	if strings.Contains(x.ClaimUrgent, "crdbwork_") || !strings.Contains(x.ClaimUrgent, `"x_items"`) {
		t.Fatalf("statement not renamed: %s", x.ClaimUrgent)
	}
}
