package testdb

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/await"
)

// A test restarts the server of its database and goes on with the same
// pool; a server of its own keeps its data across a restart. Not parallel:
// it restarts the server every test of the binary uses (parallel tests run
// after the sequential ones).
func TestServerRestart(t *testing.T) {
	if os.Getenv("TEST_DATABASE_URL") != "" {
		t.Skip("the databases are on the TEST_DATABASE_URL server, which tests may not restart")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := New(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE kept (v INT)`); err != nil {
		t.Fatal(err)
	}
	if err := Server(t).Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the restart; the pool reconnects.
	await.Until(t, "the pool to work after the restart", func() error {
		_, err := pool.Exec(ctx, `INSERT INTO kept VALUES (1)`)
		return err
	})

	srv, dbURL := NewServer(t)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE mine (v INT); INSERT INTO mine VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := srv.RestartAfter(ctx, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect after the restart: %v", err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, `SELECT v FROM mine`).Scan(&v); err != nil || v != 7 {
		t.Errorf("after the restart: %d, %v; want 7", v, err)
	}
}
