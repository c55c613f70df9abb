package main

// The deployment fault suite (issue 16, "Proof"): one database serving five
// queues of different shapes, as a real deployment would run them, each
// worked by its own `demo work` processes, while workers are SIGKILLed and
// replaced, one is frozen with SIGSTOP past its session's expiry and thawed,
// the database server is restarted in place, a producer enqueues more, and
// an operator pauses and resumes a queue, lowers a limit, lists dead items,
// requeues one and reads the status. Every item of every queue must end,
// acked with exactly one result row or dead, within a bound derived from
// the fleet's timing; each queue's items must be run only by its own
// workers; and the limited queue must hold its limits.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/worker"
)

// deployHeartbeat is the deployment's heartbeat on a quiet machine: every
// `demo work` process heartbeats every deployHeartbeat and its session
// expires after deployExpiries of them (2 s). The test stretches it with
// the machine's load (await.Stretch, read once: newDeployment), and every
// bound derives from the stretched value.
const (
	deployHeartbeat = 250 * time.Millisecond
	deployExpiries  = 8
)

// recovery is how long the fleet may take to recover from a fault, from
// its bounds: a dead or frozen session expires (its expiry) and a peer's
// reaper deletes it (every two heartbeats), which releases its claims; its
// parts move to the other sessions of its queue, each drained first (at
// most partition.DefaultDrainTimeout); a limit's share that grows is used
// after worker.DefaultLimitGrace; an item claimed by a live session past
// its lease is released by a reaper within the watcher's lease slack.
func (d *deployment) recovery() time.Duration {
	return d.expiry + 2*d.heartbeat + partition.DefaultDrainTimeout + worker.DefaultLimitGrace + d.f.leaseSlack
}

// deployBacklog is the time allowed, on top of deployRecovery, to work off
// what is left after the last fault. The slowest queue is the limited one:
// at most 4 items of 50 ms at once, 80 items/s at best; its 1,200 items
// take 15 s at the full limit, and the README's limit figures show a mean
// use of a third to three quarters of the limit on a loaded machine. The
// other queues drain faster (160 items/s at best each).
const deployBacklog = 90 * time.Second

// deployQueue is one queue of the deployment.
type deployQueue struct {
	name    string
	items   int        // enqueued up front
	setup   [][]string // crdbwork commands run before the enqueue (--queue added)
	enqueue []string   // demo enqueue's flags besides --queue and --count
	work    []string   // its demo work processes' flags besides --queue

	runIDs  []string             // the runs (demo enqueue processes) that enqueued its items
	total   int                  // items enqueued into it
	procs   []*proc              // its worker processes now running
	pids    map[int]*proc        // every worker process it had, by pid
	started int                  // worker processes started, for their names
	tenant  map[uuid.UUID]string // item → tenant (urgent), read while no worker could claim them
}

// deployment is the database, its queues and the watcher of its sessions.
type deployment struct {
	t      *testing.T
	f      *faultDemo
	queues []*deployQueue
	byName map[string]*deployQueue
	// heartbeat and expiry are the workers' session timing: deployHeartbeat
	// stretched with the machine's load, and deployExpiries of it.
	heartbeat, expiry time.Duration
}

// newDeployment migrates a fresh database at dbURL and starts watching its
// sessions and claims (faultDemo.watch).
func newDeployment(t *testing.T, dbURL string, queues []*deployQueue) *deployment {
	t.Helper()
	env := demoEnv("DATABASE_URL=" + dbURL)
	if r := op(t, time.Minute, env, "migrate"); r.code != 0 {
		t.Fatalf("migrate: exit status %d\n%s", r.code, r.stderr)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	f := &faultDemo{t: t, url: dbURL, env: env, db: db, lastSeen: map[uuid.UUID]time.Time{}, goneBy: map[uuid.UUID]time.Time{},
		leaseSlack: await.Stretch(leaseSlack)}
	hb := await.Stretch(deployHeartbeat)
	d := &deployment{t: t, f: f, queues: queues, byName: map[string]*deployQueue{}, heartbeat: hb, expiry: deployExpiries * hb}
	for _, q := range queues {
		q.pids = map[int]*proc{}
		q.tenant = map[uuid.UUID]string{}
		d.byName[q.name] = q
		// The queues are the demo's, set up (fair, parts) before their
		// first enqueue: recorded as the demo's, as its first enqueue
		// would have.
		adoptDemoQueue(t, db, q.name)
	}
	return d
}

// watch starts the watcher of sessions and overdue claims.
func (d *deployment) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	d.f.stop, d.f.done = cancel, make(chan struct{})
	go d.f.watch(ctx)
	d.t.Cleanup(d.f.stopWatching)
}

// run runs a command on queue q and fails the test unless it exits 0: a
// demo command, or an operator command (those that moved from the demo to
// crdbwork) with crdbwork.
func (d *deployment) run(q string, args ...string) result {
	d.t.Helper()
	args = append(args, "--queue", q)
	run := demo
	if slices.Contains(movedCommands, args[0]) {
		run = op
	}
	r := run(d.t, 2*time.Minute, d.f.env, args...)
	if r.code != 0 {
		d.t.Fatalf("%s: exit status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// enqueue runs `demo enqueue` for n items into q with its flags.
func (d *deployment) enqueue(q *deployQueue, n int) {
	d.t.Helper()
	r := d.run(q.name, append([]string{"enqueue", "--json", "--count", fmt.Sprint(n)}, q.enqueue...)...)
	id, _ := lastJSON(d.t, r)["run_id"].(string)
	if _, err := uuid.Parse(id); err != nil {
		d.t.Fatalf("demo enqueue: no run id in %s", r.stdout)
	}
	q.runIDs = append(q.runIDs, id)
	q.total += n
}

// keepBusy enqueues more items of q when it is about to run dry, so that
// a fault step that needs one of its workers holding items finds some
// however long the steps before took: the queues drain in about ten
// seconds, and on a loaded machine, or with the CockroachDB fault model's
// retries, the steps before took longer (fair-w1 held no item within 30 s
// because every item of fair had its result); on a quiet machine, urgent
// had drained before its step. A queue whose items' tenants the test
// keeps (q.tenant: urgent) is paused while its new items are enqueued and
// their tenants read, so that none is claimed, and ended, unread.
func (d *deployment) keepBusy(q *deployQueue) {
	d.t.Helper()
	if d.f.count(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL`, q.name) >= 100 {
		return
	}
	if len(q.tenant) == 0 {
		d.enqueue(q, 400)
		return
	}
	if r := d.run(q.name, "pause", "--json"); lastJSON(d.t, r)["paused"] != true {
		d.t.Fatalf("demo pause: %s", r.stdout)
	}
	d.enqueue(q, 400)
	d.readTenants(q)
	if r := d.run(q.name, "resume", "--json"); lastJSON(d.t, r)["paused"] != false {
		d.t.Fatalf("demo resume: %s", r.stdout)
	}
}

// readTenants records the tenant of every item of q in the items table
// (all of q's items: read while none can be claimed).
func (d *deployment) readTenants(q *deployQueue) {
	d.t.Helper()
	rows, err := d.f.db.Query(context.Background(), `SELECT id, tenant FROM crdbwork_items WHERE queue = $1`, q.name)
	if err != nil {
		d.t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var tenant string
		if err := rows.Scan(&id, &tenant); err != nil {
			d.t.Fatal(err)
		}
		q.tenant[id] = tenant
	}
	if rows.Err() != nil {
		d.t.Fatalf("reading the tenants of %s's items: %v", q.name, rows.Err())
	}
}

// startWorker starts one more `demo work` process for q.
func (d *deployment) startWorker(q *deployQueue) *proc {
	d.t.Helper()
	name := fmt.Sprintf("%s-w%d", q.name, q.started)
	q.started++
	args := append([]string{"--queue", q.name, "--record-runs"}, q.work...)
	p := d.f.work(name, d.heartbeat, d.expiry, args...)
	q.procs = append(q.procs, p)
	q.pids[p.cmd.Process.Pid] = p
	return p
}

// results counts the result rows of q's items (-1 if the database does not
// answer).
func (d *deployment) results(q *deployQueue) int {
	return d.f.count(`SELECT count(*) FROM demo_results AS r JOIN demo_enqueued AS e ON e.item_id = r.item_id
		WHERE e.run_id = ANY($1::UUID[])`, q.runIDs)
}

// dbNow is the database's clock.
func (d *deployment) dbNow() time.Time {
	d.t.Helper()
	var now time.Time
	await.Until(d.t, "the database's clock", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return d.f.db.QueryRow(ctx, `SELECT now()`).Scan(&now)
	})
	return now
}

// holding waits until the worker p (of queue q) holds items and returns
// its session (a worker of a queue with a backlog that never holds an item
// fails the test).
func (d *deployment) holding(q *deployQueue, p *proc) uuid.UUID {
	d.t.Helper()
	sid := d.f.sessionOf(p.name)
	await.Until(d.t, p.name+" to hold items of "+q.name, func() (bool, string) {
		return d.f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, sid) > 0,
			fmt.Sprintf("it holds none; %d of the queue's %d items have results", d.results(q), q.total)
	}, await.Show(func() string { return lastLines(p.stderr.String(), 10) }))
	return sid
}

// quietSince waits until no item of queue q claimed before at (database
// clock) is still claimed, and returns the database's clock when that was
// seen: from then on, every claim of q in flight was made after at.
func (d *deployment) quietSince(q *deployQueue, at time.Time) time.Time {
	d.t.Helper()
	var seen time.Time
	await.Until(d.t, fmt.Sprintf("the claims of %s made before %s to end", q.name, at.Format("15:04:05.000")), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n int
		err := d.f.db.QueryRow(ctx, `SELECT count(*), now() FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL AND claimed_at < $2`,
			q.name, at).Scan(&n, &seen)
		if err != nil {
			return false, err.Error() // the database may be restarting
		}
		return n == 0 && !seen.Before(at), fmt.Sprintf("%d still claimed at %s", n, seen.Format("15:04:05.000"))
	}, await.Show(d.describeQueues))
	return seen
}

// describeQueues shows the items left and the database's transactions,
// for the failures of waits.
func (d *deployment) describeQueues() string {
	return strings.Join(d.unended(), "\n") + "\nthe database's transactions:\n" + d.transactions()
}

// statusOf runs `demo status --json` on q and decodes it.
func (d *deployment) statusOf(q string) map[string]any {
	d.t.Helper()
	r := d.run(q, "status", "--json")
	s := lastJSON(d.t, r)
	if s["queue"] != q {
		d.t.Errorf("demo status --queue %s --json: queue %v", q, s["queue"])
	}
	// A queue's parts are owned by its own workers only (named <queue>-wN).
	owners, _ := s["part_owners"].([]any)
	for _, o := range owners {
		// A session that started after status read the sessions has no name.
		if m, _ := o.(map[string]any); m == nil || m["name"] != nil && !strings.HasPrefix(fmt.Sprint(m["name"]), q+"-w") {
			d.t.Errorf("demo status --queue %s: parts owned by a session of another queue: %v", q, o)
		}
	}
	return s
}

// unended returns, per queue, the items not ended yet, those of them
// claimed, and the parts of the unclaimed ones and how many of those have
// no owner, one line per queue with items left (empty when every item ended; nil if the database
// did not answer).
func (d *deployment) unended() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := d.f.db.Query(ctx, `SELECT queue, count(*), count(*) FILTER (WHERE claim IS NOT NULL),
		count(*) FILTER (WHERE claim IN (SELECT id FROM crdbwork_sessions)), count(DISTINCT part) FILTER (WHERE claim IS NULL),
		count(DISTINCT part) FILTER (WHERE claim IS NULL AND NOT EXISTS (
			SELECT 1 FROM crdbwork_session_parts AS p WHERE p.queue = i.queue AND p.part = i.part))
		FROM crdbwork_items AS i GROUP BY queue ORDER BY queue`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	lines := []string{}
	for rows.Next() {
		var q string
		var n, claimed, live, parts, unowned int
		if err := rows.Scan(&q, &n, &claimed, &live, &parts, &unowned); err != nil {
			return nil
		}
		lines = append(lines, fmt.Sprintf("queue %s: %d items not ended (%d claimed, %d of them by a live session; the unclaimed ones in %d parts, %d of them owned by nobody)",
			q, n, claimed, live, parts, unowned))
	}
	if rows.Err() != nil {
		return nil
	}
	return lines
}

// TestDeploymentFaults runs five queues in one database (a PostgreSQL
// server of its own, restartable), each item's handler taking 50 ms:
//
//   - plain: 8 parts, first in first out, 2,000 items;
//   - noparts: no parts (`demo work --any-part`), 1,500 items, 300 more
//     enqueued by a producer during the faults;
//   - fair: 4 parts, fair, 1,600 items of 12 tenants;
//   - urgent: 8 parts, the urgent lane (priority <= 2 of 0..9), a queue limit
//     of 6 items in flight lowered to 4 during the run, a limit of 2 per
//     tenant, 1,200 items of 10 tenants;
//   - ttl: 4 parts, 400 items of 100 ms with a 10 s time to live, paused by
//     the operator until some have expired (dead), one of which is requeued.
//
// Two `demo work` processes per queue, every one recording its handler runs
// (--record-runs). Faults: a worker of urgent and one of plain SIGKILLed
// while they hold items and replaced; a worker of fair frozen with SIGSTOP
// while it holds items until its session is deleted by a peer, then thawed;
// the server restarted (`pg_ctl restart -m fast`) while the queues work.
// Bound: every item of every queue ends within deployRecovery +
// deployBacklog of the last fault; on failure the test reports, per queue,
// the items left.
func TestDeploymentFaults(t *testing.T) {
	t.Parallel()
	srv, dbURL := testdb.NewServer(t)
	const urgentLimit, urgentLowered, tenantLimit = 6, 4, 2
	queues := []*deployQueue{
		{name: "plain", items: 2000, enqueue: []string{"--parts", "8"}, work: []string{"--parts", "8", "--task-time", "50ms", "--concurrency", "4"}},
		{name: "noparts", items: 1500, work: []string{"--any-part", "--task-time", "50ms", "--concurrency", "4"}},
		{name: "fair", items: 1600, setup: [][]string{{"parts", "--set", "4", "--yes", "--create"}, {"fair", "on"}},
			enqueue: []string{"--tenants", "12"}, work: []string{"--task-time", "50ms", "--concurrency", "4"}},
		{name: "urgent", items: 1200, setup: [][]string{{"parts", "--set", "8", "--yes", "--create"},
			{"limit", "--max-in-flight", fmt.Sprint(urgentLimit)}, {"limit", "--each-tenant", "--max-in-flight", fmt.Sprint(tenantLimit)}},
			enqueue: []string{"--tenants", "10", "--priorities", "10"},
			work:    []string{"--urgent-priority", "2", "--task-time", "50ms", "--concurrency", "8"}},
		{name: "ttl", items: 400, setup: [][]string{{"parts", "--set", "4", "--yes", "--create"}}, enqueue: []string{"--ttl", "10s"},
			work: []string{"--task-time", "100ms", "--concurrency", "2"}},
	}
	d := newDeployment(t, dbURL, queues)
	plain, noparts, fair, urgent, ttl := queues[0], queues[1], queues[2], queues[3], queues[4]
	ctx := context.Background()

	// The queues' settings, then their items (recorded for verify), and the
	// tenants of the limited queue's items while they are all in the table.
	for _, q := range queues {
		for _, args := range q.setup {
			d.run(q.name, args...)
		}
		d.enqueue(q, q.items)
	}
	d.readTenants(urgent)
	if len(urgent.tenant) != urgent.items {
		t.Fatalf("read %d tenants of %d items of %s", len(urgent.tenant), urgent.items, urgent.name)
	}
	if _, err := d.f.db.Exec(ctx, runsTable); err != nil { // before the workers race to create it
		t.Fatal(err)
	}

	d.watch()
	for _, q := range queues {
		for range 2 {
			d.startWorker(q)
		}
	}
	all := 0
	for _, q := range queues {
		all += q.total
	}
	await.Until(t, "a tenth of the items' results", func() (bool, string) {
		n := d.f.count(`SELECT count(*) FROM demo_results`)
		return n >= all/10, fmt.Sprintf("%d of %d", n, all)
	}, await.Within(time.Minute), await.Show(d.describeQueues))

	// The operator pauses ttl; its items wait, and expire. Once the claims
	// made before the pause ended (ttlQuiet), no run of ttl may start until
	// the resume.
	pausedAt := d.dbNow()
	if r := d.run(ttl.name, "pause", "--json"); lastJSON(t, r)["paused"] != true {
		t.Errorf("demo pause: %s", r.stdout)
	}
	ttlQuiet := d.quietSince(ttl, d.dbNow())

	// SIGKILL a worker of urgent and one of plain while they hold items;
	// replace them.
	killedAt := map[int]time.Time{} // pid → a database time just after its death
	for _, q := range []*deployQueue{urgent, plain} {
		victim := q.procs[0]
		d.keepBusy(q)
		d.holding(q, victim)
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-victim.exited
		killedAt[victim.cmd.Process.Pid] = d.dbNow()
		q.procs = q.procs[1:]
		d.startWorker(q)
	}

	// SIGSTOP a worker of fair while it holds items, until a peer deleted its
	// session; the operator looks at the status meanwhile; SIGCONT.
	frozen := fair.procs[1]
	d.keepBusy(fair)
	frozenSID := d.holding(fair, frozen)
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the frozen worker's session to be deleted by a peer", func() bool {
		return d.f.count(`SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, frozenSID) == 0
	}, await.Show(func() string { return "the database's transactions:\n" + d.transactions() }))
	gone := d.dbNow()
	for _, q := range queues {
		s := d.statusOf(q.name)
		if q == ttl && s["paused"] != true {
			t.Errorf("demo status --queue ttl: paused = %v while paused", s["paused"])
		}
		if q == urgent {
			if l, _ := s["limits"].(map[string]any); l == nil || l["max_in_flight"] != float64(urgentLimit) || l["tenant_max_in_flight"] != float64(tenantLimit) {
				t.Errorf("demo status --queue urgent: limits %v, want max_in_flight %d, tenant_max_in_flight %d", s["limits"], urgentLimit, tenantLimit)
			}
		}
		sessions, _ := s["sessions"].([]any)
		for _, x := range sessions {
			if m, _ := x.(map[string]any); m != nil && m["id"] == frozenSID.String() {
				t.Errorf("demo status --queue %s lists the deleted session of the frozen worker: %v", q.name, m)
			}
		}
	}
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	// The operator lowers urgent's queue limit, just before the database
	// restart (sessions may not read it before the server goes away).
	r := d.run(urgent.name, "limit", "--max-in-flight", fmt.Sprint(urgentLowered), "--json")
	var lim struct {
		MaxInFlight       int `json:"max_in_flight"`
		TenantMaxInFlight int `json:"tenant_max_in_flight"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &lim); err != nil || lim.MaxInFlight != urgentLowered || lim.TenantMaxInFlight != tenantLimit {
		t.Errorf("demo limit --max-in-flight %d: %s (%v)", urgentLowered, r.stdout, err)
	}
	loweredAt := d.dbNow()

	// A producer enqueues more into noparts while the fleet recovers.
	d.enqueue(noparts, 300)

	// The database server restarts in place, while the queues work.
	var working []string
	for _, q := range queues {
		if n := d.results(q); n < q.total && q != ttl {
			working = append(working, fmt.Sprintf("%s %d of %d", q.name, n, q.total))
		}
	}
	if len(working) == 0 {
		t.Errorf("every queue but the paused one had worked off its items before the database restart")
	}
	t.Logf("restarting the database; results so far: %s", strings.Join(working, ", "))
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	d.f.db.Reset() // connections from before the restart are gone
	restartedAt := d.dbNow()

	// The lowered limit holds once every session of urgent has read it —
	// or, unable to read it, stopped claiming: within
	// worker.DefaultLimitStaleAfter plus one refresh of its lowering — and
	// the items claimed before then ended.
	urgentSettled := d.quietSince(urgent, loweredAt.Add(worker.DefaultLimitStaleAfter+worker.DefaultLimitRefresh))

	// ttl's items expire while it is paused: the operator lists the dead,
	// requeues one, and resumes the queue.
	await.Until(t, "dead items in the paused ttl queue", func() bool {
		return d.f.count(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`, ttl.name) > 0
	}, await.Within(10*time.Second+d.recovery()), await.Show(d.describeQueues))
	r = d.run(ttl.name, "dead", "--json", "--limit", "5")
	var dead struct {
		Total int64 `json:"total"`
		Items []struct {
			ID     string `json:"id"`
			Reason string `json:"reason"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &dead); err != nil || dead.Total == 0 || len(dead.Items) == 0 {
		t.Fatalf("demo dead --queue ttl --json: %v\n%s", err, r.stdout)
	}
	for _, it := range dead.Items {
		if it.Reason != "expired" {
			t.Errorf("dead item %s of ttl died %q, want expired", it.ID, it.Reason)
		}
	}
	requeued := dead.Items[0].ID
	if r := d.run(ttl.name, "requeue", requeued, "--json"); lastJSON(t, r)["requeued"] != float64(1) {
		t.Errorf("demo requeue %s: %s", requeued, r.stdout)
	}
	resumedAt := d.dbNow()
	if r := d.run(ttl.name, "resume", "--json"); lastJSON(t, r)["paused"] != false {
		t.Errorf("demo resume: %s", r.stdout)
	}
	if s := d.statusOf(ttl.name); s["paused"] != false {
		t.Errorf("demo status --queue ttl: paused = %v after resume", s["paused"])
	}
	if l, _ := d.statusOf(urgent.name)["limits"].(map[string]any); l == nil || l["max_in_flight"] != float64(urgentLowered) {
		t.Errorf("demo status --queue urgent: limits %v after the limit was lowered to %d", l, urgentLowered)
	}

	// Every item of every queue ends within the bound (from the stretched
	// session timing; the wait's budget is stretched as every wait's).
	lastFault := time.Now()
	bound := d.recovery() + deployBacklog
	await.Until(t, fmt.Sprintf("every item of every queue to end (bound: recovery %v + backlog %v)", d.recovery(), deployBacklog), func() (bool, string) {
		left := d.unended()
		return left != nil && len(left) == 0, strings.Join(left, "\n")
	}, await.Within(bound), await.Show(func() string {
		var tails []string
		for _, q := range queues {
			for _, p := range q.procs {
				tails = append(tails, p.name+":\n"+lastLines(p.stderr.String(), 6))
			}
		}
		return "workers' last lines:\n" + strings.Join(tails, "\n")
	}))
	took := time.Since(lastFault)
	for _, q := range queues {
		for _, p := range q.procs {
			p.stopGracefully(t)
		}
	}
	d.f.stopWatching()
	// Every process that was not killed exited 0, after the SIGTERM: one
	// that ended by itself earlier left its runs (and the rest of its
	// work) to the others unseen, but for the runs it leaves open.
	for _, q := range queues {
		for pid, p := range q.pids {
			if _, killed := killedAt[pid]; killed {
				continue
			}
			if st := p.cmd.ProcessState; st == nil || !st.Success() {
				t.Errorf("%s (pid %d) ended with %v, not 0 after SIGTERM; its last lines:\n%s", p.name, pid, st, lastLines(p.stderr.String(), 30))
			}
		}
	}

	// Exactly once, per queue and in all.
	var acked, dead2 float64
	for _, q := range queues {
		var qa, qd float64
		for _, id := range q.runIDs {
			v := lastJSON(t, demo(t, time.Minute, d.f.env, "verify", "--json", "--run-id", id))
			if num(t, v, "lost") != 0 || num(t, v, "duplicates") != 0 || num(t, v, "pending") != 0 || num(t, v, "claimed") != 0 {
				t.Errorf("queue %s, run %s: %v; want nothing lost, duplicated, pending or claimed", q.name, id, v)
			}
			qa += num(t, v, "acked")
			qd += num(t, v, "dead")
		}
		if int(qa+qd) != q.total {
			t.Errorf("queue %s: %v acked + %v dead of %d items", q.name, qa, qd, q.total)
		}
		if q != ttl && qd != 0 {
			t.Errorf("queue %s: %v dead items; its items have no deadline and the demo handler never fails", q.name, qd)
		}
		t.Logf("queue %s: %d items, %v acked, %v dead, %d worker processes", q.name, q.total, qa, qd, len(q.pids))
		acked += qa
		dead2 += qd
	}
	r = demo(t, time.Minute, d.f.env, "verify", "--json")
	v := lastJSON(t, r)
	if r.code != 0 || num(t, v, "enqueued") != acked+dead2 || num(t, v, "duplicates") != 0 || num(t, v, "lost") != 0 {
		t.Errorf("verify (exit status %d): %v", r.code, v)
	}
	if d.f.count(`SELECT count(*) FROM demo_results WHERE item_id = $1`, uuid.MustParse(requeued)) != 1 {
		t.Errorf("the requeued dead item %s has no result", requeued)
	}

	// No result of a session written after its row was gone; none of the
	// frozen session's at all after its deletion; no claim of a live
	// session past its lease.
	d.checkSessions()
	if strings.Contains(frozen.stderr.String(), "25P03") {
		t.Logf("the frozen worker was frozen in a transaction: the server ended it (idle_in_transaction_session_timeout)")
	}
	if n := d.f.count(`SELECT count(*) FROM demo_results WHERE session_id = $1 AND done_at >= $2`, frozenSID, gone); n != 0 {
		t.Errorf("%d results written by the frozen session after its session was gone", n)
	}

	// Each queue's items ran only in its own workers, and every item ran.
	runs := d.runs(killedAt)
	for _, q := range queues {
		ran := map[uuid.UUID]bool{}
		for _, rr := range runs {
			if rr.queue != q.name {
				continue
			}
			ran[rr.item] = true
			if _, ok := q.pids[rr.pid]; !ok {
				t.Errorf("item %s of queue %s ran in process %d, not one of the queue's workers", rr.item, q.name, rr.pid)
				break
			}
		}
		if q != ttl && len(ran) != q.total {
			t.Errorf("queue %s: %d of its %d items ran", q.name, len(ran), q.total)
		}
	}

	// ttl was paused: no run of its items started between the pause (once
	// the claims made before it had ended: ttlQuiet, database clock) and
	// the resume.
	for _, rr := range runs {
		if rr.queue == ttl.name && rr.start.After(ttlQuiet) && rr.start.Before(resumedAt) {
			t.Errorf("item %s of the paused queue ttl started at %v (paused at %v, its earlier claims ended by %v, resumed at %v)", rr.item,
				rr.start.Format("15:04:05.000"), pausedAt.Format("15:04:05.000"), ttlQuiet.Format("15:04:05.000"), resumedAt.Format("15:04:05.000"))
			break
		}
	}

	// The limits of urgent: items in flight never exceed the queue's limit
	// (6, then 4), nor a tenant's (2). The bounds (README, "Fleet-wide
	// limits", and the worker package's doc): no excess for items shorter
	// than worker.DefaultLimitGrace except when a share moves; a share that
	// shrinks takes effect at once; workers read the limits every
	// worker.DefaultLimitRefresh, and a limit lowered while a session
	// cannot read it (the database restart) is exceeded for at most
	// worker.DefaultLimitStaleAfter plus one refresh, and by the items
	// claimed before then until they end (urgentSettled: when the last of
	// them was seen ended, by the database clock).
	// A killed process's runs end at its death; the frozen process works
	// another queue.
	var urgentRuns []runSpan
	byTenant := map[string][]runSpan{}
	for _, rr := range runs {
		if rr.queue == urgent.name {
			urgentRuns = append(urgentRuns, rr)
			byTenant[urgent.tenant[rr.item]] = append(byTenant[urgent.tenant[rr.item]], rr)
		}
	}
	settled := urgentSettled
	most, mostAt := mostAtOnce(urgentRuns, time.Time{})
	var early []runSpan
	for _, rr := range urgentRuns {
		if rr.start.Before(loweredAt) {
			early = append(early, rr)
		}
	}
	before, _ := mostAtOnce(early, time.Time{})
	after, afterAt := mostAtOnce(urgentRuns, settled)
	t.Logf("urgent: %d runs, at most %d at once (limit %d) at %v; %d at once among those started before the limit was lowered to %d at %v; at most %d at once from %v on",
		len(urgentRuns), most, urgentLimit, mostAt.Format("15:04:05.000"), before, urgentLowered, loweredAt.Format("15:04:05.000"),
		after, settled.Format("15:04:05.000"))
	if most > urgentLimit {
		t.Errorf("urgent: %d handler runs at once at %v; the limit was %d", most, mostAt.Format("15:04:05.000"), urgentLimit)
	}
	if after > urgentLowered {
		t.Errorf("urgent: %d handler runs at once at %v, %v after the limit was lowered to %d",
			after, afterAt.Format("15:04:05.000"), afterAt.Sub(loweredAt), urgentLowered)
	}
	tenants := make([]string, 0, len(byTenant))
	for tn := range byTenant {
		tenants = append(tenants, tn)
	}
	sort.Strings(tenants)
	for _, tn := range tenants {
		n, at := mostAtOnce(byTenant[tn], time.Time{})
		t.Logf("urgent: tenant %s: %d runs, at most %d at once (limit %d)", tn, len(byTenant[tn]), n, tenantLimit)
		if n > tenantLimit {
			t.Errorf("urgent: tenant %s had %d handler runs at once at %v; its limit is %d", tn, n, at.Format("15:04:05.000"), tenantLimit)
		}
	}
	t.Logf("every item ended %v after the last fault (bound %v); the database restarted at %v; %v acked, %v dead",
		took.Round(time.Millisecond), bound, restartedAt.Format("15:04:05.000"), acked, dead2)
}

// transactions lists the database's open transactions, oldest first: who
// (application, client port, state, what it waits for), since when, and
// its last statement; for the failures of waits.
func (d *deployment) transactions() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := d.f.db.Query(ctx, `SELECT pid, COALESCE(client_port, 0), state, COALESCE(wait_event_type || ':' || wait_event, ''),
		now() - xact_start, left(regexp_replace(query, '\s+', ' ', 'g'), 160)
		FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid() ORDER BY xact_start`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid, port int
		var state, wait, query string
		var age time.Duration
		if err := rows.Scan(&pid, &port, &state, &wait, &age, &query); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  backend %d (client port %d): %s %v, waiting for %q: %s\n", pid, port, state, age.Round(time.Millisecond), wait, query)
	}
	return b.String()
}

// openRuns describes the runs without an end of processes not killed: the
// process, whether it still runs, its last lines, and the item's state.
func (d *deployment) openRuns(killed []int64) string {
	rows, err := d.f.db.Query(context.Background(), `SELECT r.pid, r.item_id, r.started_at,
		COALESCE((SELECT queue || ' claimed by ' || COALESCE(claim::TEXT, 'none') FROM crdbwork_items WHERE id = r.item_id), 'not in the items table')
		FROM demo_runs AS r WHERE r.ended_at IS NULL AND NOT (r.pid = ANY($1))`, killed)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid int64
		var item uuid.UUID
		var started time.Time
		var state string
		if err := rows.Scan(&pid, &item, &started, &state); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "run of item %s (%s) in pid %d since %s", item, state, pid, started.Format("15:04:05.000"))
		for _, q := range d.queues {
			if p := q.pids[int(pid)]; p != nil {
				alive := "running"
				select {
				case <-p.exited:
					alive = "exited"
				default:
				}
				fmt.Fprintf(&b, ": %s, %s; its last lines:\n%s", p.name, alive, lastLines(p.stderr.String(), 15))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// runSpan is one recorded handler run (demo_runs) of an item.
type runSpan struct {
	item       uuid.UUID
	queue      string
	pid        int
	start, end time.Time
}

// runs reads every recorded run with its item's queue (by the run that
// enqueued it); a run without an end must be of a killed process, and ends
// at its death.
func (d *deployment) runs(killedAt map[int]time.Time) []runSpan {
	d.t.Helper()
	// Every process has exited (killed, or stopped gracefully: a run's
	// end, or its withdrawal, is written before its handler returns, and
	// the recorder's close, a process's last step, waits for the runs
	// still being recorded, even of handlers the worker no longer waits
	// for), so what is recorded is all there will be: a run without an end
	// in a process that was not killed is one the demo never ended, and
	// waiting (this test waited up to two minutes) cannot change it. (A
	// withdrawal commutes with the start it withdraws: a start the
	// recorder gave up on that lands later leaves no run open; it did
	// when the withdrawal was a DELETE, TestRunWithdrawnBeforeItsStartLands.)
	killed := []int64{}
	for pid := range killedAt {
		killed = append(killed, int64(pid))
	}
	if n := d.f.count(`SELECT count(*) FROM demo_runs WHERE ended_at IS NULL AND NOT (pid = ANY($1))`, killed); n != 0 {
		d.t.Errorf("%d runs of processes that were not killed have no end (every process has exited):\n%s", n, d.openRuns(killed))
	}
	d.t.Logf("%d runs withdrawn (a handler's context ended before its run's start was written)",
		d.f.count(`SELECT count(*) FROM demo_runs WHERE ended_at = started_at`))
	queueOf := map[string]string{}
	for _, q := range d.queues {
		for _, id := range q.runIDs {
			queueOf[id] = q.name
		}
	}
	// A withdrawn run (the handler's context ended before its start was
	// written, and the handler did not run) has no length: left out.
	rows, err := d.f.db.Query(context.Background(), `SELECT r.item_id, e.run_id::TEXT, r.pid, r.started_at, r.ended_at
		FROM demo_runs AS r JOIN demo_enqueued AS e ON e.item_id = r.item_id
		WHERE r.ended_at IS NULL OR r.ended_at <> r.started_at`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	var out []runSpan
	unended := map[int]int{} // pid → runs without an end
	for rows.Next() {
		var s runSpan
		var run string
		var pid int64
		var end *time.Time
		if err := rows.Scan(&s.item, &run, &pid, &s.start, &end); err != nil {
			d.t.Fatal(err)
		}
		s.queue, s.pid = queueOf[run], int(pid)
		switch at, killed := killedAt[s.pid]; {
		case end != nil:
			s.end = *end
		case killed:
			s.end = at
		default:
			unended[s.pid]++
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	for pid, n := range unended {
		name, tail := "not a worker", ""
		for _, q := range d.queues {
			if p := q.pids[pid]; p != nil {
				name, tail = p.name, lastLines(p.stderr.String(), 30)
			}
		}
		d.t.Errorf("%d runs in process %d (%s) have no end, and the process was not killed; its last lines:\n%s", n, pid, name, tail)
	}
	if len(unended) > 0 {
		d.t.FailNow()
	}
	return out
}

// mostAtOnce returns the most runs at once at or after from, and when.
// Ends sort before starts at the same instant.
func mostAtOnce(runs []runSpan, from time.Time) (int, time.Time) {
	type event struct {
		at    time.Time
		delta int
	}
	events := make([]event, 0, 2*len(runs))
	for _, r := range runs {
		events = append(events, event{r.start, 1}, event{r.end, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	var when time.Time
	for _, e := range events {
		if !e.at.Before(from) && cur > most { // the count from the previous event until this one
			most, when = cur, from
		}
		cur += e.delta
		if !e.at.Before(from) && cur > most {
			most, when = cur, e.at
		}
	}
	return most, when
}

// checkSessions checks what the watcher saw: no result committed by a
// session after its row was gone (faultDemo.checkFence), and no item
// claimed by a live session past its lease.
func (d *deployment) checkSessions() {
	t, f := d.t, d.f
	t.Helper()
	f.checkFence()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.overdue != 0 {
		t.Errorf("up to %d items were claimed by a live session more than %v past their lease: %s", f.overdue, f.leaseSlack, f.firstBad)
	}
}
