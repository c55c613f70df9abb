package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

// planCase is one statement to EXPLAIN: a name for messages, its text and
// the arguments to plan it with.
type planCase struct {
	name string
	stmt string
	args []any
}

// explainEach EXPLAINs every case on one connection of pool and hands each
// plan's text to check, with the case's index and the mode: "custom" (the
// plan for these arguments), and on PostgreSQL also "generic" (the plan a
// prepared statement settles on once PostgreSQL stops planning it for each
// execution's values: PREPARE under force_generic_plan, then EXPLAIN
// EXECUTE), except for the cases skipGeneric (if not nil) names. prefix
// names the prepared statements, so that several tests may share a
// connection's session.
func explainEach(t *testing.T, pool *pgxpool.Pool, prefix string, cases []planCase, skipGeneric func(i int) bool, check func(i int, mode, plan string)) {
	t.Helper()
	ctx := context.Background()
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
				if skipGeneric != nil && skipGeneric(i) {
					continue
				}
				name := fmt.Sprint(prefix, i)
				if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+c.stmt); err != nil {
					t.Fatalf("%s: PREPARE: %v", c.name, err)
				}
				query, args = "EXPLAIN EXECUTE "+name, nil
				if len(c.args) > 0 {
					query += "(" + literals(c.args) + ")"
				}
			}
			rows, err := conn.Query(ctx, query, args...)
			if err != nil {
				t.Fatalf("%s: EXPLAIN: %v", c.name, err)
			}
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatalf("%s: EXPLAIN: %v", c.name, err)
			}
			check(i, mode, strings.Join(plan, "\n"))
		}
	}
}
