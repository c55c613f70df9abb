package faultproxy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T) (direct *pgx.Conn, p *faultproxy.Proxy, proxied string) {
	t.Helper()
	ctx := context.Background()
	dbURL := testdb.NewURL(t)
	p, proxied, err := faultproxy.ForURL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	direct, err = pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close(ctx) })
	if _, err := direct.Exec(ctx, `CREATE TABLE t (v INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return direct, p, proxied
}

func rows(t *testing.T, c *pgx.Conn, v int) int {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM t WHERE v = $1`, v).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// The answer of a COMMIT is dropped: the client gets an error, the
// transaction committed.
func TestDropCommitAnswer(t *testing.T) {
	t.Parallel()
	direct, p, proxied := setup(t)
	ctx := context.Background()
	c := connect(t, proxied)
	fired := p.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: faultproxy.DropAnswer})
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit succeeded although its answer was dropped")
	}
	<-fired
	if n := rows(t, direct, 1); n != 1 {
		t.Errorf("%d rows after the commit whose answer was lost, want 1 (it committed)", n)
	}
}

// A COMMIT answered with 40003: forwarded (it committed) or replaced by a
// ROLLBACK (it did not); either way the client gets SQLSTATE 40003 and its
// connection stays usable, idle.
func TestAmbiguousCommit(t *testing.T) {
	for _, c := range []struct {
		name      string
		action    faultproxy.Action
		committed int
	}{
		{"forward", faultproxy.AmbiguousForward, 1},
		{"drop", faultproxy.AmbiguousDrop, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			direct, p, proxied := setup(t)
			ctx := context.Background()
			conn := connect(t, proxied)
			fired := p.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: c.action})
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1)`, 7); err != nil {
				t.Fatal(err)
			}
			err = tx.Commit(ctx)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != faultproxy.AmbiguousCode {
				t.Fatalf("Commit: %v, want SQLSTATE 40003", err)
			}
			<-fired
			if n := rows(t, direct, 7); n != c.committed {
				t.Errorf("%d rows after the ambiguous COMMIT, want %d", n, c.committed)
			}
			// The connection goes on, outside any transaction, with the
			// extended protocol too.
			if st := conn.PgConn().TxStatus(); st != 'I' {
				t.Errorf("transaction status %q after the ambiguous COMMIT, want idle", st)
			}
			if _, err := conn.Exec(ctx, `INSERT INTO t VALUES ($1)`, 8); err != nil {
				t.Fatalf("the connection after the ambiguous COMMIT: %v", err)
			}
			if n := rows(t, direct, 8); n != 1 {
				t.Errorf("%d rows of the statement after, want 1 (committed on its own)", n)
			}
			// A prepared COMMIT (extended protocol) is not matched.
			p.Arm(faultproxy.Rule{Match: faultproxy.IsCommit, Action: c.action})
			if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
				t.Fatal(err)
			}
			if err := conn.PgConn().ExecParams(ctx, `COMMIT`, nil, nil, nil, nil).Read().Err; err != nil {
				t.Fatalf("a COMMIT sent with the extended protocol: %v", err)
			}
			if p.Fired() != 1 {
				t.Errorf("Fired = %d, want 1", p.Fired())
			}
		})
	}
}

// A statement dropped before it reaches the server never runs; a prepared
// statement (extended protocol) is matched by its text.
func TestDropStatement(t *testing.T) {
	t.Parallel()
	direct, p, proxied := setup(t)
	ctx := context.Background()
	c := connect(t, proxied)
	if _, err := c.Exec(ctx, `INSERT INTO t VALUES ($1)`, 5); err != nil { // prepared now
		t.Fatal(err)
	}
	p.Arm(faultproxy.Rule{Match: faultproxy.Contains("insert into t"), Action: faultproxy.DropStatement})
	if _, err := c.Exec(ctx, `INSERT INTO t VALUES ($1)`, 2); err == nil {
		t.Fatal("the dropped INSERT succeeded")
	}
	if n := rows(t, direct, 2); n != 0 {
		t.Errorf("%d rows of the dropped INSERT, want 0", n)
	}
	if p.Fired() != 1 {
		t.Errorf("Fired = %d, want 1", p.Fired())
	}
	// The rule fired once: the next connection works.
	c2 := connect(t, proxied)
	if _, err := c2.Exec(ctx, `INSERT INTO t VALUES ($1)`, 3); err != nil {
		t.Fatal(err)
	}
}

// Cut refuses connections until Restore; an Outage rule cuts on its own and
// restores after the outage.
func TestCutAndOutage(t *testing.T) {
	t.Parallel()
	_, p, proxied := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := connect(t, proxied)
	p.Cut()
	if err := c.Ping(ctx); err == nil {
		t.Fatal("a connection survived Cut")
	}
	if c2, err := pgx.Connect(ctx, proxied); err == nil {
		c2.Close(ctx)
		t.Fatal("connected through a cut proxy")
	}
	p.Restore()
	c3 := connect(t, proxied)
	p.Arm(faultproxy.Rule{Match: faultproxy.Contains("select 42"), Action: faultproxy.Pass, Outage: time.Second})
	var v int
	_ = c3.QueryRow(ctx, `SELECT 42`).Scan(&v)
	if c4, err := pgx.Connect(ctx, proxied); err == nil {
		c4.Close(ctx)
		t.Fatal("connected during the outage")
	}
	await.Until(t, "the proxy to come back after the outage", func() error {
		c5, err := pgx.Connect(ctx, proxied)
		if err == nil {
			c5.Close(ctx)
		}
		return err
	})
}

// A client gives up on an INSERT (its context ends) while the server waits
// on a lock for it: with cancels dropped, the server runs it to its end
// once the lock is free, and it commits; with cancels forwarded, the
// server stops it.
func TestDropCancels(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{true, false} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			t.Parallel()
			direct, p, proxied := setup(t)
			ctx := context.Background()
			p.DropCancels(drop)
			// The INSERT waits for the advisory lock the test holds.
			if _, err := direct.Exec(ctx, `CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_advisory_xact_lock_shared(7); RETURN NEW; END $$`); err != nil {
				t.Fatal(err)
			}
			if _, err := direct.Exec(ctx, `CREATE TRIGGER gate BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION gate()`); err != nil {
				t.Fatal(err)
			}
			lock := connect(t, proxied)
			if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(7)`); err != nil {
				t.Fatal(err)
			}
			c := connect(t, proxied)
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := c.Exec(cctx, `INSERT INTO t VALUES ($1)`, 1)
				done <- err
			}()
			waiting := func() int {
				var n int
				if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO t %'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			await.Until(t, "the INSERT to wait for the lock", func() bool { return waiting() == 1 })
			cancel()
			if err := await.Recv(t, "the cancelled INSERT to return", done); !errors.Is(err, context.Canceled) {
				t.Fatalf("the cancelled INSERT returned %v, want context.Canceled", err)
			}
			await.Until(t, "the cancel request to be sent", func() (bool, string) {
				if !drop {
					return waiting() == 0, fmt.Sprintf("%d INSERTs waiting for the lock", waiting())
				}
				return p.CancelsDropped() == 1, fmt.Sprintf("%d dropped", p.CancelsDropped())
			})
			if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(7)`); err != nil {
				t.Fatal(err)
			}
			// The INSERT, if it still runs, ends (the server's backend of
			// the closed connection goes away).
			await.Until(t, "no INSERT to run", func() bool {
				var n int
				if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE 'INSERT INTO t %' AND state <> 'idle'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			want := 0
			if drop {
				want = 1
			}
			if n := rows(t, direct, 1); n != want {
				t.Errorf("%d rows of the INSERT given up on, want %d", n, want)
			}
			if !drop && p.CancelsDropped() != 0 {
				t.Errorf("CancelsDropped = %d with cancels forwarded", p.CancelsDropped())
			}
		})
	}
}
