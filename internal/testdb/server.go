package testdb

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// Server returns the server this test binary started for New and NewURL, so
// that a test can restart it (Restart, RestartAfter) and go on. Every test
// of the binary shares it: a test that restarts it must not run in parallel
// with others. With TEST_DATABASE_URL there is no server of ours to restart
// and the test fails; use NewServer for a server of the test's own.
func Server(t testing.TB) *dbserver.Server {
	t.Helper()
	e := mustSetup(t)
	if e.server == nil {
		t.Fatalf("testdb: Server: the databases are on the TEST_DATABASE_URL server, which tests may not restart; use testdb.NewServer")
	}
	return e.server
}

// NewServer starts a database server of the test's own (dbserver.Start,
// whatever TEST_DATABASE_URL says) and stops it when the test ends. Tests
// that restart or halt the database use it, so that other tests and test
// binaries keep their server. It returns the server and the URL of a fresh
// database on it. When no server binary exists, the test fails.
func NewServer(t testing.TB) (srv *dbserver.Server, dbURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	logf := func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "testdb: "+format+"\n", args...)
		}
	}
	srv, err := dbserver.Start(ctx, dbserver.Options{Logf: logf})
	if err != nil {
		t.Fatalf("testdb: NewServer: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("testdb: %v", err)
		}
	})
	name, n := newName()
	dbURL, err = srv.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("testdb: NewServer: %v", err)
	}
	if err := created(ctx, dbURL, n, srv.Kind()); err != nil {
		t.Fatalf("testdb: NewServer: %v", err)
	}
	return srv, dbURL
}
