package session_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// setup returns a pool on a fresh database of the test with the schema.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testschema.New(t)
}

// fastHeartbeat and fastExpiry are the intervals of the tests' sessions on
// a quiet machine: short, so that tests of expiry run quickly.
const (
	fastHeartbeat = 100 * time.Millisecond
	fastExpiry    = 600 * time.Millisecond
)

// fast returns short intervals for sessions that must stay alive while the
// machine is busy: the heartbeat and the expiry stretch together with the
// machine's load (await.Stretch, read once), so that heartbeats delayed by
// a loaded scheduler (each gives up after two intervals) do not lose the
// session; the tests of expiry then only take longer.
func fast() session.Options {
	hb := await.Stretch(fastHeartbeat)
	return session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: hb * (fastExpiry / fastHeartbeat)}}
}

// fixed are the fast intervals unstretched, for the tests of the values
// the options turn into (nothing there depends on the machine's speed).
var fixed = session.Options{Tuning: session.Tuning{Heartbeat: fastHeartbeat, Expiry: fastExpiry}}

func countSessions(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_sessions`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStartWritesRowAndHeartbeats(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	opts := fast()
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
	await.Until(t, "a heartbeat to move heartbeat_at", func() bool {
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
	if len(live) != 1 || live[0].ID != s.ID() || live[0].Expiry != opts.Expiry {
		t.Fatalf("List = %+v, want one session %s with expiry %v", live, s.ID(), opts.Expiry)
	}
	if s.Err() != nil {
		t.Fatalf("live session has Err %v", s.Err())
	}
}

func TestCloseDeletesRow(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s, err := session.Start(ctx, pool, fast())
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
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	opts := fast()
	s, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, s.ID()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	await.Recv(t, "the session to report the loss of its row", s.Done())
	t.Logf("loss reported %v after the row was deleted (heartbeat %v)", time.Since(deleted), opts.Heartbeat)
	if !errors.Is(s.Err(), session.ErrLost) || !strings.Contains(s.Err().Error(), "deleted") {
		t.Fatalf("Err = %v, want ErrLost saying the row was deleted", s.Err())
	}
	if s.Context().Err() == nil {
		t.Fatal("session context not cancelled")
	}
}

func TestCrashedSessionIsReapedByPeer(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	crashCtx, crash := context.WithCancel(ctx)
	opts := fast()
	dead, err := session.Start(crashCtx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close(ctx)
	crash() // stops heartbeating without deleting the row
	crashed := time.Now()
	await.Until(t, "the peer to reap the crashed session", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, dead.ID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	t.Logf("crashed session reaped %v after its last heartbeat (expiry %v)", time.Since(crashed), opts.Expiry)
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

// The database becomes unreachable (a proxy drops every connection): the
// session counts itself lost once heartbeats have failed for the expiry
// less the clock margin — while its row, by the database clock, has not yet
// expired, so no peer may already have taken over its work.
func TestUnreachableDatabaseLosesSessionBeforeItsRowExpires(t *testing.T) {
	t.Parallel()
	direct := setup(t)
	ctx := context.Background()
	p, pu, err := faultproxy.ForURL(direct.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	pool, err := pgxpool.New(ctx, pu)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The margin leaves the test two thirds of the expiry, stretched with
	// the machine's load, to read the row after the loss.
	margin := await.Stretch(2 * time.Second)
	opts := session.Options{Tuning: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: margin * 3 / 2, ClockMargin: margin}}
	s, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	p.Cut() // every later heartbeat fails
	await.Recv(t, "the session to count itself lost without heartbeats", s.Done())
	if !errors.Is(s.Err(), session.ErrLost) || !strings.Contains(s.Err().Error(), "no heartbeat succeeded") ||
		!strings.Contains(s.Err().Error(), fmt.Sprintf("clock margin %v", margin)) {
		t.Fatalf("Err = %v, want ErrLost for failed heartbeats, naming the clock margin", s.Err())
	}
	var expired bool
	if err := direct.QueryRow(ctx, `SELECT heartbeat_at + expiry <= now() FROM crdbwork_sessions WHERE id = $1`, s.ID()).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if expired {
		t.Fatal("the session counted itself lost only after its row had expired by the database clock")
	}
}

// The heartbeat has its own connection: a pool whose every connection is
// busy (here held by the test, as by acks that take long) must not starve
// it, or a session working fine would be lost.
func TestHeartbeatDoesNotWaitForABusyPool(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	beats := await.NewRounds("heartbeats that updated the row")
	opts := fast()
	opts.Testing.AfterHeartbeat = func(alive bool, err error) {
		if alive && err == nil {
			beats.Tick()
		}
	}
	s, err := session.Start(ctx, pool, opts) // the row's insert takes the pool
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	busy, err := pool.Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release() // before the Close deferred above, which needs the pool
	var first time.Time
	if err := busy.QueryRow(ctx, `SELECT heartbeat_at FROM crdbwork_sessions WHERE id = $1`, s.ID()).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// Three heartbeats land while the test holds the pool's only
	// connection: a heartbeat that needed the pool would wait for ever.
	beats.Wait(t, 3)
	var last time.Time
	if err := busy.QueryRow(ctx, `SELECT heartbeat_at FROM crdbwork_sessions WHERE id = $1`, s.ID()).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if !last.After(first) {
		t.Fatalf("heartbeat_at %v did not move from %v while the heartbeats reported success", last, first)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("session lost while the pool was busy: %v", err)
	}
}

// countingCtx is a context that never ends and counts the functions
// registered on it with context.AfterFunc and not yet stopped.
type countingCtx struct {
	done chan struct{}
	mu   sync.Mutex
	live int
}

func (c *countingCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *countingCtx) Done() <-chan struct{}       { return c.done }
func (c *countingCtx) Err() error                  { return nil }
func (c *countingCtx) Value(any) any               { return nil }
func (c *countingCtx) registered() int             { c.mu.Lock(); defer c.mu.Unlock(); return c.live }
func (c *countingCtx) AfterFunc(func()) (stop func() bool) {
	c.mu.Lock()
	c.live++
	c.mu.Unlock()
	var once sync.Once
	return func() bool {
		stopped := false
		once.Do(func() {
			c.mu.Lock()
			c.live--
			c.mu.Unlock()
			stopped = true
		})
		return stopped
	}
}

// A session closed or lost under a long-lived context leaves nothing
// registered on that context (each registration held ~6.5 KiB).
func TestEndedSessionsLeaveNothingOnTheirContext(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := &countingCtx{done: make(chan struct{})}
	var sessions []*session.Session
	for range 3 {
		s, err := session.Start(ctx, pool, fast())
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	if n := ctx.registered(); n != 3 {
		t.Fatalf("%d registrations on the context for 3 live sessions, want 3", n)
	}
	if err := sessions[0].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := ctx.registered(); n != 2 {
		t.Fatalf("%d registrations after one Close, want 2", n)
	}
	// One is lost: its row is deleted.
	if _, err := pool.Exec(context.Background(), `DELETE FROM crdbwork_sessions WHERE id = $1`, sessions[1].ID()); err != nil {
		t.Fatal(err)
	}
	await.Recv(t, "the session whose row was deleted to be lost", sessions[1].Done())
	await.Until(t, "the lost session's registration to be stopped", func() (bool, string) {
		n := ctx.registered()
		return n == 1, fmt.Sprint(n, " registrations")
	})
	if err := sessions[2].Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "no registration left", func() (bool, string) {
		n := ctx.registered()
		return n == 0, fmt.Sprint(n, " registrations")
	})
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		opts session.Options
		want string
	}{
		{session.Options{Tuning: session.Tuning{Heartbeat: time.Second, Expiry: 2 * time.Second}}, "expiry 2s must be at least 3 heartbeats"},
		{session.Options{Tuning: session.Tuning{Heartbeat: time.Microsecond}}, "too short"},
		{session.Options{Tuning: session.Tuning{Heartbeat: -time.Second}}, "negative"},
		{session.Options{Tuning: session.Tuning{Heartbeat: math.MaxInt64}}, "heartbeat 2562047h47m16.854775807s is too long"},
		{session.Options{Tuning: session.Tuning{Expiry: math.MaxInt64}}, "too long"},
		{session.Options{Tuning: session.Tuning{Heartbeat: time.Hour, Expiry: session.MaxExpiry + time.Nanosecond}}, "too long"},
		{session.Options{Tuning: session.Tuning{ReapEvery: math.MaxInt64}}, "too long"},
		{session.Options{Tuning: session.Tuning{ClockMargin: math.MaxInt64}}, "too long"},
		{session.Options{Tuning: session.Tuning{Heartbeat: time.Second, Expiry: 3 * time.Second, ClockMargin: 2 * time.Second}}, "leaves less than two heartbeats"},
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
	t.Parallel()
	pool := testdb.New(t) // no schema applied
	_, err := session.Start(context.Background(), pool, session.Options{})
	if !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Fatalf("Start on an empty database = %v, want ErrSchemaMissing", err)
	}
}

// TestListReportsCounters checks that List returns the counters each
// session reported with its last heartbeat, and zeros for a session that
// reports none.
func TestListReportsCounters(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	want := session.Counters{Claimed: 7, Acked: 5, Failed: 2, InFlight: 3}
	opts := fast()
	opts.Report = func() session.Counters { return want }
	reporting, err := session.Start(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer reporting.Close(ctx)
	silent, err := session.Start(ctx, pool, fast())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close(ctx)
	var got map[string]session.Counters
	await.Until(t, "List to show the reported counters", func() (bool, string) {
		live, err := session.List(ctx, pool, crsql.Tables{})
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]session.Counters{}
		for _, in := range live {
			got[in.ID.String()] = in.Reported
		}
		return len(got) == 2 && got[reporting.ID().String()] == want, fmt.Sprintf("%+v", got)
	})
	if c := got[silent.ID().String()]; c != (session.Counters{}) {
		t.Fatalf("the silent session's counters = %+v, want zeros", c)
	}
}
