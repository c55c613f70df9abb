package sql_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestStatementPlansUseIndexes seeds a 100k-item backlog (a tenth of it
// claimed, in two queues and 16 parts), ANALYZEs, and EXPLAINs every claim,
// ack, nack, release, extend and reap statement: none may scan the items
// table sequentially. On PostgreSQL it checks both the plan for the given
// parameters and the generic plan a long-lived prepared statement ends up
// with.
func TestStatementPlansUseIndexes(t *testing.T) {
	pool := testdb.New(t)
	ctx := context.Background()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	session := uuid.New()
	seed := []string{
		`INSERT INTO crdbwork_sessions (id, expiry) VALUES ('` + session.String() + `', INTERVAL '1 hour')`,
		`INSERT INTO crdbwork_items (id, queue, part, priority, vesting_at, payload, attempts, claim, claim_token, lease_until)
		 SELECT gen_random_uuid(), CASE WHEN g % 10 = 0 THEN 'other' ELSE 'q' END, g % 16, g % 5,
		        now() - g * INTERVAL '1 millisecond', '\x00'::BYTEA,
		        CASE WHEN g % 10 = 1 THEN 1 ELSE 0 END,
		        CASE WHEN g % 10 = 1 THEN '` + session.String() + `'::UUID END,
		        CASE WHEN g % 10 = 1 THEN 1 ELSE 0 END,
		        CASE WHEN g % 10 = 1 THEN now() + (g % 600) * INTERVAL '1 second' END
		 FROM generate_series(1, 100000) AS g`,
		`ANALYZE crdbwork_items`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	var ids []uuid.UUID
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_items WHERE claim IS NOT NULL LIMIT 1000`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil || len(ids) != 1000 {
		t.Fatalf("seeded claimed ids: %d, %v", len(ids), rows.Err())
	}
	sessions := make([]uuid.UUID, len(ids))
	tokens := make([]int64, len(ids))
	for i := range ids {
		sessions[i], tokens[i] = session, 1
	}
	st := crsql.NewStatements(crsql.Tables{})
	dialect, err := crsql.DetectDialect(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	claimAny, claimParts, reapLeases := st.ForDialect(dialect)
	cases := []struct {
		name string
		stmt string
		args []any
	}{
		{"ClaimAny", claimAny, []any{session, "q", 64, int64(300e6)}},
		{"ClaimAny (1000)", claimAny, []any{session, "q", 1000, int64(300e6)}},
		{"ClaimParts", claimParts, []any{session, "q", 64, int64(300e6), []int64{3, 4, 5, 6}}},
		{"ClaimParts (1000)", claimParts, []any{session, "q", 1000, int64(300e6), []int64{3, 4, 5, 6}}},
		{"AckMany", st.AckMany, []any{ids[:64], sessions[:64], tokens[:64]}},
		{"AckMany (1000)", st.AckMany, []any{ids, sessions, tokens}},
		{"AckMany (one item)", st.AckMany, []any{ids[:1], sessions[:1], tokens[:1]}},
		{"Nack", st.Nack, []any{ids[0], session, int64(1), int64(1e6), "boom"}},
		{"Release", st.Release, []any{ids[0], session, int64(1)}},
		{"DeadLetter", st.DeadLetter, []any{ids[0], session, int64(1), "boom"}},
		{"Extend", st.Extend, []any{ids, sessions, tokens, int64(300e6)}},
		{"ReapLeases", reapLeases, []any{"q", 1000}},
		{"ReapExhausted", st.ReapExhausted, []any{"q", 1000, "crash loop"}},
		{"ReleaseForgotten", st.ReleaseForgot, []any{"q", session, ids[:64]}},
		{"Cancel", st.Cancel, []any{ids[0], "q"}},
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	modes := []string{"custom"}
	if testdb.Kind(t) == "postgres" {
		modes = append(modes, "generic")
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range modes {
		for i, c := range cases {
			query, args := "EXPLAIN "+c.stmt, c.args
			if mode == "generic" {
				// The plan a prepared statement gets once PostgreSQL
				// stops planning it for each execution's values.
				name := fmt.Sprint("explained_", i)
				if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+c.stmt); err != nil {
					t.Fatalf("%s: PREPARE: %v", c.name, err)
				}
				query, args = "EXPLAIN EXECUTE "+name+"("+literals(c.args)+")", nil
			}
			rows, err := conn.Query(ctx, query, args...)
			if err != nil {
				t.Fatalf("%s: EXPLAIN: %v", c.name, err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rows.Err(); err != nil {
				t.Fatalf("%s: EXPLAIN: %v", c.name, err)
			}
			text := strings.Join(plan, "\n")
			// PostgreSQL: "Seq Scan on crdbwork_items"; CockroachDB: a "full
			// scan" of the table's primary index.
			if strings.Contains(text, "Seq Scan on crdbwork_items") || strings.Contains(text, "FULL SCAN") ||
				strings.Contains(text, "full scan") {
				t.Errorf("%s (%s) scans the items table:\n%s", c.name, mode, text)
			} else {
				t.Logf("%s (%s):\n%s", c.name, mode, text)
			}
		}
	}
}

// literals renders arguments as SQL literals for EXECUTE.
func literals(args []any) string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case uuid.UUID:
			out[i] = "'" + v.String() + "'::UUID"
		case string:
			out[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		case int, int64:
			out[i] = fmt.Sprint(v)
		case []int64:
			out[i] = "ARRAY" + strings.ReplaceAll(fmt.Sprint(v), " ", ",") + "::BIGINT[]"
		case []uuid.UUID:
			parts := make([]string, len(v))
			for j, u := range v {
				parts[j] = "'" + u.String() + "'"
			}
			out[i] = "ARRAY[" + strings.Join(parts, ",") + "]::UUID[]"
		default:
			panic(fmt.Sprintf("literals: %T", a))
		}
	}
	return strings.Join(out, ", ")
}
