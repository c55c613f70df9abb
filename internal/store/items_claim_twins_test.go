package store_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// hiddenParam is a parameter a PostgreSQL claim twin compares through
// (SELECT $n::type) (pgClaimOrder, pgPlanOnce).
var hiddenParam = regexp.MustCompile(`\(SELECT (\$\d+)::(TEXT|BIGINT)\)`)

// lazyLock is the lock of a candidate in PostgreSQL's per-part claims
// (pgLockLazily), on any tables' names; lazyBranchEnd the end of a branch
// that does not lock.
var (
	lazyLock      = regexp.MustCompile(`\n    CROSS JOIN LATERAL \(SELECT x\.ctid FROM \S+ AS x WHERE x\.ctid = c\.ctid AND x\.claim IS NULL FOR UPDATE SKIP LOCKED\) AS l`)
	lazyBranchEnd = regexp.MustCompile(`(LIMIT \(SELECT \$\d+::BIGINT\))\) AS p(\d+)`)
)

// undoClaimTwin maps the PostgreSQL twin of the plain or per-part claim
// back to CockroachDB's text: the lazy locks back to locking branches
// (pgLockLazily), the row versions back to ids (pgByRowVersion) and the
// hidden parameters back to plain ones (pgClaimOrder, pgPlanOnce).
func undoClaimTwin(pg string) string {
	s := strings.Replace(undoLazyLock(pg), "WHERE i.ctid = ANY(ARRAY(SELECT ctid FROM picked))", "FROM picked\nWHERE i.id = picked.id", 1)
	s = strings.Replace(s, "SELECT c.ctid FROM (", "SELECT c.id FROM (", 1)
	s = strings.ReplaceAll(s, "SELECT ctid, priority, turn_at FROM", "SELECT id, priority, turn_at FROM")
	s = strings.Replace(s, "WITH picked AS MATERIALIZED (\n    SELECT ctid FROM ", "WITH picked AS MATERIALIZED (\n    SELECT id FROM ", 1)
	s = strings.ReplaceAll(s, "ANY((SELECT $5::TEXT[])::TEXT[])", "ANY($5::TEXT[])")
	return hiddenParam.ReplaceAllString(s, "$1")
}

// undoLazyLock maps PostgreSQL's per-part claim back to its form with
// locking branches (undoes pgLockLazily); other texts are returned as they
// are.
func undoLazyLock(pg string) string {
	if !lazyLock.MatchString(pg) {
		return pg
	}
	pg = lazyLock.ReplaceAllString(pg, "")
	pg = strings.Replace(pg, "SELECT l.ctid FROM (", "SELECT c.ctid FROM (", 1)
	return lazyBranchEnd.ReplaceAllString(pg, "$1\n            FOR UPDATE SKIP LOCKED) AS p$2")
}

// TestClaimTwinsDifferOnlyAsDocumented: PostgreSQL's twins of the claims
// (plain, per-part, the urgent lane's, and their sequenced forms) find the picked rows by the row versions their CTE
// locked (ctid, a TID scan) and compare every parameter their plans'
// estimates read through (SELECT $n::type), so that PostgreSQL plans them
// once per connection (pgPlanOnce); the per-part claims (not their
// sequenced forms) lock each candidate as their order reaches it
// (pgLockLazily); they differ from CockroachDB's text by nothing else, and
// CockroachDB's text has none of it.
func TestClaimTwinsDifferOnlyAsDocumented(t *testing.T) {
	t.Parallel()
	for _, tables := range []crsql.Tables{{}, {Schema: "work", Prefix: "jobs_"}} {
		st := store.NewStatements(tables)
		p := store.NewPartClaimStatements(tables)
		type twin struct{ name, common, pg string }
		u := store.NewUrgentStatements(tables)
		seq := store.NewSequenceStatements(tables)
		twins := []twin{
			{"ClaimAny", st.ClaimAny, st.PostgresClaimAny},
			{"ClaimUrgent", u.ClaimUrgent, u.PostgresClaimUrgent},
			{"ClaimAnySequenced", seq.ClaimAny, seq.PostgresClaimAny},
			{"ClaimUrgentSequenced", seq.ClaimUrgent, seq.PostgresClaimUrgent},
		}
		for k := 1; k <= store.MaxPartBranches; k++ {
			twins = append(twins,
				twin{fmt.Sprintf("Claim(%d)", k), p.Claim(store.Cockroach, k), p.Claim(store.Postgres, k)},
				twin{fmt.Sprintf("ClaimShares(%d)", k), p.ClaimShares(store.Cockroach, k), p.ClaimShares(store.Postgres, k)},
				twin{fmt.Sprintf("ClaimPartsSequenced(%d)", k), seq.ClaimParts(store.Cockroach, k), seq.ClaimParts(store.Postgres, k)})
		}
		for _, tw := range twins {
			if strings.Contains(tw.common, "ctid") || strings.Contains(tw.common, "::BIGINT)") || strings.Contains(tw.common, "(SELECT $") {
				t.Errorf("%+v %s: CockroachDB's text uses PostgreSQL's forms:\n%s", tables, tw.name, tw.common)
			}
			if !strings.Contains(tw.pg, "WHERE i.ctid = ANY(ARRAY(SELECT ctid FROM picked))") {
				t.Errorf("%+v %s: PostgreSQL's twin does not find the picked rows by ctid:\n%s", tables, tw.name, tw.pg)
			}
			// No parameter the plan's estimates read stays visible: the
			// limits, the queue and the parts of the scans, the tenants.
			for _, visible := range []string{"LIMIT $", "queue = $2 AND claim", "part = $", "ANY($5"} {
				if strings.Contains(tw.pg, visible) {
					t.Errorf("%+v %s: PostgreSQL's twin has %q:\n%s", tables, tw.name, visible, tw.pg)
				}
			}
			lazy := strings.HasPrefix(tw.name, "Claim(") || strings.HasPrefix(tw.name, "ClaimShares(")
			if got := len(lazyLock.FindAllString(tw.pg, -1)); got != map[bool]int{true: 1}[lazy] || lazyLock.MatchString(tw.common) {
				t.Errorf("%+v %s: %d lazy locks in PostgreSQL's twin (want 1 in the per-part claims, else none):\n%s", tables, tw.name, got, tw.pg)
			}
			if back := undoClaimTwin(tw.pg); back != tw.common {
				t.Errorf("%+v %s: the twins differ by more than documented:\n%s\nCockroachDB's:\n%s", tables, tw.name, tw.pg, tw.common)
			}
		}
	}
}

// TestClaimsArePlannedOncePerConnection: on PostgreSQL a prepared claim
// (pgx prepares every statement once per connection) settles on its
// generic plan after the five runs PostgreSQL plans for the parameters,
// instead of being planned at every run (pgPlanOnce; issue #32: 0.3–0.4 ms
// of server CPU per claim). It reads pg_prepared_statements' counts of
// custom and generic plans after a dozen claims of each kind, which claim
// items all along (the plans are those of a working queue).
func TestClaimsArePlannedOncePerConnection(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("PostgreSQL's plan cache; CockroachDB's text is unchanged")
	}
	pool := newSchemaDB(t)
	ctx := context.Background()
	session := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (id, expiry) VALUES ($1, INTERVAL '1 hour')`, session); err != nil {
		t.Fatal(err)
	}
	for part := range 4 {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'q', $2)`, session, part); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, payload)
SELECT gen_random_uuid(), q, g % 4, '\x'::BYTEA FROM generate_series(1, 10000) AS g, (VALUES ('q'), ('plain')) AS v (q)`); err != nil {
		t.Fatal(err)
	}
	// Statistics of a queue with a backlog: the estimates of a plan that
	// cannot see the limit (a tenth of the rows) then cost far more than
	// those of one made for a limit of 5, and a claim whose limit the plan
	// sees is planned at every run.
	if _, err := pool.Exec(ctx, `ANALYZE crdbwork_items`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	s := store.New(crsql.Tables{})
	const runs = 12
	plain := store.ClaimArgs{Session: session, Queue: "plain", Limit: 5, Lease: time.Hour}
	parts := plain
	parts.Queue = "q"
	claimed := map[uuid.UUID]bool{}
	for range runs {
		a, err := s.ItemsClaimAny(ctx, conn, store.Postgres, plain)
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.ItemsClaimParts(ctx, conn, store.Postgres, parts, []int64{0, 1, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != plain.Limit || len(b) != parts.Limit {
			t.Fatalf("a claim of %d got %d plain and %d in parts", plain.Limit, len(a), len(b))
		}
		for _, r := range append(a, b...) {
			if claimed[r.ID] {
				t.Fatalf("item %v claimed twice", r.ID)
			}
			claimed[r.ID] = true
		}
	}
	rows, err := conn.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements
WHERE statement LIKE 'WITH picked AS MATERIALIZED%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var text string
		var generic, custom int64
		if err := rows.Scan(&text, &generic, &custom); err != nil {
			t.Fatal(err)
		}
		seen++
		// PostgreSQL plans a prepared statement for its parameters at its
		// first five runs, then compares; a statement planned at every run
		// shows runs custom plans and no generic one.
		if custom > 5 || generic+custom < runs {
			t.Errorf("a claim ran %d times with %d generic and %d custom plans, want at most 5 custom:\n%s", runs, generic, custom, text)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != 2 {
		t.Fatalf("found %d prepared claims, want 2 (the plain claim and the 4-part claim)", seen)
	}
}
