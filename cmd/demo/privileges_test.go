package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/testdb"
)

// `demo work` as a database user that lacks the worker's grants on one
// table exits 2 at start with one line naming the user, the table and the
// privileges, and the roles' docs (before: it started, and its reap turns
// were refused over and over).
func TestWorkWithoutTheGrantsExits2(t *testing.T) {
	t.Parallel()
	dbURL, env, pool := migrated(t)
	if testdb.Kind(t) != "postgres" {
		t.Skip("the role logs in through the PostgreSQL test server's trust authentication")
	}
	// The demo's queue and tables, made by the owner.
	if r := demo(t, time.Minute, env, "enqueue", "--count", "1"); r.code != 0 {
		t.Fatalf("demo enqueue: %s", r.stderr)
	}
	role := "demo_worker_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	ctx := context.Background()
	for _, s := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + role,
		`REVOKE INSERT, UPDATE, DELETE ON crdbwork_reaps FROM ` + role,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	r := demo(t, time.Minute, demoEnv("DATABASE_URL="+u.String()), "work", "--name", "w")
	wantExit(t, r, 2, `demo: worker: the database user lacks privileges the worker needs: user "`+role+
		`" lacks INSERT, UPDATE, DELETE on crdbwork_reaps (docs/operations.md, "Roles and grants"): GRANT INSERT, UPDATE, DELETE ON crdbwork_reaps TO `+role)
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Errorf("the refused worker started %d sessions", n)
	}
}
