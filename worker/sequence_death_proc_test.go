package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// The environment of TestSequencedDeathWorkerProcess, the worker processes
// that TestSequencedDeathsInProcesses starts.
const (
	seqDeathChildURL   = "CRDBWORK_SEQDEATH_CHILD_URL"
	seqDeathChildQueue = "CRDBWORK_SEQDEATH_CHILD_QUEUE"
)

// TestSequencedDeathWorkerProcess is a worker process of
// TestSequencedDeathsInProcesses (skipped otherwise): it works one queue
// until it is killed. Its handler records each attempt's start (by the
// database sequence seq_clock, committed at once); an item whose payload
// starts with "poison" fails permanently on its first attempt ever (a
// requeued one succeeds); every other
// attempt records, in its ack, the start and end of the run.
func TestSequencedDeathWorkerProcess(t *testing.T) {
	url := os.Getenv(seqDeathChildURL)
	if url == "" {
		t.Skip("a worker process of TestSequencedDeathsInProcesses")
	}
	queue := os.Getenv(seqDeathChildQueue)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	opts := worker.Options{Concurrency: 6, Session: seqProcSession, Poll: 50 * time.Millisecond, RestartDelay: 100 * time.Millisecond}
	if err := worker.ConfigurePool(cfg, opts); err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(worker.Connections(opts) + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q, err := claim.New(pool, claim.Options{Queue: queue, Lease: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		var start, before int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM seq_starts WHERE queue = $1 AND item_key = $2 AND n = $3`,
			queue, it.Key, string(it.Payload)).Scan(&before); err != nil {
			return nil, err
		}
		if err := pool.QueryRow(ctx, `INSERT INTO seq_starts (queue, item_key, n, attempt, started)
			VALUES ($1, $2, $3, $4, nextval('seq_clock')) RETURNING started`, queue, it.Key, string(it.Payload), it.Attempt).Scan(&start); err != nil {
			return nil, err
		}
		select {
		case <-time.After(30 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if strings.HasPrefix(string(it.Payload), "poison") && before == 0 {
			return nil, claim.Permanent(errors.New("poison"))
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO seq_results (queue, item_key, n, started, ended) VALUES ($1, $2, $3, $4, nextval('seq_clock'))`,
				queue, it.Key, string(it.Payload), start)
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

// TestSequencedDeathsInProcesses: three sequenced queues share a database
// with a plain one, each worked by two worker processes (sessions of their
// own): "hold" holds a key on a death, "advance" lets it advance, and
// "mixed" is switched from advance to hold in the middle. In every key,
// item 03 is poisoned: it dies on its first attempt. The test requeues each
// dead item while the key's next items are queued (in hold, waiting for
// it; in advance, running past it), then kills one process of each queue
// (SIGKILL) while it holds items (if the queue has not drained) and starts
// another. Then every item has ended acked once and
// per key:
//
//   - no attempt of an item started while another item of its key ran (by
//     the database clock seq_clock), the requeued one included;
//   - hold: the items were acked in enqueue order, the requeued 03 in its
//     place; nothing after 03 started before 03's requeued run ended;
//   - advance: the items other than 03 were acked in enqueue order.
func TestSequencedDeathsInProcesses(t *testing.T) {
	t.Parallel()
	if os.Getenv(seqDeathChildURL) != "" || os.Getenv(seqChildURL) != "" {
		t.Skip("in a worker process")
	}
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range []string{
		`CREATE SEQUENCE seq_clock`,
		`CREATE TABLE seq_starts (queue TEXT NOT NULL, item_key TEXT NOT NULL, n TEXT NOT NULL, attempt INT NOT NULL, started BIGINT NOT NULL)`,
		`CREATE TABLE seq_results (queue TEXT NOT NULL, item_key TEXT NOT NULL, n TEXT NOT NULL, started BIGINT NOT NULL, ended BIGINT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	const keys, perKey = 8, 20
	queues := []string{"hold", "advance", "mixed"}
	qs := map[string]*claim.Queue{}
	for _, name := range queues {
		q := newQueue(t, pool, claim.Options{Queue: name})
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
			t.Fatal(err)
		}
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: holdToggle(name == "hold")}); err != nil {
			t.Fatal(err)
		}
		var items []claim.NewItem
		for n := range perKey {
			for k := range keys {
				p := fmt.Sprintf("%02d", n)
				if n == 3 {
					p = "poison-03"
				}
				items = append(items, claim.NewItem{Key: fmt.Sprint("key-", k), Payload: []byte(p)})
			}
		}
		if _, err := q.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
		qs[name] = q
	}
	// A plain queue beside them, with a backlog nobody works.
	plain := newQueue(t, pool, claim.Options{Queue: "plain"})
	for range 5 {
		items := make([]claim.NewItem, 200)
		for i := range items {
			items[i].Payload = []byte("x")
		}
		if _, err := plain.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
	}
	start := func(queue string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSequencedDeathWorkerProcess$", "-test.count=1")
		cmd.Env = testdb.Environ([]string{seqDeathChildURL + "=", seqDeathChildQueue + "=", seqChildURL + "="},
			seqDeathChildURL+"="+url, seqDeathChildQueue+"="+queue)
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
	procs := map[string][]*exec.Cmd{}
	for _, name := range queues {
		procs[name] = []*exec.Cmd{start(name), start(name)}
	}
	// "mixed" holds from the moment its first poisoned item died.
	waitFor(t, "a death in every queue", 90*time.Second, func() bool {
		return count(t, pool, `SELECT count(DISTINCT queue) FROM crdbwork_dead_items`) == len(queues)
	})
	if err := qs["mixed"].UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
		t.Fatal(err)
	}
	// Requeue every dead item once all of its queue's deaths happened,
	// while the keys' later items are queued (hold: all of them; advance:
	// those not yet run).
	requeued := map[string]int{}
	waitFor(t, "every poisoned item dead and requeued", 120*time.Second, func() bool {
		done := true
		for _, name := range queues {
			if requeued[name] == keys {
				continue
			}
			done = false
			if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`, name); n < keys {
				continue
			}
			if name == "hold" {
				// Held: no item after 03 of any key has started.
				if n := count(t, pool, `SELECT count(*) FROM seq_starts WHERE queue = 'hold' AND n > '03' AND n < 'p'`); n != 0 {
					t.Fatalf("hold: %d attempts of items after the dead 03 started while it was dead", n)
				}
				blocked, err := qs[name].BlockedKeys(ctx, 100)
				if err != nil || len(blocked) != keys {
					t.Fatalf("hold: BlockedKeys = %d keys, %v; want %d", len(blocked), err, keys)
				}
			}
			dead, err := deadList(qs[name].DeadItems(ctx, claim.DeadQuery{Limit: 100}))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range dead {
				if ok, err := requeuedOne(qs[name].Requeue(ctx, claim.RequeueOptions{ID: d.ID})); err != nil {
					t.Fatal(err)
				} else if ok {
					requeued[name]++
				}
			}
		}
		return done
	})
	// Kill one process of each queue while it holds items.
	dumpOnFail(t, pool)
	for _, name := range queues {
		victim := procs[name][0]
		waitFor(t, "the victim of "+name+" to hold items, or the queue to drain", 60*time.Second, func() bool {
			return count(t, pool, `SELECT count(*) FROM crdbwork_items i JOIN crdbwork_sessions s ON s.id = i.claim WHERE s.pid = $1`, victim.Process.Pid) > 0 ||
				count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1`, name) == 0
		})
		_ = victim.Process.Signal(syscall.SIGKILL)
		_ = victim.Wait()
		start(name)
	}
	waitFor(t, "every item ended", 180*time.Second, func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue <> 'plain'`) == 0
	})
	if dead := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); dead != 0 {
		t.Fatalf("%d items dead at the end", dead)
	}
	for _, name := range queues {
		checkSequencedRuns(t, pool, name, keys, perKey)
	}
}

// checkSequencedRuns checks the runs of queue's items (see
// TestSequencedDeathsInProcesses).
func checkSequencedRuns(t *testing.T, pool *pgxpool.Pool, queue string, keys, perKey int) {
	t.Helper()
	ctx := context.Background()
	if n := count(t, pool, `SELECT count(DISTINCT (item_key, n)) FROM seq_results WHERE queue = $1`, queue); n != keys*perKey {
		t.Fatalf("%s: %d distinct items acked, want %d", queue, n, keys*perKey)
	}
	if n := count(t, pool, `SELECT count(*) FROM seq_results WHERE queue = $1`, queue); n != keys*perKey {
		t.Fatalf("%s: %d results for %d items (one each)", queue, n, keys*perKey)
	}
	type run struct {
		n              string
		started, ended int64
	}
	runs := map[string][]run{}
	rows, err := pool.Query(ctx, `SELECT item_key, n, started, ended FROM seq_results WHERE queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var r run
	if _, err := pgx.ForEachRow(rows, []any{&key, &r.n, &r.started, &r.ended}, func() error {
		runs[key] = append(runs[key], r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for key, rs := range runs {
		sort.Slice(rs, func(i, j int) bool { return rs[i].started < rs[j].started })
		var order []string
		for i, r := range rs {
			if i > 0 && rs[i-1].ended >= r.started {
				t.Fatalf("%s key %s: item %s started (%d) before item %s ended (%d)", queue, key, r.n, r.started, rs[i-1].n, rs[i-1].ended)
			}
			if queue == "hold" || r.n != "poison-03" {
				order = append(order, strings.TrimPrefix(r.n, "poison-"))
			}
		}
		if !sort.StringsAreSorted(order) {
			t.Fatalf("%s key %s: acked in the order %v", queue, key, order)
		}
	}
	// No attempt started inside another item's run of its key.
	rows, err = pool.Query(ctx, `SELECT s.item_key, s.n, s.attempt, s.started, r.n, r.started, r.ended
		FROM seq_starts AS s JOIN seq_results AS r ON r.queue = s.queue AND r.item_key = s.item_key AND r.n <> s.n
		WHERE s.queue = $1 AND s.started BETWEEN r.started AND r.ended LIMIT 5`, queue)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	var n, other string
	var attempt int
	var started, oStart, oEnd int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &n, &attempt, &started, &other, &oStart, &oEnd}, func() error {
		bad = append(bad, fmt.Sprintf("key %s item %s attempt %d started at %d inside item %s's run %d–%d", key, n, attempt, started, other, oStart, oEnd))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("%s: two items of a key in flight: %s", queue, strings.Join(bad, "; "))
	}
	attempts := count(t, pool, `SELECT count(*) FROM seq_starts WHERE queue = $1`, queue)
	t.Logf("%s: %d items, %d attempts", queue, keys*perKey, attempts)
}

// dumpOnFail logs the sequenced queues' items, the sessions and the dead
// items when t has failed, at its end.
func dumpOnFail(t *testing.T, pool *pgxpool.Pool) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, _ := pool.Query(context.Background(), `SELECT queue || ' ' || item_key || ' ' || convert_from(payload, 'UTF8') || ' claim=' || COALESCE(claim::TEXT, '-') || ' att=' || attempts || ' vest=' || (vesting_at > now())::TEXT || ' seq=' || COALESCE(seq_order::TEXT, '-') || ' enq=' || enqueued_at::TEXT FROM crdbwork_items WHERE queue <> 'plain' ORDER BY queue, item_key, enqueued_at, seq_order LIMIT 40`)
		lines, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Logf("items:\n%s", strings.Join(lines, "\n"))
		rows, _ = pool.Query(context.Background(), `SELECT id::TEXT || ' ' || pid || ' ' || (now() - heartbeat_at)::TEXT FROM crdbwork_sessions`)
		lines, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		t.Logf("sessions:\n%s", strings.Join(lines, "\n"))
		rows, _ = pool.Query(context.Background(), `SELECT queue || ' ' || item_key || ' ' || convert_from(payload, 'UTF8') || ' hold=' || seq_hold::TEXT FROM crdbwork_dead_items`)
		lines, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		t.Logf("dead:\n%s", strings.Join(lines, "\n"))
	})
}
