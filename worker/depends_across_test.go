package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/lived"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// Environment of the cross-queue worker process (TestDependsAcrossWorkerProcess).
const (
	xdepsURLEnv   = "CRDBWORK_XDEPS_WORKER_URL"
	xdepsQueueEnv = "CRDBWORK_XDEPS_WORKER_QUEUE"
)

// xdepsHandler records each item's start (database clock) and, in the
// ack's transaction, its result in xdep_results; an item whose payload is
// "die" fails for good; "slow" works a second, others 100 ms.
func xdepsHandler(pool *pgxpool.Pool) worker.Handler {
	return func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "die" {
			return nil, claim.Permanent(errors.New("this item dies"))
		}
		var started time.Time
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&started); err != nil {
			return nil, err
		}
		work := 100 * time.Millisecond
		if string(it.Payload) == "slow" {
			work = time.Second
		}
		select {
		case <-time.After(work): // the handler's work
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO xdep_results (item_id, queue, started_at) VALUES ($1, $2, $3)`, it.ID, it.Queue, started)
			return err
		}, nil
	}
}

const xdepResults = `CREATE TABLE xdep_results (
	row_id UUID NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
	item_id UUID NOT NULL, queue TEXT NOT NULL, started_at TIMESTAMPTZ NOT NULL, acked_at TIMESTAMPTZ NOT NULL DEFAULT now())`

// TestDependsAcrossWorkerProcess is not a test: it is the worker process
// that TestDependsAcrossQueuesKillAndCancel starts (this test binary, run
// again with -test.run set to it, the database and the queue in the
// environment). It works its queue until it is killed.
func TestDependsAcrossWorkerProcess(t *testing.T) {
	url, queue := os.Getenv(xdepsURLEnv), os.Getenv(xdepsQueueEnv)
	if url == "" {
		t.Skip("the worker process of TestDependsAcrossQueuesKillAndCancel")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	tm := faultTimings()
	q, err := claim.New(pool, claim.Options{Queue: queue, Lease: tm.lease, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(q, xdepsHandler(pool), worker.Options{Concurrency: 8, Session: tm.session, RestartDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// xdepsPlan is the items of a cross-queue deployment: prerequisites in
// queue xa, their dependents in xb.
type xdepsPlan struct {
	prereqs   []uuid.UUID // in xa, acked
	dies      uuid.UUID   // in xa, dies
	cancelled uuid.UUID   // in xa, delayed an hour: cancelled by an operator
	local     uuid.UUID   // in xb, the join's prerequisite of its own queue
	join      uuid.UUID   // in xb: after every prerequisite, and local
	each      []uuid.UUID // in xb: each[i] after prereqs[i]
	// In xb, after dies or cancelled: with RunAfter for that end (run), or
	// without (dead).
	diesRun, diesDead, cancelRun, cancelDead uuid.UUID
	deadNext                                 uuid.UUID // in xb, after diesDead: dead too
}

// enqueueXdeps enqueues the plan's items: n prerequisites.
func enqueueXdeps(t *testing.T, pool *pgxpool.Pool, n int) xdepsPlan {
	t.Helper()
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "xa"})
	qb := newQueue(t, pool, claim.Options{Queue: "xb"})
	p := xdepsPlan{dies: uuid.New(), cancelled: uuid.New(), local: uuid.New(), join: uuid.New(),
		diesRun: uuid.New(), diesDead: uuid.New(), cancelRun: uuid.New(), cancelDead: uuid.New(), deadNext: uuid.New()}
	items := []claim.NewItem{{ID: p.dies, Payload: []byte("die")}, {ID: p.cancelled, Payload: []byte("c"), Delay: time.Hour}}
	for i := range n {
		id := uuid.New()
		p.prereqs = append(p.prereqs, id)
		payload := "a"
		if i%4 == 0 {
			payload = "slow"
		}
		items = append(items, claim.NewItem{ID: id, Payload: []byte(payload)})
	}
	// The dependents first, so that none of their prerequisites is acked
	// yet: they all wait.
	var in []claim.Prereq
	deps := []claim.NewItem{{ID: p.local, Payload: []byte("local")}}
	for _, id := range p.prereqs {
		in = append(in, claim.Prereq{Queue: "xa", ID: id})
		e := uuid.New()
		p.each = append(p.each, e)
		deps = append(deps, claim.NewItem{ID: e, Payload: []byte("each"), AfterIn: []claim.Prereq{{Queue: "xa", ID: id}}})
	}
	deps = append(deps,
		claim.NewItem{ID: p.join, Payload: []byte("join"), After: []uuid.UUID{p.local}, AfterIn: in},
		claim.NewItem{ID: p.diesRun, Payload: []byte("r"), AfterIn: []claim.Prereq{{Queue: "xa", ID: p.dies}}, RunAfter: claim.PrereqDied},
		claim.NewItem{ID: p.diesDead, Payload: []byte("d"), AfterIn: []claim.Prereq{{Queue: "xa", ID: p.dies}}},
		claim.NewItem{ID: p.deadNext, Payload: []byte("n"), After: []uuid.UUID{p.diesDead}},
		claim.NewItem{ID: p.cancelRun, Payload: []byte("r"), AfterIn: []claim.Prereq{{Queue: "xa", ID: p.cancelled}}, RunAfter: claim.PrereqCancelled},
		claim.NewItem{ID: p.cancelDead, Payload: []byte("d"), AfterIn: []claim.Prereq{{Queue: "xa", ID: p.cancelled}}})
	if _, err := qa.Enqueue(ctx, items[:2]...); err != nil {
		t.Fatal(err)
	}
	// The prerequisites in xa are enqueued in the same transaction as
	// their dependents in xb would be in a real producer; here separately,
	// xa's first (they must exist), the workers not yet started.
	if _, err := qa.Enqueue(ctx, items[2:]...); err != nil {
		t.Fatal(err)
	}
	res, err := qb.Enqueue(ctx, deps...)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range res.Waiting {
		if w == (i == 0) { // local is claimable, every other waits
			t.Fatalf("item %d of xb: waiting %v", i, w)
		}
	}
	return p
}

// checkXdeps waits until every item of the plan ended and checks the ends:
// each acked item has one result, each dependent started after its
// prerequisites' acks, the dependents of the dead and cancelled
// prerequisites ended as their RunAfter says, and no row is left.
func checkXdeps(t *testing.T, pool *pgxpool.Pool, p xdepsPlan, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	qa := newQueue(t, pool, claim.Options{Queue: "xa"})
	if r, err := qa.CancelItem(ctx, p.cancelled, claim.CancelOptions{}); err != nil || !r.Found {
		t.Fatalf("the operator's cancel: %+v, %v", r, err)
	}
	acked := map[string][]uuid.UUID{
		"xa": p.prereqs,
		"xb": append([]uuid.UUID{p.local, p.join, p.diesRun, p.cancelRun}, p.each...),
	}
	dead := map[string][]uuid.UUID{"xa": {p.dies}, "xb": {p.diesDead, p.deadNext, p.cancelDead}}
	want := len(acked["xa"]) + len(acked["xb"]) + 1 + 3 + 1 // + dead in xa, in xb, the cancelled
	await.Until(t, "every item of both queues to end", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue IN ('xa', 'xb')`)
		return n == want, fmt.Sprintf("%d of %d ended; %d waiting, %d queued", n, want,
			count(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue IN ('xa', 'xb')`),
			count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue IN ('xa', 'xb')`))
	}, await.Within(within))
	for queue, ids := range acked {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND outcome = 'acked' AND id = ANY($2)`, queue, ids); n != len(ids) {
			t.Errorf("%d of %d items of %s acked", n, len(ids), queue)
		}
		if n := count(t, pool, `SELECT count(*) FROM xdep_results WHERE queue = $1 AND item_id = ANY($2)`, queue, ids); n != len(ids) {
			t.Errorf("%d results for %d acked items of %s (one each)", n, len(ids), queue)
		}
	}
	for queue, ids := range dead {
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_ended WHERE queue = $1 AND outcome = 'dead' AND id = ANY($2)`, queue, ids); n != len(ids) {
			t.Errorf("%d of %d items of %s dead", n, len(ids), queue)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'xb' AND id = $1 AND reason = $2`, p.diesDead, claim.ReasonDependencyDied+p.dies.String()); n != 1 {
		t.Errorf("the dependent of the dead prerequisite: %d dead items with its reason", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM xdep_results WHERE item_id = ANY($1)`, append(dead["xb"], p.dies, p.cancelled)); n != 0 {
		t.Errorf("%d results of items that must not run", n)
	}
	// The join started after every prerequisite's ack in xa; each
	// dependent after its own.
	if n := count(t, pool, `SELECT count(*) FROM xdep_results AS j, crdbwork_ended AS e
		WHERE j.item_id = $1 AND e.queue = 'xa' AND e.id = ANY($2) AND e.outcome = 'acked' AND j.started_at > e.ended_at`, p.join, p.prereqs); n != len(p.prereqs) {
		t.Errorf("the join started after %d of its %d prerequisites' acks", n, len(p.prereqs))
	}
	if n := count(t, pool, `SELECT count(*) FROM unnest($1::UUID[], $2::UUID[]) AS u (p, d)
		JOIN crdbwork_ended AS e ON e.queue = 'xa' AND e.id = u.p
		JOIN xdep_results AS r ON r.item_id = u.d AND r.started_at > e.ended_at`, p.prereqs, p.each); n != len(p.each) {
		t.Errorf("%d of %d dependents started after their prerequisite's ack", n, len(p.each))
	}
	if n := count(t, pool, `SELECT (SELECT count(*) FROM crdbwork_waiting WHERE queue IN ('xa', 'xb')) +
		(SELECT count(*) FROM crdbwork_waits_for WHERE queue IN ('xa', 'xb')) +
		(SELECT count(*) FROM crdbwork_waits_across) + (SELECT count(*) FROM crdbwork_items WHERE queue IN ('xa', 'xb'))`); n != 0 {
		t.Errorf("%d waiting, edge, cross-queue edge or item rows left", n)
	}
}

// Worker processes on two queues: two work xa (the prerequisites), one
// works xb (the dependents: a fan-in over every prerequisite of xa and one
// of its own, one dependent per prerequisite, and dependents of a
// prerequisite that dies and of one an operator cancels, with and without
// RunAfter). One of xa's processes is SIGKILLed while it runs
// prerequisites, and replaced. Every item ends within its bound: acked
// once, or dead as its RunAfter says; each dependent ran after its
// prerequisites' acks; nothing is left.
func TestDependsAcrossQueuesKillAndCancel(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, xdepResults); err != nil {
		t.Fatal(err)
	}
	p := enqueueXdeps(t, pool, 40)
	start := func(queue string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDependsAcrossWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), xdepsURLEnv+"="+url, xdepsQueueEnv+"="+queue)
		if testing.Verbose() {
			cmd.Stderr = os.Stderr
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd
	}
	start("xb")
	victim := start("xa")
	start("xa")
	await.Until(t, "the victim to hold prerequisites", func() bool {
		return count(t, pool, `SELECT count(*) FROM crdbwork_items AS i JOIN crdbwork_sessions AS s ON s.id = i.claim
			WHERE s.pid = $1 AND i.id = ANY($2)`, int64(victim.Process.Pid), p.prereqs) >= 2
	}, await.Within(time.Minute))
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	start("xa") // a replacement, as a supervisor would start
	checkXdeps(t, pool, p, 3*time.Minute)
}

// The same deployment in a database that has lived (internal/lived: other
// queues with 120k items analyzed before xa and xb existed, dead tuples,
// waiting items and edges of another queue): in-process workers, 200
// prerequisites. Every item ends within its bound.
func TestDependsAcrossQueuesInALivedDatabase(t *testing.T) {
	t.Parallel()
	pool := testdb.NewLived(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		return testschema.Apply(ctx, pool)
	}, lived.Options{})
	if _, err := pool.Exec(context.Background(), xdepResults); err != nil {
		t.Fatal(err)
	}
	p := enqueueXdeps(t, pool, 200)
	opts := worker.Options{Concurrency: 16, Poll: 20 * time.Millisecond, Session: longSession()}
	for _, queue := range []string{"xa", "xa", "xb"} {
		startOn(t, newQueue(t, pool, claim.Options{Queue: queue}), xdepsHandler(pool), opts)
	}
	checkXdeps(t, pool, p, 5*time.Minute)
}
