package session_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// expiredWithLockedChild inserts a session that expired an hour ago, a
// queue membership of it, and opens a transaction on its own connection
// that has updated that membership and then waits for its client for ever
// (a process frozen mid-transaction): deleting the session must lock the
// membership row (ON DELETE CASCADE), so it waits on that transaction.
// The transaction is rolled back at cleanup.
func expiredWithLockedChild(t *testing.T, pool *pgxpool.Pool, cfg *pgx.ConnConfig) (uuid.UUID, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	id := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (id, expiry, heartbeat_at) VALUES ($1, INTERVAL '1 second', now() - INTERVAL '1 hour')`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ('q', $1)`, id); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `UPDATE crdbwork_session_queues SET joined_at = now() WHERE session_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	return id, conn
}

func sessionExists(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) bool {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestReapWithinGivesUpOnLocks: a reap blocked by the locks of an expired
// session's open transaction returns ErrReapTimeout (naming the setting
// and the session) instead of waiting for as long as the transaction stays
// open, and still deletes the other expired sessions (one frozen process
// does not keep every expired session of the database, whatever its
// queue, from being reaped); once the transaction ends, the next reap
// deletes the session.
func TestReapWithinGivesUpOnLocks(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	id, conn := expiredWithLockedChild(t, pool, pool.Config().ConnConfig.Copy())
	var others []uuid.UUID
	for range 3 {
		var other uuid.UUID
		if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, heartbeat_at) VALUES (INTERVAL '1 second', now() - INTERVAL '1 hour') RETURNING id`).Scan(&other); err != nil {
			t.Fatal(err)
		}
		others = append(others, other)
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Bound stretched with the machine's load: each of the sessions
		// whose rows are not locked is deleted within it.
		n, err := session.ReapWithin(ctx, pool, crsql.Tables{}, await.Stretch(300*time.Millisecond))
		done <- result{n, err}
	}()
	r := await.Recv(t, "ReapWithin to give up on the frozen transaction's locks", done)
	if !errors.Is(r.err, session.ErrReapTimeout) || !strings.Contains(r.err.Error(), session.IdleInTransactionParam) ||
		!strings.Contains(r.err.Error(), id.String()) {
		t.Fatalf("ReapWithin: %v, want an error wrapping ErrReapTimeout naming %s and session %s", r.err, session.IdleInTransactionParam, id)
	}
	if r.n != int64(len(others)) {
		t.Errorf("ReapWithin deleted %d sessions, want the %d expired ones whose rows are not locked", r.n, len(others))
	}
	if !sessionExists(t, pool, id) {
		t.Fatal("the session was deleted although its child row stayed locked")
	}
	for _, other := range others {
		if sessionExists(t, pool, other) {
			t.Errorf("expired session %s, whose rows nothing locks, was not reaped", other)
		}
	}
	if _, err := conn.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	// The session goes now: deleted by the next reap, or by the abandoned
	// delete of the first one, which a busy server may still run after
	// the ROLLBACK (pgx cancels it through another connection, which can
	// come late) — then the next reap finds nothing left to delete.
	await.Until(t, "the thawed session to be reaped", func() error {
		if n, err := session.ReapWithin(ctx, pool, crsql.Tables{}, 5*time.Second); err != nil {
			return fmt.Errorf("ReapWithin after the thaw: %d, %w", n, err)
		}
		if sessionExists(t, pool, id) {
			return errors.New("the session is still there")
		}
		return nil
	})
}

// TestReapLoopWarnsOnLocks: a session's own reaper, blocked the same way,
// warns and tries again rather than hanging.
func TestReapLoopWarnsOnLocks(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	id, _ := expiredWithLockedChild(t, pool, pool.Config().ConnConfig.Copy())
	core, logs := observer.New(zap.WarnLevel)
	opts := fast()
	opts.Logger = zap.New(core)
	gaveUp := await.NewRounds("reaps that gave up on the locks")
	opts.Testing.AfterReap = func(_ int64, err error) {
		if errors.Is(err, session.ErrReapTimeout) {
			gaveUp.Tick()
		}
	}
	s, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	warned := func() int {
		n := 0
		for _, l := range logs.All() {
			for _, f := range l.Context {
				if e, ok := f.Interface.(error); ok && errors.Is(e, session.ErrReapTimeout) {
					n++
				}
			}
		}
		return n
	}
	// The hook runs before the reap's warning is logged: after the third
	// reap that gave up, the first two have warned.
	gaveUp.Wait(t, 3)
	if n := warned(); n < 2 {
		t.Fatalf("%d warnings of a reap that gave up after 3 such reaps, want at least 2", n)
	}
	if !sessionExists(t, pool, id) {
		t.Fatal("the locked session was deleted")
	}
	if s.Err() != nil {
		t.Fatalf("the reaping session was lost: %v", s.Err())
	}
}

// TestConfigurePoolEndsFrozenTransaction: with a pool configured by
// ConfigurePool, the server ends a transaction left idle for the expiry,
// and a reaper then deletes the expired session whose rows it locked.
func TestConfigurePoolEndsFrozenTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	cfg := pool.Config()
	// Unstretched: the server ends the transaction after the expiry by its
	// own clock, whatever the load.
	if err := session.ConfigurePool(cfg, fixed); err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.ConnConfig.RuntimeParams[session.IdleInTransactionParam], "600"; got != want {
		t.Fatalf("%s = %q, want %q (the expiry in ms)", session.IdleInTransactionParam, got, want)
	}
	configured, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer configured.Close()
	var v string
	if err := configured.QueryRow(ctx, store.IdleInTransactionTimeout).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if d, err := session.ParseSetting(v); err != nil || d != fixed.Expiry {
		t.Fatalf("the server shows %s = %q (%v, %v), want %v", session.IdleInTransactionParam, v, d, err, fixed.Expiry)
	}
	id, _ := expiredWithLockedChild(t, pool, cfg.ConnConfig)
	await.Until(t, "the expired session to be reaped once the server ended the frozen transaction", func() bool {
		_, err := session.ReapWithin(ctx, pool, crsql.Tables{}, 300*time.Millisecond)
		if err != nil && !errors.Is(err, session.ErrReapTimeout) {
			t.Fatal(err)
		}
		return !sessionExists(t, pool, id)
	})
}

// TestConfigurePoolKeepsShorterTimeout: a timeout already configured is
// kept when it is not 0 and not longer than the expiry, replaced
// otherwise; a nil configuration or bad options are errors.
func TestConfigurePoolKeepsShorterTimeout(t *testing.T) {
	t.Parallel()
	// ConfigurePool only edits a configuration: no database is needed.
	const url = "postgres://crdbwork@127.0.0.1:1/none"
	for _, c := range []struct{ set, want string }{
		{"", "600"}, {"0", "600"}, {"200", "200"}, {"250ms", "250ms"}, {"1s", "600"}, {"600", "600"}, {"1min", "600"},
	} {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		if c.set != "" {
			cfg.ConnConfig.RuntimeParams[session.IdleInTransactionParam] = c.set
		}
		if err := session.ConfigurePool(cfg, fixed); err != nil {
			t.Fatal(err)
		}
		if got := cfg.ConnConfig.RuntimeParams[session.IdleInTransactionParam]; got != c.want {
			t.Errorf("set %q: got %q, want %q", c.set, got, c.want)
		}
	}
	if err := session.ConfigurePool(nil, fixed); err == nil {
		t.Error("ConfigurePool(nil) succeeded")
	}
	cfg, _ := pgxpool.ParseConfig(url)
	if err := session.ConfigurePool(cfg, session.Options{Tuning: session.Tuning{Heartbeat: time.Second, Expiry: time.Second}}); err == nil {
		t.Error("ConfigurePool with an expiry shorter than three heartbeats succeeded")
	}
}

func TestParseSetting(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"0": 0, "1500": 1500 * time.Millisecond, "1500ms": 1500 * time.Millisecond, "5s": 5 * time.Second,
		"2min": 2 * time.Minute, "1h": time.Hour, "1d": 24 * time.Hour, "00:00:05": 5 * time.Second,
		"00:01:01.5": 61500 * time.Millisecond, " 10 s": 10 * time.Second,
	} {
		if got, err := session.ParseSetting(in); err != nil || got != want {
			t.Errorf("ParseSetting(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "5 parsecs", "1:2"} {
		if _, err := session.ParseSetting(in); err == nil {
			t.Errorf("ParseSetting(%q) succeeded", in)
		}
	}
}

// TestReapWithinGoesOnPastRefusedDeletes: the delete of an expired session
// releases its claims (ON DELETE SET NULL), and the database refuses the
// release of an item whose tenant, written by raw SQL, is too long for the
// index of unclaimed items. That session stays, named in the error; the
// other expired sessions (whatever their queues) are deleted and their
// claims released. On the code before the fix, the one statement that
// deletes every expired session failed, at every reap, and deleted none.
func TestReapWithinGoesOnPastRefusedDeletes(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	expired := func() uuid.UUID {
		var id uuid.UUID
		if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, heartbeat_at) VALUES (INTERVAL '1 second', now() - INTERVAL '1 hour') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	bad, good := expired(), expired()
	// Random letters and digits: PostgreSQL cannot compress them into
	// the index entry.
	r := rand.New(rand.NewSource(1))
	tenant := make([]byte, 3000)
	for i := range tenant {
		tenant[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[r.Intn(36)]
	}
	claimed := `INSERT INTO crdbwork_items (id, queue, payload, tenant, claim, claimed_at, lease_until) VALUES ($1, $2, 'x', $3, $4, now(), now() + INTERVAL '1 hour')`
	badItem, goodItem := uuid.New(), uuid.New()
	if _, err := pool.Exec(ctx, claimed, badItem, "a", string(tenant), bad); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, claimed, goodItem, "b", "t", good); err != nil {
		t.Fatal(err)
	}
	// A bound stretched with the load: the refusal, not the bound, must end it.
	n, err := session.ReapWithin(ctx, pool, crsql.Tables{}, await.Stretch(5*time.Second))
	if n != 1 || err == nil || !strings.Contains(err.Error(), bad.String()) || !strings.Contains(err.Error(), "refused") ||
		errors.Is(err, session.ErrReapTimeout) {
		t.Fatalf("ReapWithin = %d, %v; want 1 deleted and an error naming the refused session %s", n, err, bad)
	}
	if !sessionExists(t, pool, bad) || sessionExists(t, pool, good) {
		t.Fatalf("after the reap: refused session there %v (want true), other there %v (want false)", sessionExists(t, pool, bad), sessionExists(t, pool, good))
	}
	var claim *uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT claim FROM crdbwork_items WHERE id = $1`, goodItem).Scan(&claim); err != nil || claim != nil {
		t.Fatalf("the other session's item: claim %v, %v; want released", claim, err)
	}
}
