package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Wake-ups in parts mode whose items are in parts the woken session does
// not own when it claims: the claim that spends the wake-up reads nothing,
// and nothing announces those items again. The tests' workers poll every
// ten minutes (sleepyPoll), so only the worker's own reaction can claim
// them within wakeDeadline.

// steadySession returns a session that a loaded machine does not lose: the
// tests below must not see a new session, whose first claims would find
// the items anyway. Its heartbeat stretches with the machine's load (each
// heartbeat gives up after two intervals) and its expiry is 200 of them.
func steadySession() session.Tuning {
	hb := await.Stretch(100 * time.Millisecond)
	return session.Tuning{Heartbeat: hb, Expiry: 200 * hb}
}

// peerMember joins the queue "default" as a member that owns its share of
// the parts and claims nothing; leave closes its session, which hands its
// parts over at once.
func peerMember(t *testing.T, pool *pgxpool.Pool) (id uuid.UUID, leave func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := session.Start(ctx, pool, session.Options{Tuning: steadySession()})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	reb, err := partition.New(pool, s, partition.Options{Tuning: partition.Tuning{Poll: 50 * time.Millisecond}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); reb.Run(ctx) }()
	var once bool
	leave = func() {
		if once {
			return
		}
		once = true
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("closing the peer's session: %v", err)
		}
		<-done
		cancel()
	}
	t.Cleanup(leave)
	return s.ID(), leave
}

// partsOf returns the parts of queue "default" that session owns.
func partsOf(t *testing.T, pool *pgxpool.Pool, sess string) map[int]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT part FROM crdbwork_session_parts WHERE queue = 'default' AND session_id = $1`, sess)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, p := range ps {
		out[p] = true
	}
	return out
}

// keyedHandler returns a handler that sends each item to the returned
// channel when it starts, and acks it.
func keyedHandler() (worker.Handler, chan claim.Item) {
	started := make(chan claim.Item, 100)
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started <- it
		return nil, nil
	}, started
}

// awaitKeyed waits for a handler of keyedHandler to start on one item, and
// returns it.
func awaitKeyed(t *testing.T, started <-chan claim.Item, what string) claim.Item {
	t.Helper()
	return await.Recv(t, fmt.Sprintf("%s: a handler to start (the poll interval is %v)", what, sleepyPoll), started, await.Within(wakeDeadline))
}

// An item whose wake-up came while another session owned its part runs
// as soon as the woken worker gains the part (here, when that session
// leaves), not at the worker's next poll: the wake-up's claim read only
// the worker's own parts, and the item is announced only once.
func TestWakeOfAPartGainedAfterwards(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	const parts = 4
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	peer, leave := peerMember(t, pool)
	h, started := keyedHandler()
	r := start(t, pool, h, worker.Options{Poll: sleepyPoll, Parts: parts, Session: steadySession(),
		Partition: partition.Tuning{Poll: 50 * time.Millisecond}})
	awaitListening(t, r)
	var mine, theirs map[int]bool
	waitFor(t, "the worker and the peer to own two parts each", wakeDeadline, func() bool {
		cur := r.w.Stats().Session
		if cur == "" {
			return false
		}
		mine, theirs = partsOf(t, pool, cur), partsOf(t, pool, peer.String())
		return len(mine) == parts/2 && len(theirs) == parts/2
	})
	// Eight keyed items (a wake-up with hints: it names their parts),
	// whose keys fall in every part: their parts, as the database computes
	// them, read from the same keys in a queue nobody works.
	items := make([]claim.NewItem, 8)
	for i := range items {
		items[i] = claim.NewItem{Key: fmt.Sprintf("key-%d", i), Payload: []byte("x")}
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "scratch", parts); err != nil {
		t.Fatal(err)
	}
	if _, err := newQueue(t, pool, claim.Options{Queue: "scratch", NoNotify: true}).Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT item_key, part FROM crdbwork_items WHERE queue = 'scratch'`)
	if err != nil {
		t.Fatal(err)
	}
	partOf := map[string]int{}
	var key string
	var part int
	if _, err := pgx.ForEachRow(rows, []any{&key, &part}, func() error { partOf[key] = part; return nil }); err != nil {
		t.Fatal(err)
	}
	var ours, peers int
	seen := map[int]bool{}
	for _, p := range partOf {
		seen[p] = true
		switch {
		case mine[p]:
			ours++
		case theirs[p]:
			peers++
		}
	}
	if len(seen) != parts || ours+peers != len(items) {
		t.Fatalf("the keys fall in parts %v (the worker's %v, the peer's %v): choose other keys", seen, mine, theirs)
	}
	before := r.w.Stats().Wakeups
	if _, err := newQueue(t, pool, claim.Options{}).Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// The wake-up claims the items of the worker's parts.
	for i := range ours {
		it := awaitKeyed(t, started, fmt.Sprintf("item %d of %d in the worker's parts", i, ours))
		if !mine[it.Part] || partOf[it.Key] != it.Part {
			t.Fatalf("item %s of key %s ran in part %d while the worker owned %v", it.ID, it.Key, it.Part, mine)
		}
	}
	if w := r.w.Stats().Wakeups; w <= before {
		t.Fatalf("the items were claimed without a wake-up (wake-ups %d, before %d)", w, before)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'default' AND claim IS NULL`); n != peers {
		t.Fatalf("%d unclaimed items, want the %d of the peer's parts", n, peers)
	}
	// The peer leaves: its parts are free, and the worker takes them.
	leave()
	for i := range peers {
		it := awaitKeyed(t, started, fmt.Sprintf("item %d of %d in the parts the worker gained", i, peers))
		if !theirs[it.Part] {
			t.Fatalf("item %s of key %s (part %d) ran twice", it.ID, it.Key, it.Part)
		}
	}
}

// A claim that a wake-up started and that fails (here its connection is
// terminated while it waits for a lock) is tried again within seconds, not
// at the next poll: the item it was woken for is not announced again.
//
// Not parallel: it counts the worker's wake-ups, and another test's
// enqueue into its own queue "default" wakes this worker too (in-process
// wake-ups are process-wide, keyed by the queue's channel).
func TestWakeClaimFailsAndIsTriedAgain(t *testing.T) {
	// An item that wakes nobody must wait in the queue: with the idle
	// probe (CockroachDB, the fault model) the probe finds it itself.
	listenOnly(t)
	url, pool := wakeSetup(t)
	if testdb.Kind(t) != "postgres" {
		t.Skip("holds a claim with a table lock and ends its backend (pg_terminate_backend): PostgreSQL's")
	}
	ctx := context.Background()
	h, started := startedHandler()
	r := start(t, pool, h, worker.Options{Poll: sleepyPoll, Session: steadySession()})
	awaitListening(t, r)
	// An item that wakes nobody (NoNotify, another process): the worker
	// idles with it in the queue.
	produce(t, url, "quiet::default")
	// The claim reads the queue's settings: with the table locked, it
	// waits.
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE crdbwork_queues IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	before := r.w.Stats().Wakeups
	newQueue(t, pool, claim.Options{}).Wake()
	// The claim statement waits (the reaper's, waiting too, also picks
	// rows). The claim first reads whether the queue is sequenced, which
	// waits too: that read's failure is not the claim's (it keeps its last
	// answer), so it is ended until the claim statement itself waits.
	var pid int
	await.Until(t, "the woken worker's claim to wait for the lock", func() bool {
		rows, err := pool.Query(ctx, `SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		if err != nil {
			t.Fatal(err)
		}
		var p int
		var q string
		var checks []int
		if _, err := pgx.ForEachRow(rows, []any{&p, &q}, func() error {
			switch {
			case strings.Contains(q, "attempts = i.attempts + 1"):
				pid = p
			case strings.Contains(q, "SELECT sequenced FROM"):
				checks = append(checks, p)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if pid != 0 {
			return true
		}
		for _, p := range checks {
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, p); err != nil {
				t.Fatal(err)
			}
		}
		return false
	}, await.Within(wakeDeadline), await.Every(20*time.Millisecond)) // the cadence at which the sequenced checks are ended
	if w := r.w.Stats().Wakeups; w != before+1 {
		t.Fatalf("%d wake-ups for one Wake", w-before)
	}
	var ended bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ended); err != nil || !ended {
		t.Fatalf("terminating the claim's backend %d: %v %v", pid, ended, err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	awaitItem(t, started, "the item whose claim failed")
	if w := r.w.Stats().Wakeups; w != before+1 {
		t.Errorf("%d wake-ups: the item was claimed after another one, not by the claim's retry", w-before)
	}
}

// Items that SetParts moves into a worker's parts are claimed at once: no
// enqueue announces them. Here the items are in parts past the queue's
// count, as a SetParts that failed half-way leaves them (its doc: run it
// again), and the worker idles; SetParts, run again, moves them into the
// worker's parts.
//
// Not parallel: in-process wake-ups (internal/wake's hub) are process-wide
// and keyed by the channel, the queue's name and tables, not by database:
// another test's enqueue into its own queue "default" wakes this worker,
// which then claims the items before the test moved them.
func TestWakeAfterSetPartsMovesItems(t *testing.T) {
	// Items that wake nobody must wait in the queue until SetParts: with
	// the idle probe (CockroachDB, the fault model) the probe finds them.
	listenOnly(t)
	url, pool := wakeSetup(t)
	ctx := context.Background()
	h, started := keyedHandler()
	r := start(t, pool, h, worker.Options{Poll: sleepyPoll, Parts: 4, Session: steadySession(),
		Partition: partition.Tuning{Poll: 50 * time.Millisecond}})
	awaitListening(t, r)
	waitFor(t, "the worker to own the 4 parts", wakeDeadline, func() bool {
		cur := r.w.Stats().Session
		return cur != "" && len(partsOf(t, pool, cur)) == 4
	})
	// Items that wake nobody (NoNotify, another process), then moved past
	// the count while unclaimed.
	const n = 3
	for range n {
		produce(t, url, "quiet::default")
	}
	tag, err := pool.Exec(ctx, `UPDATE crdbwork_items SET part = part + 4 WHERE queue = 'default' AND claim IS NULL`)
	if err != nil || tag.RowsAffected() != n {
		t.Fatalf("moved %d unclaimed items past the count (%v), want %d", tag.RowsAffected(), err, n)
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 4); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		it := awaitKeyed(t, started, fmt.Sprintf("moved item %d of %d", i, n))
		if it.Part >= 4 {
			t.Errorf("item %s ran in part %d of 4", it.ID, it.Part)
		}
	}
}
