package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// TestFrozenInAckTransaction freezes a worker in the middle of an ack
// transaction: the transaction has deleted its items (and holds their row
// locks), its Record blocks for ever, and the proxy in front of the worker
// stalls every answer, heartbeats included — what the server sees of a
// process stopped (SIGSTOP, a paused VM) or cut off between two statements
// of a transaction: a client idle in transaction. Its session expires;
// deleting it touches the items the frozen transaction locked, so a
// peer's reaper of expired sessions waits on them.
//
//   - configured (worker.ConfigurePool): the server ends the frozen
//     transaction after the expiry of idle time, the peer reaps the frozen
//     session within the expiry, the idle timeout and a reap interval
//     (plus slack), and every item ends: acked by the peer.
//   - unconfigured: the frozen transaction stays, the session cannot be
//     reaped; the peer's reaper must not hang on it: each try gives up
//     within its bound and warns (session.ErrReapTimeout), naming the
//     setting, and the frozen worker warned at its start that its pool
//     lacks it.
func TestFrozenInAckTransaction(t *testing.T) {
	t.Parallel()
	for _, configured := range []bool{true, false} {
		name := "unconfigured"
		if configured {
			name = "configured"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			frozenInAck(t, configured)
		})
	}
}

func frozenInAck(t *testing.T, configured bool) {
	ctx := context.Background()
	e := newFaultEnv(t, testschema.NewURL(t))
	const items = 200
	e.enqueue(items, "x", 0)
	sopts := e.tm.session // stretched with the machine's load: the peer's session must not expire
	opts := worker.Options{Session: sopts, Concurrency: 4, RestartDelay: 100 * time.Millisecond}
	qopts := claim.Options{Lease: time.Minute} // the lease is not what frees the frozen items here

	proxy, proxyURL, err := faultproxy.ForURL(e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg, err := pgxpool.ParseConfig(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 10
	if configured {
		if err := worker.ConfigurePool(cfg, opts); err != nil {
			t.Fatal(err)
		}
	}
	frozenPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(frozenPool.Close)

	// The first Record blocks until the test ends, whatever its context
	// says: the frozen transaction. It reports its session first.
	blocked := make(chan uuid.UUID, 1)
	release := make(chan struct{})
	var once sync.Once
	handler := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		rec := record(it)
		return func(ctx context.Context, tx pgx.Tx) error {
			if err := rec(ctx, tx); err != nil {
				return err
			}
			first := false
			once.Do(func() { first = true })
			if first {
				blocked <- it.Session
				<-release
			}
			return nil
		}, nil
	}
	frozenCore, frozenLogs := observer.New(zap.WarnLevel)
	fopts := opts
	fopts.Logger = zap.New(frozenCore)
	fw := startOn(t, newQueue(t, frozenPool, qopts), handler, fopts)
	// Cleanups run last first: thaw the transaction and the proxy before
	// the worker is stopped.
	t.Cleanup(func() {
		proxy.Restore()
		close(release)
	})
	_ = fw

	sid := await.Recv(t, "the frozen worker to reach an ack transaction", blocked)
	proxy.Stall()
	frozeAt := time.Now()
	// The frozen worker's transaction, seen from the server: PostgreSQL's
	// pg_stat_activity (CockroachDB's is an empty table kept for
	// compatibility, cockroachdb/docs#18264: there the peer's recovery below
	// is what shows the frozen transaction was ended).
	if testdb.Kind(t) == "postgres" {
		var open int
		if err := e.direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'idle in transaction' AND backend_xid IS NOT NULL AND datname = current_database()`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			t.Fatal("no transaction of the frozen worker is idle in transaction with writes")
		}
	}

	peerCore, peerLogs := observer.New(zap.WarnLevel)
	popts := opts
	popts.Logger = zap.New(peerCore)
	// The peer's reaps that gave up on the frozen transaction's locks.
	giveUps := await.NewRounds("the peer's session reaps that gave up (session.ErrReapTimeout)")
	popts.Testing.AfterSessionReap = func(_ int64, err error) {
		if errors.Is(err, session.ErrReapTimeout) {
			giveUps.Tick()
		}
	}
	peer := e.startWorkersOn(1, e.url, qopts, work(0), popts)
	_ = peer

	sessionExists := func() bool {
		var n int
		if err := e.direct.QueryRow(ctx, `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, sid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	idleWarning := func(logs *observer.ObservedLogs) bool {
		for _, l := range logs.All() {
			if strings.Contains(l.Message, session.IdleInTransactionParam) {
				return true
			}
		}
		return false
	}
	reapWarning := func() string {
		for _, l := range peerLogs.All() {
			for _, f := range l.Context {
				if f.Key == "error" && f.Interface != nil {
					if err, ok := f.Interface.(error); ok && strings.Contains(err.Error(), session.ErrReapTimeout.Error()) {
						return err.Error()
					}
				}
			}
		}
		return ""
	}

	if configured {
		// Its bound: the expiry, the server's idle timeout (of an expiry
		// too), two heartbeats and the slack of a loaded machine; the
		// wait's budget stretches with the load.
		bound := sopts.Expiry + sopts.Expiry + 2*sopts.Heartbeat + e.tm.slack
		await.Until(t, "the frozen session to be reaped", func() bool { return !sessionExists() },
			await.Within(bound), await.Show(func() string { return fmt.Sprintf("peer's warnings: %v", peerLogs.All()) }))
		t.Logf("the frozen session was reaped %v after the freeze (bound %v, stretched with the load)", time.Since(frozeAt).Round(time.Millisecond), bound)
		if idleWarning(frozenLogs) {
			t.Errorf("the configured worker warned about its idle_in_transaction_session_timeout: %v", frozenLogs.All())
		}
		await.Until(t, "every item to end after the frozen session's reaping", func() (bool, string) {
			left := count(t, e.direct, `SELECT count(*) FROM crdbwork_items`)
			return left == 0, fmt.Sprintf("%d of %d items left", left, items)
		})
		var results, distinct int
		if err := e.direct.QueryRow(ctx, `SELECT count(*), count(DISTINCT item_id) FROM results`).Scan(&results, &distinct); err != nil {
			t.Fatal(err)
		}
		if results != items || distinct != items {
			t.Fatalf("%d results for %d distinct items, want %d of each", results, distinct, items)
		}
		return
	}

	// Unconfigured: the peer's reaper gives up and warns, again and again,
	// rather than waiting on the frozen transaction.
	giveUps.WaitFor(t, 1, await.Show(func() string { return fmt.Sprintf("the peer's warnings: %v", peerLogs.All()) }))
	await.Until(t, "the peer's warning of the give-up", func() bool { return reapWarning() != "" }) // logged before the hook runs
	msg := reapWarning()
	if !strings.Contains(msg, session.IdleInTransactionParam) {
		t.Errorf("the reaper's warning does not name %s: %s", session.IdleInTransactionParam, msg)
	}
	if !sessionExists() {
		t.Error("the frozen session was reaped while its transaction still held locks: the test froze nothing")
	}
	if !idleWarning(frozenLogs) {
		t.Errorf("the unconfigured worker did not warn about its idle_in_transaction_session_timeout: %v", frozenLogs.All())
	}
	// The reaper keeps trying (a second give-up), so it is not stuck either.
	giveUps.WaitFor(t, 2)
}
