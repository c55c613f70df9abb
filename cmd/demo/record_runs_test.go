package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/worker"
)

// A handler's context ends while its run's start is being written, and the
// server runs that INSERT to its end after the recorder gave up on it and
// withdrew the run (pgx's cancel request for it came too late: dropped by
// the proxy here; under load, a slow backend commits before the request
// lands, after the withdrawal's read). The run must not stay open: the
// process lives on and never writes its end, so TestDeploymentFaults found
// "a run without an end in a process that was not killed". Forced here: the
// INSERT waits at the server for a lock the test holds until the handler
// has returned.
func TestRunWithdrawnBeforeItsStartLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.NewURL(t)
	p, proxied, err := faultproxy.ForURL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.DropCancels(true)
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	// The first row written to demo_runs (the run's start) waits for the
	// advisory lock the test holds; the others do not.
	for _, s := range []string{runsTable,
		`CREATE SEQUENCE demo_runs_gate`,
		`CREATE FUNCTION demo_runs_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('demo_runs_gate') = 1 THEN
		PERFORM pg_advisory_xact_lock_shared(8128);
	END IF;
	RETURN NEW;
END $$`,
		`CREATE TRIGGER demo_runs_gate BEFORE INSERT ON demo_runs FOR EACH ROW EXECUTE FUNCTION demo_runs_gate()`,
	} {
		if _, err := db.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(8128)`); err != nil {
		t.Fatal(err)
	}

	rp, err := cli.Connect(ctx, proxied, 2) // as setupRecordRuns
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rp.Close)
	stderr := &syncBuffer{}
	var ran atomic.Bool
	h := newRunRecorder(rp, cli.NewConsole(io.Discard, stderr)).wrap(func(context.Context, claim.Item) (worker.Record, error) {
		ran.Store(true)
		return nil, nil
	})
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan error, 1)
	go func() {
		_, err := h(hctx, claim.Item{ID: uuid.New()})
		returned <- err
	}()
	count := func(q string) int { return countRows(t, db, q) }
	await.Until(t, "the run's start to wait at the server", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO demo_runs%'`) == 1
	})
	cancel() // the worker cancels the handler: a lost session, a part given up, a shutdown
	if err := await.Recv(t, "the handler to return", returned, await.Show(stderr.String)); err == nil {
		t.Errorf("the handler returned no error; its context ended before its run's start was written")
	}
	if ran.Load() {
		t.Errorf("the handler ran, though its context ended before its run's start was written")
	}
	await.Until(t, "pgx's cancel request for the INSERT given up on (dropped)", func() (bool, string) {
		return p.CancelsDropped() > 0, fmt.Sprintf("%d dropped", p.CancelsDropped())
	})
	// The server runs the INSERT now, after the handler returned.
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_unlock(8128)`); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the INSERT given up on to end at the server", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state <> 'idle' AND query LIKE 'INSERT INTO demo_runs%' AND pid <> pg_backend_pid()`) == 0
	})
	if n := count(`SELECT count(*) FROM demo_runs WHERE ended_at IS NULL`); n != 0 {
		t.Errorf("%d runs without an end in a process that lives on (the handler was never run); its lines:\n%s", n, stderr.String())
	}
	if n := count(`SELECT count(*) FROM demo_runs WHERE ended_at > started_at`); n != 0 {
		t.Errorf("%d runs of some length recorded, but the handler never ran", n)
	}
	if n := count(`SELECT count(*) FROM demo_runs WHERE ended_at = started_at`); n != 1 {
		t.Errorf("%d withdrawn runs (of no length) recorded, want 1", n)
	}
}

// A process stops while one of its handlers runs on (the worker abandoned
// it, or it outlived the shutdown timeouts: worker.Run does not wait for
// it): the recorder's close, the process's last step, waits until the run's
// end is written, and the run does not stay open.
func TestRecorderCloseWaitsForRunsBeingRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.NewURL(t)
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if _, err := db.Exec(ctx, runsTable); err != nil {
		t.Fatal(err)
	}
	rp, err := cli.Connect(ctx, dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	rec := newRunRecorder(rp, cli.NewConsole(io.Discard, stderr))
	release := make(chan struct{})
	h := rec.wrap(func(context.Context, claim.Item) (worker.Record, error) {
		<-release // a handler that runs on after the worker stopped
		return nil, nil
	})
	returned := make(chan error, 1)
	go func() {
		_, err := h(ctx, claim.Item{ID: uuid.New()})
		returned <- err
	}()
	count := func(q string) int { return countRows(t, db, q) }
	await.Until(t, "the run's start to be written", func() bool { return count(`SELECT count(*) FROM demo_runs`) == 1 })
	closed := make(chan struct{})
	go func() {
		rec.close()
		close(closed)
	}()
	await.Until(t, "close to wait for the run (or to return)", func() bool {
		select {
		case <-closed:
			return true
		default:
		}
		return strings.Contains(stderr.String(), "waiting for 1 handler runs to record their ends")
	}, await.Show(stderr.String))
	close(release)
	await.Recv(t, "close to return", closed)
	// The process would exit now.
	if n := count(`SELECT count(*) FROM demo_runs WHERE ended_at > started_at`); n != 1 {
		t.Fatalf("%d runs with their ends once the recorder closed, want 1; its lines:\n%s", n, stderr.String())
	}
	if err := await.Recv(t, "the handler to return", returned); err != nil {
		t.Errorf("the handler returned %v", err)
	}
}
