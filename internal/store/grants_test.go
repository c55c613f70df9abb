package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// GrantsLacking names the tables as the store's tables name them (a schema
// that needs quotes, a prefix) and returns exactly the privileges the user
// lacks, in the list's order; GrantStatements gives them back.
func TestGrantsLackingWithSchemaAndPrefix(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("SET ROLE to a role of the test: PostgreSQL's test server")
	}
	pool := testdb.New(t)
	ctx := context.Background()
	tables := crsql.Tables{Schema: "Work Space", Prefix: "p_"}
	if err := crsql.Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	role := "grants_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	for _, s := range []string{
		`CREATE ROLE ` + role,
		`GRANT USAGE ON SCHEMA "Work Space" TO ` + role,
		`GRANT SELECT ON ALL TABLES IN SCHEMA "Work Space" TO ` + role,
		`GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "Work Space" TO ` + role,
		`REVOKE UPDATE ON "Work Space".p_items FROM ` + role,
		`REVOKE SELECT, DELETE ON "Work Space".p_reaps FROM ` + role,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET ROLE`)
	user, lacking, err := store.New(tables).GrantsLacking(ctx, conn, store.WorkerGrants)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Grant{
		{Table: `"Work Space".p_items`, Privileges: []string{"UPDATE"}},
		{Table: `"Work Space".p_reaps`, Privileges: []string{"SELECT", "DELETE"}},
	}
	if user != role || len(lacking) != len(want) {
		t.Fatalf("GrantsLacking = %q, %+v; want %q, %+v", user, lacking, role, want)
	}
	for i := range want {
		if lacking[i].Table != want[i].Table || strings.Join(lacking[i].Privileges, ",") != strings.Join(want[i].Privileges, ",") {
			t.Errorf("lacking[%d] = %+v, want %+v", i, lacking[i], want[i])
		}
	}
	got := strings.Join(store.GrantStatements(lacking, role), "; ")
	if w := `GRANT UPDATE ON "Work Space".p_items TO ` + role + `; GRANT SELECT, DELETE ON "Work Space".p_reaps TO ` + role; got != w {
		t.Errorf("GrantStatements = %s, want %s", got, w)
	}
}
