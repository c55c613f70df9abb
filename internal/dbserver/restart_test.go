package dbserver

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/await"
)

// A restarted server keeps its data and its URL; open connections are
// closed by the restart; during a halt the port refuses connections.
func TestRestartInPlace(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testCtx(t)
	dbURL, err := s.CreateDatabase(ctx, "restart_me")
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, dbURL)
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v INT); INSERT INTO kept VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	hp := hostPort(t, dbURL)

	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Error("a connection opened before the restart still works: the server was not restarted")
	}
	checkKept(t, dbURL)

	halted := make(chan error, 1)
	// The halt stretched with the machine's load: the test must see it.
	go func() { halted <- s.RestartAfter(ctx, await.Stretch(2*time.Second)) }()
	// While halted, nothing listens at the server's address.
	await.Until(t, "nothing to listen at "+hp+" while the server is halted", func() bool {
		c, err := net.DialTimeout("tcp", hp, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	}, await.Every(20*time.Millisecond))
	if err := <-halted; err != nil {
		t.Fatalf("RestartAfter: %v", err)
	}
	checkKept(t, dbURL)

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("Restart after Stop: %v, want ErrStopped", err)
	}
}

func checkKept(t *testing.T, dbURL string) {
	t.Helper()
	c := connect(t, dbURL)
	var v int
	if err := c.QueryRow(context.Background(), `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("after the restart: v = %d, %v; want 42", v, err)
	}
}
