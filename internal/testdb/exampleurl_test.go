package testdb

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestExampleURL(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	u, cleanup := ExampleURL()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		cleanup()
		t.Fatal(err)
	}
	var name string
	err = conn.QueryRow(ctx, "SELECT current_database()").Scan(&name)
	conn.Close(ctx)
	cleanup()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = New(t).QueryRow(ctx, "SELECT count(*) FROM pg_catalog.pg_database WHERE datname = $1", name).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database %s still exists after cleanup", name)
	}
}
