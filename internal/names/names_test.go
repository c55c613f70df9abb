package names

import (
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRewrite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ schema, prefix, in, want string }{
		{"", "", `SELECT id FROM crdbwork_items`, `SELECT id FROM "crdbwork_items"`},
		{"w s", "p_", `INSERT INTO crdbwork_items (id) VALUES ($1)`, `INSERT INTO "w s"."p_items" (id) VALUES ($1)`},
		// An index is never qualified where it is created (it lives in its
		// table's schema), and always where it is dropped.
		{"w s", "p_", `CREATE INDEX IF NOT EXISTS crdbwork_items_lease ON crdbwork_items (lease_until)`,
			`CREATE INDEX IF NOT EXISTS "p_items_lease" ON "w s"."p_items" (lease_until)`},
		{"w s", "p_", `DROP INDEX IF EXISTS crdbwork_items_turn_next;`, `DROP INDEX IF EXISTS "w s"."p_items_turn_next";`},
		{"", "p_", `DROP INDEX IF EXISTS crdbwork_items_turn_next;`, `DROP INDEX IF EXISTS "p_items_turn_next";`},
		// The function is qualified like the tables.
		{"w", "", `SELECT crdbwork_enqueue($1)`, `SELECT "w"."crdbwork_enqueue"($1)`},
	} {
		if got := Rewrite(c.schema, c.prefix, c.in); got != c.want {
			t.Errorf("Rewrite(%q, %q, %q)\n= %s\nwant %s", c.schema, c.prefix, c.in, got, c.want)
		}
	}
	if !slices.Contains(Tables(), "items") || slices.Contains(Tables(), "enqueue") {
		t.Errorf("Tables() = %v: want the tables, not the functions", Tables())
	}
}

func TestMissingRelation(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"42P01": true, "3F000": true, "40001": false} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		if got := MissingRelation(err); got != want {
			t.Errorf("MissingRelation(%s) = %v, want %v", code, got, want)
		}
	}
	if MissingRelation(fmt.Errorf("not a server error")) {
		t.Error("MissingRelation of a plain error")
	}
}
