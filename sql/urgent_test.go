package sql_test

import (
	"strings"
	"testing"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestUrgentClaimStatement: the lane's claim is the any-part claim with the
// priority bound, on both engines, and follows the table names.
func TestUrgentClaimStatement(t *testing.T) {
	st := crsql.NewStatements(crsql.Tables{})
	u := crsql.NewUrgentStatements(crsql.Tables{})
	for _, c := range []struct{ name, lane, any string }{
		{"cockroach", u.ForDialect(crsql.Cockroach), st.ClaimAny},
		{"postgres", u.ForDialect(crsql.Postgres), st.PostgresClaimAny},
	} {
		if strings.Count(c.lane, "priority <= $6") != 1 {
			t.Errorf("%s: the lane's claim has no single priority bound:\n%s", c.name, c.lane)
		}
		if got := strings.Replace(c.lane, "priority <= $6 AND ", "", 1); got != c.any {
			t.Errorf("%s: the lane's claim is not the any-part claim plus its bound:\n%s\nwant:\n%s", c.name, c.lane, c.any)
		}
	}
	x := crsql.NewUrgentStatements(crsql.Tables{Prefix: "x_"})
	if strings.Contains(x.ClaimUrgent, "crdbwork_") || !strings.Contains(x.ClaimUrgent, `"x_items"`) {
		t.Fatalf("statement not renamed: %s", x.ClaimUrgent)
	}
}
