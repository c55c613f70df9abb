package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/worker"
)

// orderArgs and refundArgs are the typed arguments of the kinds tests:
// version 1 of the program knows orders, version 2 refunds too.
type orderArgs struct {
	Order int    `json:"order"`
	Note  string `json:"note,omitempty"`
}

func (orderArgs) Kind() string { return "order" }

type refundArgs struct {
	Order  int `json:"order"`
	Amount int `json:"amount"`
}

func (refundArgs) Kind() string { return "refund" }

// kindRun returns the Record of a kind's run: a row of kind_runs.
func kindRun(version string, it claim.Item, arg string) worker.Record {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO kind_runs (id, kind, version, arg) VALUES ($1, $2, $3, $4)`, it.ID, it.Kind, version, arg)
		return err
	}
}

const kindRunsTable = `CREATE TABLE kind_runs (id UUID NOT NULL, kind TEXT NOT NULL, version TEXT NOT NULL, arg TEXT NOT NULL)`

// One worker runs each item with its kind's handler: typed arguments
// decoded from JSON (from ArgsItem and from the SQL function), a raw kind
// (Kinds.Handle), items without a kind (Default); an item of a kind
// nobody registered ends dead with "unknown kind: <kind>" at its first of
// ten attempts, one whose payload does not decode with "bad arguments:
// <kind>" and the decoder's error. Every item ends.
func TestKindsRunEachItemWithItsKindsHandler(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, kindRunsTable); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "shop", BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	var unknown atomic.Int64
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) {
		return kindRun("v1", job.Item, fmt.Sprintf("order %d %s", job.Args.Order, job.Args.Note)), nil
	})
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[refundArgs]) (worker.Record, error) {
		return kindRun("v1", job.Item, fmt.Sprintf("refund %d of %d", job.Args.Order, job.Args.Amount)), nil
	})
	kinds.Handle("blob", func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return kindRun("v1", it, fmt.Sprintf("blob %x", it.Payload)), nil
	})
	kinds.Default = func(ctx context.Context, it claim.Item) (worker.Record, error) {
		return kindRun("v1", it, "default "+string(it.Payload)), nil
	}
	kinds.OnUnknown = func(it claim.Item, waits bool) {
		if !waits {
			unknown.Add(1)
		}
	}
	if got := fmt.Sprint(kinds.Names()); got != "[blob order refund]" {
		t.Fatalf("Names() = %s", got)
	}

	var items []claim.NewItem
	for _, a := range []claim.Args{orderArgs{Order: 1, Note: "gift"}, orderArgs{Order: 2}, refundArgs{Order: 1, Amount: 30}} {
		it, err := claim.ArgsItem(a)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	items = append(items,
		claim.NewItem{Kind: "blob", Payload: []byte{0xff, 'x'}},
		claim.NewItem{Payload: []byte("plain")},
		claim.NewItem{Kind: "invoice", Payload: []byte(`{}`), MaxAttempts: 10},
		claim.NewItem{Kind: "order", Payload: []byte(`{"order": "seven"}`), MaxAttempts: 10})
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	var fromSQL uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT item_id FROM crdbwork_enqueue(`+
		testdb.EnqueueArgs("'shop'", `convert_to('{"order": 9, "amount": 5}', 'UTF8')`, "kind", "'refund'")+`)`).Scan(&fromSQL); err != nil {
		t.Fatal(err)
	}
	r := startOn(t, q, kinds.Handler(), worker.Options{Concurrency: 4, NoWake: true, Poll: 20 * time.Millisecond, Session: longSession()})
	await.Until(t, "every item ended", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return n == 0, fmt.Sprintf("%d items left", n)
	})
	r.Stop(t)

	want := map[uuid.UUID]string{
		res.IDs[0]: "order 1 gift", res.IDs[1]: "order 2 ", res.IDs[2]: "refund 1 of 30",
		res.IDs[3]: "blob ff78", res.IDs[4]: "default plain", fromSQL: "refund 9 of 5",
	}
	rows, err := pool.Query(ctx, `SELECT id, arg FROM kind_runs`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var arg string
		if err := rows.Scan(&id, &arg); err != nil {
			t.Fatal(err)
		}
		if _, dup := got[id]; dup {
			t.Errorf("item %s ran twice", id)
		}
		got[id] = arg
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runs\n%v\nwant\n%v", got, want)
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{Count: true})
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]claim.DeadItem{}
	for _, d := range page.Items {
		dead[d.Reason] = d
	}
	if d, ok := dead["unknown kind: invoice"]; !ok || d.ID != res.IDs[5] || d.Attempts != 1 || d.Kind != "invoice" {
		t.Errorf("the item of an unknown kind: %+v (found %v), want dead after 1 attempt with reason \"unknown kind: invoice\"", d, ok)
	}
	if d, ok := dead["bad arguments: order"]; !ok || d.ID != res.IDs[6] || d.Attempts != 1 || !strings.Contains(d.LastError, "cannot unmarshal string") {
		t.Errorf("the item whose payload does not decode: %+v (found %v), want dead after 1 attempt with reason \"bad arguments: order\" and the decoder's error", d, ok)
	}
	if page.Count != 2 {
		t.Errorf("%d dead items, want 2: %+v", page.Count, page.Items)
	}
	if n := unknown.Load(); n != 1 {
		t.Errorf("OnUnknown saw %d items end dead, want 1", n)
	}
}

// Registering a kind twice, an empty kind or a nil handler panics.
func TestKindsRegistrationPanics(t *testing.T) {
	t.Parallel()
	h := func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) { return nil, nil }
	for name, f := range map[string]func(k *worker.Kinds){
		"twice": func(k *worker.Kinds) { worker.AddKind(k, h); worker.AddKind(k, h) },
		"empty": func(k *worker.Kinds) {
			k.Handle("", func(context.Context, claim.Item) (worker.Record, error) { return nil, nil })
		},
		"nil": func(k *worker.Kinds) { k.Handle("x", nil) },
		"too long": func(k *worker.Kinds) {
			k.Handle(strings.Repeat("k", claim.MaxKindLength+1), func(context.Context, claim.Item) (worker.Record, error) { return nil, nil })
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f(worker.NewKinds())
		}()
	}
}

// The environment of TestKindsProcess, the worker processes that
// TestKindsAcrossDeployments starts (this test binary, run again).
const (
	kindsChildURL     = "CRDBWORK_KINDS_CHILD_URL"
	kindsChildVersion = "CRDBWORK_KINDS_CHILD_VERSION" // "v1" (orders) or "v2" (orders and refunds)
	kindsChildWait    = "CRDBWORK_KINDS_CHILD_WAIT"    // "1": Kinds.UnknownWait
)

// TestKindsProcess is a worker process of TestKindsAcrossDeployments (it
// is skipped otherwise): a deployment of version v1 (kind order) or v2
// (kinds order and refund) of a program that works the fair queue "shop"
// in 4 parts, until SIGTERM, when it shuts down gracefully.
func TestKindsProcess(t *testing.T) {
	url := os.Getenv(kindsChildURL)
	if url == "" {
		t.Skip("a process of TestKindsAcrossDeployments")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	version := os.Getenv(kindsChildVersion)
	q := newQueue(t, pool, claim.Options{Queue: "shop", Lease: 20 * time.Second})
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) {
		return kindRun(version, job.Item, fmt.Sprint(job.Args.Order)), nil
	})
	if version == "v2" {
		worker.AddKind(kinds, func(ctx context.Context, job worker.Job[refundArgs]) (worker.Record, error) {
			return kindRun(version, job.Item, fmt.Sprint(job.Args.Order)), nil
		})
	}
	if os.Getenv(kindsChildWait) == "1" {
		kinds.UnknownWait, kinds.UnknownEvery = time.Hour, 100*time.Millisecond
	}
	w, err := worker.New(q, kinds.Handler(), worker.Options{Parts: 4, Concurrency: 4, Session: longSession(), Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// Kinds in a rolling upgrade, in the shape of a deployment: a fair queue
// in 4 parts, orders and refunds of several tenants and keys (refunds
// also from the SQL function), and an order whose payload does not
// decode. The v1 deployment (one process) knows orders only; then v2
// (orders and refunds) starts beside it, and v1 is stopped (SIGTERM).
//
//   - "wait" (Kinds.UnknownWait): v1 snoozes the refunds without using
//     their attempts; each ends acked, once, by v2.
//   - "dead" (the default): v1 ends every refund dead with reason
//     "unknown kind: refund"; the operator requeues them by that reason
//     once v2 runs, and each ends acked, once, by v2, its kind kept.
//
// Either way every order runs once, the bad order ends dead with "bad
// arguments: order", and every item ends.
func TestKindsAcrossDeployments(t *testing.T) {
	t.Parallel()
	if os.Getenv(kindsChildURL) != "" {
		t.Skip("in a child process")
	}
	for _, mode := range []string{"wait", "dead"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kindsAcrossDeployments(t, mode == "wait")
		})
	}
}

func kindsAcrossDeployments(t *testing.T, wait bool) {
	url := testschema.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, kindRunsTable); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "shop"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}, Parts: 4}); err != nil {
		t.Fatal(err)
	}
	start := func(version string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKindsProcess$", "-test.count=1")
		w := ""
		if wait {
			w = "1"
		}
		cmd.Env = testdb.Environ([]string{kindsChildURL + "=", kindsChildVersion + "=", kindsChildWait + "="},
			kindsChildURL+"="+url, kindsChildVersion+"="+version, kindsChildWait+"="+w)
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
	v1 := start("v1")
	await.Until(t, "v1 to own the queue's 4 parts", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_session_parts WHERE queue = 'shop'`)
		return n == 4, fmt.Sprintf("%d parts owned", n)
	})

	const n = 12
	var items []claim.NewItem
	for i := range n {
		for _, a := range []claim.Args{orderArgs{Order: i}, refundArgs{Order: i, Amount: 10 * i}} {
			it, err := claim.ArgsItem(a)
			if err != nil {
				t.Fatal(err)
			}
			it.Tenant, it.MaxAttempts = fmt.Sprintf("tenant-%d", i%3), 3
			if i%2 == 0 {
				it.Key = fmt.Sprintf("customer-%d", i%5)
			}
			items = append(items, it)
		}
	}
	items = append(items, claim.NewItem{Kind: "order", Payload: []byte(`{"order": "seven"}`), Tenant: "tenant-0"})
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	orders, refunds := map[uuid.UUID]bool{}, map[uuid.UUID]bool{}
	for i, id := range res.IDs[:2*n] {
		if i%2 == 0 {
			orders[id] = true
		} else {
			refunds[id] = true
		}
	}
	bad := res.IDs[2*n]
	for i := range 2 {
		var id uuid.UUID
		if err := pool.QueryRow(ctx, `SELECT item_id FROM crdbwork_enqueue(`+testdb.EnqueueArgs("'shop'",
			fmt.Sprintf(`convert_to('{"order": %d, "amount": 1}', 'UTF8')`, 100+i), "kind", "'refund'", "tenant", "'tenant-sql'")+`)`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		refunds[id] = true
	}

	if wait {
		await.Until(t, "v1 to run every order and snooze every refund", func() (bool, string) {
			ran := count(t, pool, `SELECT count(*) FROM kind_runs WHERE kind = 'order'`)
			snoozed := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE kind = 'refund' AND snoozes > 0`)
			return ran == n && snoozed == len(refunds), fmt.Sprintf("%d of %d orders ran, %d of %d refunds snoozed", ran, n, snoozed, len(refunds))
		})
		if k := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE kind = 'refund' AND attempts > 0 AND claim IS NULL`); k != 0 {
			t.Errorf("%d waiting refunds used an attempt", k)
		}
	} else {
		await.Until(t, "v1 to end every item", func() (bool, string) {
			left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
			return left == 0, fmt.Sprintf("%d items left", left)
		})
		page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: claim.DeadFilter{Reason: "unknown kind: refund"}, Count: true})
		if err != nil {
			t.Fatal(err)
		}
		if page.Count != int64(len(refunds)) {
			t.Fatalf("%d refunds dead of an unknown kind, want %d", page.Count, len(refunds))
		}
		for _, d := range page.Items {
			if !refunds[d.ID] || d.Kind != "refund" || d.Attempts != 1 {
				t.Errorf("dead item %s: kind %q after %d attempts; want a refund after 1", d.ID, d.Kind, d.Attempts)
			}
		}
	}

	// The rollout: v2 starts beside v1, then v1 stops.
	start("v2")
	await.Until(t, "v2 to join", func() (bool, string) {
		k := count(t, pool, `SELECT count(*) FROM crdbwork_session_queues WHERE queue = 'shop'`)
		return k == 2, fmt.Sprintf("%d sessions", k)
	})
	if err := v1.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- v1.Wait() }()
	if err := await.Recv(t, "v1 to shut down", stopped); err != nil {
		t.Fatalf("v1: %v", err)
	}
	if !wait {
		r, err := q.Requeue(ctx, claim.RequeueOptions{Filter: claim.DeadFilter{Reason: "unknown kind: refund"}})
		if err != nil || r.Requeued != len(refunds) {
			t.Fatalf("requeue of the refunds: %+v, %v; want %d", r, err, len(refunds))
		}
	}
	await.Until(t, "every item ended", func() (bool, string) {
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		return left == 0, fmt.Sprintf("%d items left", left)
	})

	type run struct{ kind, version string }
	runs := map[uuid.UUID][]run{}
	rows, err := pool.Query(ctx, `SELECT id, kind, version FROM kind_runs`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var r run
		if err := rows.Scan(&id, &r.kind, &r.version); err != nil {
			t.Fatal(err)
		}
		runs[id] = append(runs[id], r)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	for id := range orders {
		if rs := runs[id]; len(rs) != 1 || rs[0].kind != "order" {
			t.Errorf("order %s: runs %v, want one", id, rs)
		}
	}
	for id := range refunds {
		if rs := runs[id]; len(rs) != 1 || rs[0] != (run{"refund", "v2"}) {
			t.Errorf("refund %s: runs %v, want one by v2", id, rs)
		}
	}
	if len(runs) != len(orders)+len(refunds) {
		t.Errorf("%d items ran, want %d", len(runs), len(orders)+len(refunds))
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{Count: true})
	if err != nil {
		t.Fatal(err)
	}
	if page.Count != 1 || page.Items[0].ID != bad || page.Items[0].Reason != "bad arguments: order" {
		t.Fatalf("dead items %+v, want only the bad order, reason \"bad arguments: order\"", page.Items)
	}
}

// An item of an unknown kind under Kinds.UnknownWait waits, snoozed without
// using an attempt, and ends: dead with reason "unknown kind: <kind>" once
// the wait has passed since its enqueue (by the database clock), its last
// attempt its only one; OnUnknown saw it wait, then end.
func TestKindsUnknownWaitEnds(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "waits"})
	var waited, ended atomic.Int64
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) { return nil, nil })
	// A short wait: the first claim always waits (its vesting time is its
	// enqueue time), and the death comes at the first claim whose vesting
	// time is 300 ms past the enqueue, both by the database clock: a busy
	// machine makes the item wait longer, never less.
	kinds.UnknownWait, kinds.UnknownEvery = 300*time.Millisecond, 50*time.Millisecond
	kinds.OnUnknown = func(it claim.Item, waits bool) {
		if waits {
			waited.Add(1)
		} else {
			ended.Add(1)
		}
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Kind: "refund", Payload: []byte(`{}`), MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	r := startOn(t, q, kinds.Handler(), worker.Options{Concurrency: 1, NoWake: true, Poll: 20 * time.Millisecond, Session: longSession()})
	await.Until(t, "the item of an unknown kind to end dead after its wait", func() (bool, string) {
		d := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, res.IDs[0])
		return d == 1, fmt.Sprintf("%d deaths, %d waits seen", d, waited.Load())
	})
	r.Stop(t)
	page, err := q.DeadItems(ctx, claim.DeadQuery{})
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("dead items %+v, %v", page.Items, err)
	}
	d := page.Items[0]
	if d.Reason != "unknown kind: refund" || d.Attempts != 1 || d.Kind != "refund" {
		t.Fatalf("death %+v: want reason \"unknown kind: refund\" after 1 attempt", d)
	}
	if d.DiedAt.Sub(d.EnqueuedAt) < 300*time.Millisecond {
		t.Fatalf("dead %v after its enqueue, before its wait of 300ms", d.DiedAt.Sub(d.EnqueuedAt))
	}
	if waited.Load() < 1 || ended.Load() != 1 {
		t.Fatalf("OnUnknown saw %d waits and %d ends, want at least 1 and 1", waited.Load(), ended.Load())
	}
}
