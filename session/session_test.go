package session_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.New(t)
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// fast are short intervals so that tests of expiry run quickly.
var fast = session.Options{Heartbeat: 100 * time.Millisecond, Expiry: 600 * time.Millisecond}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(t *testing.T, what string, deadline time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", deadline, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countSessions(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_sessions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartWritesRowAndHeartbeats(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	opts := fast
	opts.Name = "worker-a"
	s, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	var name, host string
	var pid int64
	var first time.Time
	if err := pool.QueryRow(ctx, `SELECT name, host, pid, heartbeat_at FROM crdbwork_sessions WHERE id = $1`, s.ID()).
		Scan(&name, &host, &pid, &first); err != nil {
		t.Fatal(err)
	}
	if name != "worker-a" || host == "" || pid == 0 {
		t.Fatalf("row = (%q, %q, %d), want name worker-a and host, pid set", name, host, pid)
	}
	waitFor(t, "a heartbeat to move heartbeat_at", 5*time.Second, func() bool {
		var hb time.Time
		if err := pool.QueryRow(ctx, `SELECT heartbeat_at FROM crdbwork_sessions WHERE id = $1`, s.ID()).Scan(&hb); err != nil {
			t.Fatal(err)
		}
		return hb.After(first)
	})
	live, err := session.List(ctx, pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].ID != s.ID() || live[0].Expiry != fast.Expiry {
		t.Fatalf("List = %+v, want one session %s with expiry %v", live, s.ID(), fast.Expiry)
	}
	if s.Err() != nil {
		t.Fatalf("live session has Err %v", s.Err())
	}
}

func TestCloseDeletesRow(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	s, err := session.Start(ctx, pool, fast)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countSessions(t, pool); n != 0 {
		t.Fatalf("%d session rows after Close, want 0", n)
	}
	if !errors.Is(s.Err(), session.ErrClosed) {
		t.Fatalf("Err after Close = %v, want ErrClosed", s.Err())
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDeletedRowIsReportedLost(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	s, err := session.Start(ctx, pool, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, s.ID()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session did not report the loss of its row")
	}
	t.Logf("loss reported %v after the row was deleted (heartbeat %v)", time.Since(deleted), fast.Heartbeat)
	if !errors.Is(s.Err(), session.ErrLost) || !strings.Contains(s.Err().Error(), "deleted") {
		t.Fatalf("Err = %v, want ErrLost saying the row was deleted", s.Err())
	}
	if s.Context().Err() == nil {
		t.Fatal("session context not cancelled")
	}
}

func TestCrashedSessionIsReapedByPeer(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	crashCtx, crash := context.WithCancel(ctx)
	dead, err := session.Start(crashCtx, pool, fast)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := session.Start(ctx, pool, fast)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(ctx)
	crash() // stops heartbeating without deleting the row
	crashed := time.Now()
	waitFor(t, "the peer to reap the crashed session", 15*time.Second, func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, dead.ID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	t.Logf("crashed session reaped %v after its last heartbeat (expiry %v)", time.Since(crashed), fast.Expiry)
	if !errors.Is(dead.Err(), session.ErrLost) {
		t.Fatalf("crashed session Err = %v, want ErrLost", dead.Err())
	}
	if peer.Err() != nil {
		t.Fatalf("peer lost: %v", peer.Err())
	}
	ids, err := session.LiveIDs(ctx, pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != peer.ID() {
		t.Fatalf("live ids = %v, want only the peer %s", ids, peer.ID())
	}
}

func TestUnreachableDatabaseLosesSessionAfterExpiry(t *testing.T) {
	url := testdb.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, pool, fast)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close() // every later heartbeat fails
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session kept going without heartbeats")
	}
	if !errors.Is(s.Err(), session.ErrLost) || !strings.Contains(s.Err().Error(), "no heartbeat succeeded") {
		t.Fatalf("Err = %v, want ErrLost for failed heartbeats", s.Err())
	}
}

func TestBadOptions(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		opts session.Options
		want string
	}{
		{session.Options{Heartbeat: time.Second, Expiry: 2 * time.Second}, "expiry 2s must be at least 3 heartbeats"},
		{session.Options{Heartbeat: time.Microsecond}, "too short"},
		{session.Options{ReapEvery: -time.Second}, "negative"},
	} {
		_, err := session.Start(ctx, pool, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%+v) = %v, want error containing %q", tc.opts, err, tc.want)
		}
	}
	if n := countSessions(t, pool); n != 0 {
		t.Fatalf("bad options left %d session rows", n)
	}
}

func TestMissingSchema(t *testing.T) {
	pool := testdb.New(t) // no schema applied
	_, err := session.Start(context.Background(), pool, session.Options{})
	if !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Start on an empty database = %v, want ErrSchemaMissing", err)
	}
}
