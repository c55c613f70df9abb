package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// groupQueue is one queue of the group tests: parted (4 parts, 3
// handlers), tenants (fair, each tenant at most groupTenantLimit in
// flight, 5 handlers) and plain (2 handlers).
type groupQueue struct {
	name        string
	parts, conc int
	tenants     bool
}

var groupQueues = []groupQueue{{"parted", 4, 3, false}, {"tenants", 0, 5, true}, {"plain", 0, 2, false}}

// groupTenantLimit is the tenants queue's TenantMaxInFlight; its items
// belong to groupTenants.
const groupTenantLimit = 2

var groupTenants = []string{"t1", "t2", "t3"}

// prepareGroup creates the table group_runs (one row per handled item,
// written in its ack) and stores the tenants queue's policy (fair, a
// tenant limit), before any item is enqueued.
func prepareGroup(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE group_runs (queue TEXT NOT NULL, item_id UUID NOT NULL, session_id UUID NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "tenants"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true, TenantMaxInFlight: groupTenantLimit}}); err != nil {
		t.Fatal(err)
	}
}

// enqueueGroup enqueues n items into each group queue: keyed in parted,
// spread over the tenants in tenants.
func enqueueGroup(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	for _, gq := range groupQueues {
		items := make([]claim.NewItem, n)
		for i := range items {
			items[i].Payload = []byte(fmt.Sprint(i))
			if gq.parts > 0 {
				items[i].Key = fmt.Sprint("key-", i)
			}
			if gq.tenants {
				items[i].Tenant = groupTenants[i%len(groupTenants)]
			}
		}
		if _, err := newQueue(t, pool, claim.Options{Queue: gq.name}).Enqueue(context.Background(), items...); err != nil {
			t.Fatal(err)
		}
	}
}

// groupConfigs returns the QueueConfigs of the group queues on pool, with
// the handler h(queue) and opts(queue) as options (their parts and
// concurrency set).
func groupConfigs(t testing.TB, pool *pgxpool.Pool, h func(queue string) worker.Handler, opts func(gq groupQueue) worker.Options) []worker.QueueConfig {
	t.Helper()
	var qcs []worker.QueueConfig
	for _, gq := range groupQueues {
		o := opts(gq)
		o.Parts, o.Concurrency = gq.parts, gq.conc
		qcs = append(qcs, worker.QueueConfig{Queue: newQueue(t, pool, claim.Options{Queue: gq.name}), Handler: h(gq.name), Options: o})
	}
	return qcs
}

// recordRun returns the Record of an item handled by queue: its row in
// group_runs.
func recordRun(queue string, it claim.Item) worker.Record {
	return worker.Exec(`INSERT INTO group_runs (queue, item_id, session_id) VALUES ($1, $2, $3)`, queue, it.ID, it.Session)
}

// runGroup runs g until the test ends (or stop is called) and returns the
// stop, which waits for Run's nil.
func runGroup(t testing.TB, g *worker.Group) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := await.Recv(t, "the group to stop", done); err != nil {
				t.Errorf("Group.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// inFlight counts one queue's running handlers (and one tenant's), and
// the most seen at once.
type inFlight struct {
	mu         sync.Mutex
	cur, most  int
	tenantCur  map[string]int
	tenantMost map[string]int
}

func (f *inFlight) enter(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tenantCur == nil {
		f.tenantCur, f.tenantMost = map[string]int{}, map[string]int{}
	}
	f.cur++
	f.most = max(f.most, f.cur)
	f.tenantCur[tenant]++
	f.tenantMost[tenant] = max(f.tenantMost[tenant], f.tenantCur[tenant])
}

func (f *inFlight) leave(tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur--
	f.tenantCur[tenant]--
}

func (f *inFlight) read() (cur, most int, tenantMost map[string]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]int, len(f.tenantMost))
	for k, v := range f.tenantMost {
		m[k] = v
	}
	return f.cur, f.most, m
}

// One group serves three queues (one with parts, one fair with a tenant
// limit, one plain) with one session: each queue runs as many handlers at
// once as its own Concurrency — all of them, while their handlers are held
// (so one queue's handlers are not another's), and never more — the
// tenants queue keeps each tenant within its limit, every item of every
// queue is handled once, and the graceful stop deletes the one session.
func TestGroupServesQueuesEachWithItsOwnConcurrency(t *testing.T) {
	t.Parallel()
	const n = 60
	pool := setup(t)
	prepareGroup(t, pool)
	enqueueGroup(t, pool, n)
	meters := map[string]*inFlight{}
	gates := map[string]chan struct{}{}
	for _, gq := range groupQueues {
		meters[gq.name], gates[gq.name] = &inFlight{}, make(chan struct{})
	}
	h := func(queue string) worker.Handler {
		m, gate := meters[queue], gates[queue]
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			m.enter(it.Tenant)
			defer m.leave(it.Tenant)
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return recordRun(queue, it), nil
		}
	}
	g, err := worker.NewGroup(groupConfigs(t, pool, h, func(groupQueue) worker.Options { return worker.Options{Poll: 20 * time.Millisecond} }),
		worker.GroupOptions{Session: fastSession(), Name: "group-test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := runGroup(t, g)

	// Held: each queue fills its own handlers, no more.
	for _, gq := range groupQueues {
		m := meters[gq.name]
		await.Until(t, fmt.Sprintf("queue %s to run its %d handlers at once", gq.name, gq.conc), func() (bool, string) {
			cur, most, _ := m.read()
			return cur == gq.conc, fmt.Sprintf("%d running, at most %d", cur, most)
		})
	}
	var sessions []string
	for _, gq := range groupQueues {
		sessions = append(sessions, g.Worker(gq.name).Stats().Session)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 1 {
		t.Fatalf("%d sessions, want the group's one", n)
	}
	if err := g.Worker("plain").Run(context.Background()); err == nil {
		t.Fatal("Run of a group's worker succeeded")
	}
	if sessions[0] == "" || sessions[0] != sessions[1] || sessions[1] != sessions[2] {
		t.Fatalf("the queues' workers report sessions %q, want one", sessions)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_session_queues WHERE session_id = $1`, sessions[0]); n != len(groupQueues) {
		t.Fatalf("the session is a member of %d queues, want %d", n, len(groupQueues))
	}
	for _, gq := range groupQueues {
		close(gates[gq.name])
	}
	await.Until(t, "every item of every queue to end", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d left", left)
	})
	for _, gq := range groupQueues {
		_, most, tenantMost := meters[gq.name].read()
		if most != gq.conc {
			t.Errorf("queue %s ran at most %d handlers at once, want its Concurrency %d", gq.name, most, gq.conc)
		}
		if gq.tenants {
			for tenant, m := range tenantMost {
				if m > groupTenantLimit {
					t.Errorf("tenant %s of queue %s had %d items in flight, over its limit %d", tenant, gq.name, m, groupTenantLimit)
				}
			}
		}
		if got := count(t, pool, `SELECT count(DISTINCT item_id) FROM group_runs WHERE queue = $1`, gq.name); got != n {
			t.Errorf("queue %s: %d items handled, want %d", gq.name, got, n)
		}
		if got := count(t, pool, `SELECT count(*) FROM group_runs WHERE queue = $1`, gq.name); got != n {
			t.Errorf("queue %s: %d results for %d items", gq.name, got, n)
		}
	}
	if got := count(t, pool, `SELECT count(DISTINCT session_id) FROM group_runs`); got != 1 {
		t.Errorf("the items were handled under %d sessions, want the group's one", got)
	}
	stop()
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Fatalf("%d sessions after the graceful stop, want none", n)
	}
}

// A graceful stop of a group whose handlers are all busy releases every
// item of every queue at once (the session's deletion): no item is left
// claimed, none is lost, none used an attempt, and no session is left.
func TestGroupGracefulStopReleasesEveryQueue(t *testing.T) {
	t.Parallel()
	const n = 10
	pool := setup(t)
	prepareGroup(t, pool)
	enqueueGroup(t, pool, n)
	var running atomic.Int64
	h := func(queue string) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			running.Add(1)
			<-ctx.Done() // busy until the stop cancels it
			return nil, ctx.Err()
		}
	}
	shutdown := await.Stretch(200 * time.Millisecond)
	g, err := worker.NewGroup(groupConfigs(t, pool, h, func(groupQueue) worker.Options {
		return worker.Options{Poll: 20 * time.Millisecond, ShutdownTimeout: shutdown}
	}), worker.GroupOptions{Session: longSession()})
	if err != nil {
		t.Fatal(err)
	}
	stop := runGroup(t, g)
	want := 0
	for _, gq := range groupQueues {
		want += gq.conc
	}
	await.Until(t, "every queue's handlers to be busy", func() (bool, string) {
		return running.Load() == int64(want), fmt.Sprintf("%d of %d", running.Load(), want)
	})
	if got := count(t, pool, `SELECT count(DISTINCT queue) FROM crdbwork_items WHERE claim IS NOT NULL`); got != len(groupQueues) {
		t.Fatalf("items of %d queues claimed, want %d", got, len(groupQueues))
	}
	stop()
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NOT NULL`); got != 0 {
		t.Errorf("%d items still claimed after the graceful stop", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE attempts > 0`); got != 0 {
		t.Errorf("%d items lost an attempt to the stop, want released items", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_items`); got != n*len(groupQueues) {
		t.Errorf("%d items after the stop, want all %d", got, n*len(groupQueues))
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); got != 0 {
		t.Errorf("%d sessions after the graceful stop, want none", got)
	}
}

// A group whose pool has fewer connections than its queues use fails at
// once with ErrPoolTooSmall and starts no session; OpenGroup sizes its own
// pool for its queues, and its group drains them.
func TestGroupPoolSize(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var all []worker.Options
	for _, gq := range groupQueues {
		all = append(all, worker.Options{Parts: gq.parts})
	}
	need := worker.GroupPoolConns(all...)
	if need != 5+5+6 {
		t.Fatalf("GroupPoolConns = %d, want 16 (5 per queue, 6 with parts)", need)
	}
	cfg.MaxConns = int32(need - 1)
	small, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	h := func(queue string) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) { return recordRun(queue, it), nil }
	}
	g, err := worker.NewGroup(groupConfigs(t, small, h, func(groupQueue) worker.Options { return worker.Options{} }), worker.GroupOptions{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	err = await.Recv(t, "Run on a small pool to return", done)
	if !errors.Is(err, worker.ErrPoolTooSmall) {
		t.Fatalf("Run on a pool of %d for %d: %v, want ErrPoolTooSmall", need-1, need, err)
	}
	t.Logf("the error: %v", err)
	if n := count(t, small, `SELECT count(*) FROM crdbwork_sessions`); n != 0 {
		t.Fatalf("%d sessions started on the small pool", n)
	}

	// OpenGroup: a pool of its own, sized.
	var qcs []worker.QueueConfig
	for _, gq := range groupQueues {
		qcs = append(qcs, worker.QueueConfig{Claim: claim.Options{Queue: gq.name}, Handler: h(gq.name),
			Options: worker.Options{Parts: gq.parts, Concurrency: gq.conc, Poll: 20 * time.Millisecond}})
	}
	og, err := worker.OpenGroup(ctx, url, qcs, worker.GroupOptions{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(og.Close)
	if got, want := og.Pool().Config().MaxConns, int32(need+worker.DefaultExtraConns); got != want {
		t.Fatalf("OpenGroup's pool has MaxConns %d, want %d", got, want)
	}
	prepareGroup(t, og.Pool())
	for _, gq := range groupQueues {
		if _, err := og.Queue(gq.name).Enqueue(ctx, claim.NewItem{Payload: []byte("x"), Key: "k", Tenant: "t1"}); err != nil {
			t.Fatal(err)
		}
	}
	stop := runGroup(t, og)
	await.Until(t, "OpenGroup's group to handle an item of each queue", func() (bool, string) {
		n := count(t, og.Pool(), `SELECT count(*) FROM group_runs`)
		return n == len(groupQueues), fmt.Sprintf("%d handled", n)
	})
	stop()
	if n := count(t, og.Pool(), `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items left", n)
	}
}

// NewGroup refuses what cannot work: no queue, a queue twice, queues of
// other tables or of another database, a session option set on a queue.
func TestNewGroupRefusesBadQueues(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	h := func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }
	a, b := newQueue(t, pool, claim.Options{Queue: "a"}), newQueue(t, pool, claim.Options{Queue: "b"})
	other := newQueue(t, pool, claim.Options{Queue: "c", Tables: crsql.Tables{Prefix: "other_"}})
	elsewhere := newQueue(t, setup(t), claim.Options{Queue: "d"})
	for _, c := range []struct {
		what   string
		queues []worker.QueueConfig
	}{
		{"no queue", nil},
		{"a nil queue", []worker.QueueConfig{{Handler: h}}},
		{"a nil handler", []worker.QueueConfig{{Queue: a}}},
		{"a queue twice", []worker.QueueConfig{{Queue: a, Handler: h}, {Queue: a, Handler: h}}},
		{"other tables", []worker.QueueConfig{{Queue: a, Handler: h}, {Queue: other, Handler: h}}},
		{"another database", []worker.QueueConfig{{Queue: a, Handler: h}, {Queue: elsewhere, Handler: h}}},
		{"a queue's session", []worker.QueueConfig{{Queue: a, Handler: h}, {Queue: b, Handler: h, Options: worker.Options{Session: fastSession()}}}},
		{"a queue's name", []worker.QueueConfig{{Queue: a, Handler: h, Options: worker.Options{Name: "x"}}}},
		{"bad options", []worker.QueueConfig{{Queue: a, Handler: h, Options: worker.Options{Concurrency: -1}}}},
	} {
		if _, err := worker.NewGroup(c.queues, worker.GroupOptions{}); err == nil {
			t.Errorf("%s: NewGroup succeeded", c.what)
		} else {
			t.Logf("%s: %v", c.what, err)
		}
	}
}

// Three queues of a group are woken, on PostgreSQL, through the process's
// one LISTEN connection: items that another process enqueues into each are
// claimed although the group's queues poll every ten minutes, and one
// connection listens.
func TestGroupWakesEveryQueueOnOneListener(t *testing.T) {
	t.Parallel()
	listenOnly(t)
	url, _ := wakeSetup(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	started := make(chan string, 10)
	h := func(queue string) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			started <- queue
			return nil, nil
		}
	}
	g, err := worker.NewGroup(groupConfigs(t, pool, h, func(groupQueue) worker.Options { return worker.Options{Poll: sleepyPoll} }),
		worker.GroupOptions{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	runGroup(t, g)
	for _, gq := range groupQueues {
		waitFor(t, "queue "+gq.name+"'s first wake-up (its channel listened on)", wakeDeadline, func() bool { return g.Worker(gq.name).Stats().Wakeups >= 1 })
	}
	for _, gq := range groupQueues {
		produce(t, url, "enqueue::"+gq.name)
		if got := await.Recv(t, "a handler of "+gq.name+" to start (only a wake-up claims before ten minutes)", started, await.Within(wakeDeadline)); got != gq.name {
			t.Fatalf("a handler of %s started, want %s", got, gq.name)
		}
	}
	if pid := listenerPid(t, pool); pid == 0 { // fails on more than one
		t.Fatal("no listener connection")
	}
}

// The environment of TestGroupProcess, the group process that
// TestGroupKilledReleasesEveryQueue starts and kills.
const groupChildURL = "CRDBWORK_GROUP_CHILD_URL"

// TestGroupProcess is a process of TestGroupKilledReleasesEveryQueue (it
// is skipped otherwise): a group of the three group queues whose handlers
// work 20 ms each, except on the item "0" of each queue, which they hold
// until the process is killed.
func TestGroupProcess(t *testing.T) {
	url := os.Getenv(groupChildURL)
	if url == "" {
		t.Skip("a process of TestGroupKilledReleasesEveryQueue")
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h := func(queue string) worker.Handler {
		work := slowRecord(queue)
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			if string(it.Payload) == "0" {
				<-ctx.Done() // held until the kill
				return nil, ctx.Err()
			}
			return work(ctx, it)
		}
	}
	g, err := worker.NewGroup(groupConfigs(t, pool, h, func(groupQueue) worker.Options { return worker.Options{Poll: 20 * time.Millisecond} }),
		worker.GroupOptions{Session: fastSession(), Name: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// slowRecord is the handler of queue that works 20 ms (or until its
// context ends) and records the item.
func slowRecord(queue string) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		select {
		case <-time.After(20 * time.Millisecond): // the work
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return recordRun(queue, it), nil
	}
}

// A group process is killed (SIGKILL) while it holds items of each of its
// three queues (an item of each that its handler never finishes): once its session expires, a group in another process
// reaps it, and every item of every queue ends, each handled exactly once
// (its result written in its ack), none dead.
func TestGroupKilledReleasesEveryQueue(t *testing.T) {
	t.Parallel()
	if os.Getenv(groupChildURL) != "" {
		t.Skip("in a child process")
	}
	const n = 200
	url := testschema.NewURL(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 20 // the survivor group's 16, and the test's reads
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	prepareGroup(t, pool)
	enqueueGroup(t, pool, n)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGroupProcess$", "-test.count=1")
	cmd.Env = testdb.Environ([]string{groupChildURL + "="}, groupChildURL+"="+url)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
		}
	})
	var doomed uuid.UUID
	await.Until(t, "the group process to hold items of each queue and to have handled some", func() (bool, string) {
		held := count(t, pool, `SELECT count(DISTINCT i.queue) FROM crdbwork_items AS i JOIN crdbwork_sessions AS s ON s.id = i.claim WHERE s.name = 'doomed'`)
		done := count(t, pool, `SELECT count(DISTINCT queue) FROM group_runs`)
		return held == len(groupQueues) && done == len(groupQueues), fmt.Sprintf("items of %d queues held, of %d handled", held, done)
	})
	if err := pool.QueryRow(ctx, `SELECT id FROM crdbwork_sessions WHERE name = 'doomed'`).Scan(&doomed); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	held := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim = $1`, doomed)
	t.Logf("killed the group process holding %d items", held)

	g, err := worker.NewGroup(groupConfigs(t, pool, slowRecord, func(groupQueue) worker.Options { return worker.Options{Poll: 20 * time.Millisecond} }),
		worker.GroupOptions{Session: fastSession(), Name: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	runGroup(t, g)
	await.Until(t, "every item of every queue to end", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d left", left)
	}, await.Within(2*time.Minute))
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, doomed); got != 0 {
		t.Errorf("the killed group's session is still there")
	}
	for _, gq := range groupQueues {
		if got := count(t, pool, `SELECT count(*) FROM group_runs WHERE queue = $1`, gq.name); got != n {
			t.Errorf("queue %s: %d results, want %d", gq.name, got, n)
		}
		if got := count(t, pool, `SELECT count(DISTINCT item_id) FROM group_runs WHERE queue = $1`, gq.name); got != n {
			t.Errorf("queue %s: %d items handled, want %d", gq.name, got, n)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`); got != 0 {
		t.Errorf("%d dead items", got)
	}
}

// A graceful stop waits for every queue's handlers before it ends the
// group's one session: a queue with nothing to do is done at once, and the
// handler that another queue is running when the stop begins still
// finishes, with its context live, and its item is acked. (Were the
// session closed by the first queue done with it, the handler's context
// would end and its item would be released, not acked.)
func TestGroupStopWaitsForEveryQueuesHandlers(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	prepareGroup(t, pool)
	busy := newQueue(t, pool, claim.Options{Queue: "busy"})
	idle := newQueue(t, pool, claim.Options{Queue: "idle"})
	res, err := busy.Enqueue(context.Background(), claim.NewItem{Payload: []byte("slow")})
	if err != nil {
		t.Fatal(err)
	}
	started, stopping := make(chan struct{}), make(chan struct{})
	work := await.Stretch(300 * time.Millisecond)
	var cancelled atomic.Bool
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		close(started)
		<-stopping
		// The work that outlasts the start of the stop: long enough for
		// the idle queue to be done with the session (its claim loop ends
		// at once).
		select {
		case <-time.After(work):
		case <-ctx.Done():
			cancelled.Store(true)
			return nil, ctx.Err()
		}
		return recordRun("busy", it), nil
	}
	never := func(context.Context, claim.Item) (worker.Record, error) {
		return nil, errors.New("the idle queue has no item")
	}
	g, err := worker.NewGroup([]worker.QueueConfig{
		{Queue: idle, Handler: never, Options: worker.Options{Poll: 20 * time.Millisecond}},
		{Queue: busy, Handler: h, Options: worker.Options{Poll: 20 * time.Millisecond, ShutdownTimeout: time.Minute}},
	}, worker.GroupOptions{Session: longSession(), ShutdownTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	await.Recv(t, "the busy queue's handler to start", started)
	cancel() // the graceful stop
	close(stopping)
	if err := await.Recv(t, "the group to stop", ran); err != nil {
		t.Fatalf("Group.Run: %v", err)
	}
	if cancelled.Load() {
		t.Fatal("the busy queue's handler saw its context end during the graceful stop")
	}
	if got := count(t, pool, `SELECT count(*) FROM group_runs WHERE item_id = $1`, res.IDs[0]); got != 1 {
		t.Fatalf("the busy queue's item has %d results, want 1 (acked during the stop)", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_items`); got != 0 {
		t.Fatalf("%d items left", got)
	}
}

// Workers that share a pool too small for all of them are warned of: one
// worker alone on a pool of PoolConns + 1 connections is not, a second
// worker of another queue on it is (its Run logs that the pool is smaller
// than what the workers running on it use), and both work.
func TestWorkersSharingASmallPoolAreWarned(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(worker.PoolConns(worker.Options{}) + 1)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	core, logs := observer.New(zap.WarnLevel)
	warned := func() int {
		return logs.FilterMessageSnippet("the pool is smaller than what the workers running on it use").Len()
	}
	h := func(context.Context, claim.Item) (worker.Record, error) { return nil, nil }
	first := startOn(t, newQueue(t, pool, claim.Options{Queue: "first"}), h, worker.Options{Logger: zap.New(core), Poll: 20 * time.Millisecond})
	await.Until(t, "the first worker's session", func() bool { return first.w.Stats().Session != "" })
	if n := warned(); n != 0 {
		t.Fatalf("%d warnings of a small pool for one worker on a pool of %d", n, cfg.MaxConns)
	}
	second := startOn(t, newQueue(t, pool, claim.Options{Queue: "second"}), h, worker.Options{Logger: zap.New(core), Poll: 20 * time.Millisecond})
	await.Until(t, "a warning that the pool is too small for both workers", func() bool { return warned() == 1 })
	for _, r := range []*running{first, second} {
		if _, err := r.w.Queue().Enqueue(context.Background(), claim.NewItem{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	await.Until(t, "both workers to ack their item", func() bool { return first.w.Stats().Acked == 1 && second.w.Stats().Acked == 1 })
}

// A group of three queues on a pool of exactly GroupPoolConns connections
// drains them all within GroupConnections connections to the database in
// all (the pool's, one heartbeat's and one listener's), where three
// workers would open three heartbeat connections: one session serves them.
func TestGroupConnectionsBounded(t *testing.T) {
	t.Parallel()
	const n = 300
	direct := setup(t)
	prepareGroup(t, direct)
	enqueueGroup(t, direct, n)
	var all []worker.Options
	for _, gq := range groupQueues {
		all = append(all, worker.Options{Parts: gq.parts, Concurrency: gq.conc})
	}
	const app = "crdbwork-group-connections"
	cfg := direct.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = int32(worker.GroupPoolConns(all...))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	g, err := worker.NewGroup(groupConfigs(t, pool, slowRecord, func(groupQueue) worker.Options { return worker.Options{Poll: 20 * time.Millisecond} }),
		worker.GroupOptions{Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	stop := runGroup(t, g)
	peak, sessions := 0, 0
	await.Until(t, "every item of every queue to end", func() (bool, string) {
		peak = max(peak, count(t, direct, connectionsStatement(t), app))
		sessions = max(sessions, count(t, direct, `SELECT count(*) FROM crdbwork_sessions`))
		left := count(t, direct, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d left", left)
	}, await.Within(2*time.Minute))
	stop()
	limit := worker.GroupConnections(all...)
	t.Logf("peak %d connections to the database (limit %d)", peak, limit)
	if peak == 0 || peak > limit {
		t.Errorf("peak %d connections, want at most %d", peak, limit)
	}
	if sessions != 1 {
		t.Errorf("at most %d sessions at once, want the group's one", sessions)
	}
	if got := count(t, direct, `SELECT count(*) FROM group_runs`); got != n*len(groupQueues) {
		t.Errorf("%d results, want %d", got, n*len(groupQueues))
	}
}

// When the group's one session is lost (its row deleted from outside),
// every queue's running handlers see their contexts end, the group starts
// one new session for all its queues, and every item still ends, each
// handled once.
func TestGroupSessionLossRestartsEveryQueue(t *testing.T) {
	t.Parallel()
	const n = 20
	pool := setup(t)
	prepareGroup(t, pool)
	enqueueGroup(t, pool, n)
	var held atomic.Bool
	held.Store(true)
	cancelled := map[string]*atomic.Int64{}
	running := map[string]*atomic.Int64{}
	for _, gq := range groupQueues {
		cancelled[gq.name], running[gq.name] = &atomic.Int64{}, &atomic.Int64{}
	}
	h := func(queue string) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			if held.Load() {
				running[queue].Add(1)
				<-ctx.Done() // held until the session is lost
				cancelled[queue].Add(1)
				return nil, ctx.Err()
			}
			return recordRun(queue, it), nil
		}
	}
	g, err := worker.NewGroup(groupConfigs(t, pool, h, func(groupQueue) worker.Options { return worker.Options{Poll: 20 * time.Millisecond} }),
		worker.GroupOptions{Session: longSession(), RestartDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runGroup(t, g)
	for _, gq := range groupQueues {
		await.Until(t, "a held handler of "+gq.name, func() bool { return running[gq.name].Load() > 0 })
	}
	first := g.Worker("plain").Stats().Session
	held.Store(false)
	if _, err := pool.Exec(context.Background(), `DELETE FROM crdbwork_sessions WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	for _, gq := range groupQueues {
		w := g.Worker(gq.name)
		await.Until(t, gq.name+"'s handlers to be cancelled and a new session", func() (bool, string) {
			st := w.Stats()
			return cancelled[gq.name].Load() > 0 && st.Sessions == 2 && st.SessionsLost == 1,
				fmt.Sprintf("%d cancelled, sessions %d, lost %d", cancelled[gq.name].Load(), st.Sessions, st.SessionsLost)
		})
	}
	await.Until(t, "every item of every queue to end", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d left", left)
	})
	second := g.Worker("plain").Stats().Session
	if second == "" || second == first {
		t.Fatalf("the session after the loss is %q (the lost one %q)", second, first)
	}
	for _, gq := range groupQueues {
		if s := g.Worker(gq.name).Stats().Session; s != second {
			t.Errorf("queue %s works in session %q, want the group's %q", gq.name, s, second)
		}
	}
	if got := count(t, pool, `SELECT count(*) FROM crdbwork_sessions`); got != 1 {
		t.Errorf("%d sessions, want the group's new one", got)
	}
	if got := count(t, pool, `SELECT count(DISTINCT item_id) FROM group_runs`); got != n*len(groupQueues) {
		t.Errorf("%d items handled, want %d", got, n*len(groupQueues))
	}
	if got := count(t, pool, `SELECT count(*) FROM group_runs`); got != n*len(groupQueues) {
		t.Errorf("%d results for %d items", got, n*len(groupQueues))
	}
}
