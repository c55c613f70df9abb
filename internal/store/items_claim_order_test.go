package store_test

import (
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestClaimOrderTwins: the PostgreSQL twins of the reads of a whole queue
// in claim order (the any-part claim, the urgent lane's, their sequenced
// forms, the idle probe, FairHead and FairFront) compare the queue of
// their scan with (SELECT $n::TEXT), once (sql.pgClaimOrder), and differ
// from the text CockroachDB runs by nothing else (but, for the claims, how
// their UPDATE finds the picked rows and the other parameters they hide,
// pgClaimTwin). CockroachDB's text keeps $n: it
// would not fold the subquery into a constant everywhere (on 23.1, in
// generic plans), and its scan would then not be constrained by the queue.
func TestClaimOrderTwins(t *testing.T) {
	t.Parallel()
	for _, tables := range []crsql.Tables{{}, {Schema: "work", Prefix: "jobs_"}} {
		st := store.NewStatements(tables)
		urgent := store.NewUrgentStatements(tables)
		seq := store.NewSequenceStatements(tables)
		stmts := store.New(tables)
		twins := map[string]struct {
			common, pg, param string
		}{
			"ClaimAny":             {st.ClaimAny, st.PostgresClaimAny, "$2"},
			"ClaimUrgent":          {urgent.ClaimUrgent, urgent.PostgresClaimUrgent, "$2"},
			"ClaimAnySequenced":    {seq.ClaimAny, seq.PostgresClaimAny, "$2"},
			"ClaimUrgentSequenced": {seq.ClaimUrgent, seq.PostgresClaimUrgent, "$2"},
			"FairHead":             {st.FairHead, st.PostgresFairHead, "$1"},
			"Probe":                {store.ProbeText(tables, store.Cockroach), store.ProbeText(tables, store.Postgres), "$1"},
			"FairFront":            {store.FairFrontText(stmts, store.Cockroach), store.FairFrontText(stmts, store.Postgres), "$1"},
		}
		for name, tw := range twins {
			hidden := "queue = (SELECT " + tw.param + "::TEXT) AND "
			if n := strings.Count(tw.pg, hidden); n != 1 {
				t.Errorf("%+v %s: PostgreSQL's twin compares the queue with (SELECT %s::TEXT) %d times, want once:\n%s", tables, name, tw.param, n, tw.pg)
			}
			if strings.Contains(tw.common, "::TEXT)") {
				t.Errorf("%+v %s: CockroachDB's text hides the queue:\n%s", tables, name, tw.common)
			}
			back := strings.Replace(tw.pg, hidden, "queue = "+tw.param+" AND ", 1)
			// The claims' twins also find the picked rows their own way
			// (see the claims' template).
			back = strings.Replace(back, "WHERE i.id = ANY(ARRAY(SELECT id FROM picked))", "FROM picked\nWHERE i.id = picked.id", 1)
			if strings.HasPrefix(name, "Claim") {
				// The claims' twins find them by ctid and hide the
				// parameters their plans' estimates read
				// (TestClaimTwinsDifferOnlyAsDocumented).
				back = undoClaimTwin(tw.pg)
			}
			if back != tw.common {
				t.Errorf("%+v %s: the twins differ by more than the test of the queue:\n%s\nCockroachDB's:\n%s", tables, name, tw.pg, tw.common)
			}
		}
	}
}
