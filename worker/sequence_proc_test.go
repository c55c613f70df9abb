package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The environment of TestSequencedWorkerProcess, the worker processes that
// TestSequencedWorkersInProcesses starts (this test binary, run again).
const (
	seqChildURL   = "CRDBWORK_SEQ_CHILD_URL"
	seqChildParts = "CRDBWORK_SEQ_CHILD_PARTS"
)

// seqProcSession is the worker processes' session timing: a killed
// process's claims are released within ~1.5 s.
var seqProcSession = session.Tuning{Heartbeat: 150 * time.Millisecond, Expiry: 1500 * time.Millisecond}

// TestSequencedWorkerProcess is a worker process of
// TestSequencedWorkersInProcesses (it is skipped otherwise): it works the
// default queue until it is killed or its parent's test ends. Its handler
// records the start of every attempt (a value of the database sequence
// seq_clock, committed at once) and, in its ack, the start and end of the
// attempt that succeeded.
func TestSequencedWorkerProcess(t *testing.T) {
	url := os.Getenv(seqChildURL)
	if url == "" {
		t.Skip("a worker process of TestSequencedWorkersInProcesses")
	}
	parts, _ := strconv.Atoi(os.Getenv(seqChildParts))
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	opts := worker.Options{Concurrency: 8, Parts: parts, Session: seqProcSession, Poll: 50 * time.Millisecond, RestartDelay: 100 * time.Millisecond,
		Partition: partition.Tuning{Poll: 200 * time.Millisecond, DrainTimeout: 5 * time.Second}}
	if err := worker.ConfigurePool(cfg, opts); err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(worker.Connections(opts) + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Lease: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		var start int64
		if err := pool.QueryRow(ctx, `INSERT INTO seq_starts (item_key, n, attempt, started)
			VALUES ($1, $2, $3, nextval('seq_clock')) RETURNING started`, it.Key, string(it.Payload), it.Attempt).Scan(&start); err != nil {
			return nil, err
		}
		select {
		case <-time.After(40 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO seq_results (item_key, n, started, ended) VALUES ($1, $2, $3, nextval('seq_clock'))`,
				it.Key, string(it.Payload), start)
			return err
		}, nil
	}
	w, err := worker.New(q, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestSequencedWorkersInProcesses: worker processes work a sequenced queue
// of 12 keys × 20 items (with 4 parts, and without parts). One process is
// killed (SIGKILL) mid-run, while it holds items; a new one joins, which
// moves parts between the sessions (a rebalance). Then every item has
// ended, acked once, and per key:
//
//   - the acked items ran in enqueue order, their handler runs (start to
//     end, by the database sequence seq_clock) one after another, never
//     overlapping;
//   - no attempt of an item started before the previous item of its key
//     had ended, nor after its own ack; an item's retries (after the kill)
//     come before the next item, with their attempts counted.
func TestSequencedWorkersInProcesses(t *testing.T) {
	t.Parallel()
	if os.Getenv(seqChildURL) != "" {
		t.Skip("in a worker process")
	}
	for _, parts := range []int{4, 0} {
		t.Run(fmt.Sprint(parts, " parts"), func(t *testing.T) {
			t.Parallel()
			sequencedProcesses(t, parts)
		})
	}
}

func sequencedProcesses(t *testing.T, parts int) {
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range []string{
		`CREATE SEQUENCE seq_clock`,
		`CREATE TABLE seq_starts (item_key TEXT NOT NULL, n TEXT NOT NULL, attempt INT NOT NULL, started BIGINT NOT NULL)`,
		`CREATE TABLE seq_results (item_key TEXT NOT NULL, n TEXT NOT NULL, started BIGINT NOT NULL, ended BIGINT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if parts > 0 {
		if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, claim.DefaultQueue, parts); err != nil {
			t.Fatal(err)
		}
	}
	q := newQueue(t, pool, claim.Options{})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 12, 20
	var items []claim.NewItem
	for n := range perKey {
		for k := range keys {
			items = append(items, claim.NewItem{Key: fmt.Sprint("key-", k), Payload: []byte(fmt.Sprintf("%02d", n))})
		}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSequencedWorkerProcess$", "-test.count=1")
		cmd.Env = testdb.Environ([]string{seqChildURL + "=", seqChildParts + "="}, seqChildURL+"="+url, seqChildParts+"="+strconv.Itoa(parts))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		})
		return cmd
	}
	workers := []*exec.Cmd{start(), start(), start()}
	total := keys * perKey
	waitFor(t, "a third of the items acked", 90*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM seq_results`) >= total/3
	})
	// Kill a process while it holds items (its session's claims).
	victim := workers[0]
	var pidHolds int
	waitFor(t, "the victim to hold items", 30*time.Second, func() bool {
		pidHolds = count(t, pool, `SELECT count(*) FROM crdbwork_items i JOIN crdbwork_sessions s ON s.id = i.claim WHERE s.pid = $1`, victim.Process.Pid)
		return pidHolds > 0
	})
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	// What it held when it died: an item seen held before the kill may
	// have been acked in between on a busy machine. Its session's row
	// outlives it until the expiry.
	heldAtKill := count(t, pool, `SELECT count(*) FROM crdbwork_items i JOIN crdbwork_sessions s ON s.id = i.claim WHERE s.pid = $1`, victim.Process.Pid)
	t.Logf("killed process %d holding %d items (%d just before the kill)", victim.Process.Pid, heldAtKill, pidHolds)
	waitFor(t, "two thirds of the items acked", 90*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM seq_results`) >= 2*total/3
	})
	joiner := start() // joins: parts move to it
	if parts > 0 {
		waitFor(t, "the new process to own a part (a rebalance)", 60*time.Second, func() bool {
			return count(t, pool, `SELECT count(*) FROM crdbwork_session_parts p JOIN crdbwork_sessions s ON s.id = p.session_id WHERE s.pid = $1`, joiner.Process.Pid) > 0
		})
	}
	waitFor(t, "every item ended", 120*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	if dead := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); dead != 0 {
		t.Fatalf("%d items dead", dead)
	}
	if n := count(t, pool, `SELECT count(*) FROM seq_results`); n != total {
		t.Fatalf("%d results for %d items", n, total)
	}
	if n := count(t, pool, `SELECT count(DISTINCT (item_key, n)) FROM seq_results`); n != total {
		t.Fatalf("%d distinct items acked, want %d (one result per item)", n, total)
	}
	if retried := count(t, pool, `SELECT count(*) FROM seq_starts WHERE attempt > 1`); retried == 0 && heldAtKill > 0 {
		t.Fatalf("no attempt after the kill was counted (the killed process held %d items)", heldAtKill)
	}
	type run struct {
		n              string
		started, ended int64
		attempt        int
		result         bool
	}
	byKey := map[string][]run{}
	rows, err := pool.Query(ctx, `SELECT item_key, n, started, ended FROM seq_results`)
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]run{} // key/n → its acked run
	var r run
	var key string
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.n, &r.started, &r.ended}, func() error {
		results[key+"/"+r.n] = r
		byKey[key] = append(byKey[key], run{n: r.n, started: r.started, ended: r.ended, result: true})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The acked runs of each key: in order of n, one after another.
	for key, runs := range byKey {
		sort.Slice(runs, func(i, j int) bool { return runs[i].started < runs[j].started })
		for i, r := range runs {
			if want := fmt.Sprintf("%02d", i); r.n != want {
				t.Fatalf("key %s: acked run %d is item %s, want %s (enqueue order)", key, i, r.n, want)
			}
			if i > 0 && runs[i-1].ended >= r.started {
				t.Fatalf("key %s: item %s started (%d) before item %s ended (%d)", key, r.n, r.started, runs[i-1].n, runs[i-1].ended)
			}
		}
	}
	// Every attempt: after the key's previous item ended, not after its
	// own ack.
	rows, err = pool.Query(ctx, `SELECT item_key, n, attempt, started FROM seq_starts`)
	if err != nil {
		t.Fatal(err)
	}
	var attempts int
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.n, &r.attempt, &r.started}, func() error {
		attempts++
		own, ok := results[key+"/"+r.n]
		if !ok {
			return fmt.Errorf("key %s item %s started, never acked", key, r.n)
		}
		if r.started > own.started {
			return fmt.Errorf("key %s item %s: attempt %d started (%d) after the attempt that was acked (%d)", key, r.n, r.attempt, r.started, own.started)
		}
		n, _ := strconv.Atoi(r.n)
		if n > 0 {
			prev := results[fmt.Sprintf("%s/%02d", key, n-1)]
			if r.started <= prev.ended {
				return fmt.Errorf("key %s item %s: attempt %d started (%d) before item %02d ended (%d)", key, r.n, r.attempt, r.started, n-1, prev.ended)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d items, %d attempts (%d retried after the kill)", total, attempts, attempts-total)
}
