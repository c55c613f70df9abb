package worker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// The wake-up tests run their workers with a poll interval of ten minutes
// (an idle wait of at least five), so that within their deadlines only a
// wake-up can make a worker claim what another process enqueued. (Under a
// load that stretches wakeDeadline past five minutes a poll could claim
// too: a missing wake-up would then pass unseen, never fail a test.)
const (
	sleepyPoll = 10 * time.Minute
	// wakeDeadline is generous, and stretched with the load as every await
	// budget: a wake-up takes milliseconds, the poll five minutes at least.
	wakeDeadline = 60 * time.Second
)

// producerEnv names the environment variable that turns
// TestWakeProducerProcess into the producer process: its value lists the
// steps to run (see TestWakeProducerProcess).
const producerEnv = "CRDBWORK_WAKE_PRODUCER"

// TestWakeProducerProcess is not a test: run by produce in a process of its
// own, it enqueues items into the database CRDBWORK_WAKE_URL, one step per
// ';'-separated element of CRDBWORK_WAKE_PRODUCER, in order, each in its
// own transaction: "enqueue:PREFIX:QUEUE" (claim.Queue.Enqueue of one
// item), "quiet:PREFIX:QUEUE" (the same with claim.Options.NoNotify),
// "rollback:PREFIX:QUEUE" (EnqueueTx of one item in a transaction that
// rolls back). PREFIX is the tables' prefix ("" for the default tables).
func TestWakeProducerProcess(t *testing.T) {
	steps := os.Getenv(producerEnv)
	if steps == "" {
		t.Skip("run by the wake-up tests as their producer process")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("CRDBWORK_WAKE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, step := range strings.Split(steps, ";") {
		f := strings.Split(step, ":")
		if len(f) != 3 {
			t.Fatalf("step %q: want mode:prefix:queue", step)
		}
		mode, prefix, queue := f[0], f[1], f[2]
		q, err := claim.New(pool, claim.Options{Queue: queue, Tables: crsql.Tables{Prefix: prefix}, NoNotify: mode == "quiet"})
		if err != nil {
			t.Fatal(err)
		}
		item := claim.NewItem{Payload: []byte(step)}
		switch mode {
		case "enqueue", "quiet":
			if _, err := q.Enqueue(ctx, item); err != nil {
				t.Fatalf("step %q: %v", step, err)
			}
		case "rollback":
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.EnqueueTx(ctx, tx, item); err != nil {
				t.Fatalf("step %q: %v", step, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("step %q: unknown mode", step)
		}
	}
}

// produce runs the steps (see TestWakeProducerProcess) in another process
// and fails the test unless it succeeded.
func produce(t *testing.T, url string, steps ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWakeProducerProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), producerEnv+"="+strings.Join(steps, ";"), "CRDBWORK_WAKE_URL="+url)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestWakeProducerProcess") {
		t.Fatalf("producer process %q: %v\n%s", steps, err, out)
	}
}

// wakeSetup returns the URL of a fresh database with the default tables
// and a pool on it.
func wakeSetup(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testschema.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return url, pool
}

// startedHandler returns a handler that sends each item's id to the
// returned channel when it starts, and acks it.
func startedHandler() (worker.Handler, chan uuid.UUID) {
	started := make(chan uuid.UUID, 100)
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started <- it.ID
		return nil, nil
	}, started
}

// awaitItem waits for a handler to start on one item, and returns it.
func awaitItem(t *testing.T, started <-chan uuid.UUID, what string) uuid.UUID {
	t.Helper()
	return await.Recv(t, fmt.Sprintf("%s: a handler to start (the poll interval is %v: only a wake-up claims sooner)", what, sleepyPoll), started, await.Within(wakeDeadline))
}

// listenerPid returns the backend pid of the process's wake-up listener on
// pool's database (the connection whose last statement was a LISTEN), or 0.
func listenerPid(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var pids []int
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN %'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(pids) > 1 {
		t.Fatalf("%d listener connections %v, want one per process", len(pids), pids)
	}
	if len(pids) == 0 {
		return 0
	}
	return pids[0]
}

// listenOnly skips a test of LISTEN/NOTIFY on CockroachDB, which has
// neither, and in the CockroachDB fault model (which has none either): the
// workers are woken by the idle probe (probe_test.go).
func listenOnly(t *testing.T) {
	t.Helper()
	if testdb.Kind(t) != "postgres" {
		t.Skip("LISTEN/NOTIFY are PostgreSQL's; on CockroachDB the idle probe wakes workers (probe_test.go)")
	}
	if testdb.FaultsOn() {
		t.Skip("LISTEN/NOTIFY: the CockroachDB fault model (CRDBWORK_TEST_FAULTS) has none, as CockroachDB; the idle probe wakes workers (probe_test.go)")
	}
}

// awaitListening waits until r's channel is listened on: the listener
// signals each channel once right after its LISTEN, which counts as one of
// r's wake-ups. On CockroachDB, and in the CockroachDB fault model, there
// is no listener, and nothing to wait for.
func awaitListening(t *testing.T, r *running) {
	t.Helper()
	if testdb.Kind(t) != "postgres" || testdb.FaultsOn() {
		return
	}
	waitFor(t, "the worker's first wake-up (its channel listened on)", wakeDeadline, func() bool { return r.w.Stats().Wakeups >= 1 })
}

// An idle worker claims at once an item that another process enqueued, with
// and without parts: its poll interval is ten minutes, so only the
// notification can explain the claim.
func TestWakeClaimsItemEnqueuedByAnotherProcess(t *testing.T) {
	t.Parallel()
	listenOnly(t)
	// With parts, a wake-up names the items' key hashes and each worker
	// claims only in the parts of those it owns: with two workers, each
	// item is claimed at once by the owner of its part, whichever it is.
	for _, c := range []struct{ parts, workers, items int }{{0, 1, 3}, {4, 1, 3}, {8, 2, 8}} {
		t.Run(fmt.Sprintf("parts=%d,workers=%d", c.parts, c.workers), func(t *testing.T) {
			t.Parallel()
			url, pool := wakeSetup(t)
			h, started := startedHandler()
			var rs []*running
			for i := range c.workers {
				r := start(t, pool, h, worker.Options{Poll: sleepyPoll, Parts: c.parts, Partition: partition.Tuning{Poll: 50 * time.Millisecond}})
				if i == 0 {
					// The process's listener then listens on the channel
					// the other workers subscribe to.
					awaitListening(t, r)
				}
				rs = append(rs, r)
			}
			if c.parts > 0 {
				waitFor(t, "the workers to share every part", wakeDeadline, func() bool {
					owned := 0
					for _, r := range rs {
						st := r.w.Stats().Parts
						if st.Acquired == st.Released {
							return false // one owns none yet
						}
						owned += int(st.Acquired - st.Released)
					}
					return owned == c.parts
				})
			}
			wakeups := func() (n int64) {
				for _, r := range rs {
					n += r.w.Stats().Wakeups
				}
				return n
			}
			for i := range c.items {
				before := wakeups()
				produce(t, url, "enqueue::default")
				awaitItem(t, started, fmt.Sprintf("item %d", i))
				if w := wakeups(); w <= before {
					t.Errorf("item %d was claimed without a wake-up (wake-ups %d, before %d)", i, w, before)
				}
			}
			if pid := listenerPid(t, pool); pid == 0 {
				t.Error("no listener connection")
			}
			// WakeAuto on PostgreSQL: LISTEN, and no idle probe.
			if pids := probePids(t, pool); len(pids) != 0 {
				t.Errorf("probe connections %v on PostgreSQL with the default WakeAuto", pids)
			}
		})
	}
}

// With its listener's connection terminated, a worker still claims (by its
// poll), the listener reconnects, and wake-ups work again.
func TestWakeListenerKilledFallsBackToPollAndReconnects(t *testing.T) {
	t.Parallel()
	listenOnly(t)
	url, pool := wakeSetup(t)
	hFast, startedFast := startedHandler()
	hSleepy, startedSleepy := startedHandler()
	fast := startOn(t, newQueue(t, pool, claim.Options{Queue: "fast"}), hFast, worker.Options{Poll: 100 * time.Millisecond})
	sleepy := startOn(t, newQueue(t, pool, claim.Options{Queue: "sleepy"}), hSleepy, worker.Options{Poll: sleepyPoll})
	awaitListening(t, fast)
	awaitListening(t, sleepy)
	var pid int
	waitFor(t, "the listener's connection", wakeDeadline, func() bool { pid = listenerPid(t, pool); return pid != 0 })
	var killed bool
	if err := pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminating the listener's backend %d: %v, %v", pid, killed, err)
	}
	// No notification at all (NoNotify, and another process): only the
	// poll claims it, whatever state the listener is in.
	produce(t, url, "quiet::fast")
	awaitItem(t, startedFast, "the fast-polling worker's item")
	var again int
	waitFor(t, "a new listener connection", wakeDeadline, func() bool { again = listenerPid(t, pool); return again != 0 && again != pid })
	// The reconnection signals every channel once; the second item can
	// only come by its notification.
	for i := range 2 {
		produce(t, url, "enqueue::sleepy")
		awaitItem(t, startedSleepy, fmt.Sprintf("the sleepy worker's item %d after the reconnection", i))
	}
}

// Notifications of another queue, of the same queue on another table set,
// and of an enqueue that rolled back do not wake a worker.
func TestWakeOnlyForItsQueueAndCommits(t *testing.T) {
	t.Parallel()
	listenOnly(t)
	url, pool := wakeSetup(t)
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{Prefix: "other_"}); err != nil {
		t.Fatal(err)
	}
	hx, startedX := startedHandler()
	hz, startedZ := startedHandler()
	x := startOn(t, newQueue(t, pool, claim.Options{Queue: "x"}), hx, worker.Options{Poll: sleepyPoll})
	z := startOn(t, newQueue(t, pool, claim.Options{Queue: "z"}), hz, worker.Options{Poll: sleepyPoll})
	awaitListening(t, x)
	awaitListening(t, z)
	before := x.w.Stats().Wakeups
	// In commit order on one connection: z's notification comes last, so
	// once z's item runs the listener has handled every earlier one.
	produce(t, url, "enqueue::y", "enqueue:other_:x", "rollback::x", "enqueue::z")
	awaitItem(t, startedZ, "z's item")
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'x'`); n != 0 {
		t.Fatalf("%d items in queue x after a rolled-back enqueue", n)
	}
	// x's own item: exactly one more wake-up.
	produce(t, url, "enqueue::x")
	awaitItem(t, startedX, "x's item")
	select {
	case id := <-startedX:
		t.Fatalf("x handled another item %s", id)
	default:
	}
	if got := x.w.Stats().Wakeups; got != before+1 {
		t.Errorf("x woke %d times for its one item (other queues', tables' and rolled-back enqueues must not wake it)", got-before)
	}
}

// An enqueue through a claim.Queue in the worker's process wakes it
// directly, without the notification (NoNotify).
func TestWakeInProcessWithoutNotification(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	h, started := startedHandler()
	r := start(t, pool, h, worker.Options{Poll: sleepyPoll})
	awaitListening(t, r)
	other, err := pgxpool.New(context.Background(), pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	q := newQueue(t, other, claim.Options{NoNotify: true})
	for i := range 3 {
		if _, err := q.Enqueue(context.Background(), claim.NewItem{Payload: []byte("in-process")}); err != nil {
			t.Fatal(err)
		}
		awaitItem(t, started, fmt.Sprintf("item %d", i))
	}
}

// With NoWake, a worker opens no listener connection and is never woken.
func TestNoWakeOpensNoListener(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	h, started := startedHandler()
	r := start(t, pool, h, worker.Options{Poll: 50 * time.Millisecond, NoWake: true})
	enqueue(t, pool, "default", 1, false)
	awaitItem(t, started, "the item")
	if pid := listenerPid(t, pool); pid != 0 {
		t.Errorf("a listener connection (backend %d) with NoWake", pid)
	}
	if w := r.w.Stats().Wakeups; w != 0 {
		t.Errorf("%d wake-ups with NoWake", w)
	}
}
