package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// crdbwork cancel, run as its own process, stops a handler running in a
// worker of this process: it reports the item was running, --wait returns
// once the item ended as cancelled, the handler's context says who
// cancelled it and why, its result is not written, and crdbwork cancelled
// lists it. An unclaimed item ends at once; status counts a snoozed item.
func TestCancelRunningItemFromTheCLI(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `CREATE TABLE cli_results (item_id UUID NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	q := d.queue(t, "jobs", crsql.Tables{})
	enq, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("run")})
	if err != nil {
		t.Fatal(err)
	}
	running := enq.IDs[0]
	started := make(chan struct{}, 1)
	causes := make(chan error, 1)
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		started <- struct{}{}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO cli_results (item_id) VALUES ($1)`, it.ID)
			return err
		}, nil
	}
	// The session must outlive the test on a busy machine: heartbeat and
	// expiry stretched together (internal/await).
	hb := await.Stretch(300 * time.Millisecond)
	w, err := worker.New(q, h, worker.Options{Concurrency: 1, Poll: 50 * time.Millisecond,
		Session: session.Tuning{Heartbeat: hb, Expiry: 10 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	await.Recv(t, "the handler to start", started)
	m := jsonOf(t, must(t, d.env, "cancel", "--queue", "jobs", "--yes", "--wait", "--wait-timeout", "1m", "--reason", "wrong input", "--json", running.String()))
	items, _ := m["items"].([]any)
	if len(items) != 1 {
		t.Fatalf("cancel --json: %v", m)
	}
	it := items[0].(map[string]any)
	if it["running"] != true || it["outcome"] != "cancelled" || m["reason"] != "wrong input" || !strings.Contains(m["by"].(string), "@") {
		t.Fatalf("cancel --wait --json: %v", m)
	}
	by := m["by"].(string)
	cause := await.Recv(t, "the handler's context to be cancelled", causes)
	if ce, ok := cause.(*claim.CancelledError); !ok || ce.By != by || ce.Reason != "wrong input" {
		t.Fatalf("the handler's cause: %v", cause)
	}
	if n := d.count(t, `SELECT count(*) FROM cli_results`); n != 0 {
		t.Fatalf("%d results written for the cancelled item", n)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, running); n != 0 {
		t.Fatal("the cancelled item is still in the items table")
	}
	r := must(t, d.env, "cancelled", "--queue", "jobs")
	if !strings.Contains(r.stdout, running.String()) || !strings.Contains(r.stdout, "was running") || !strings.Contains(r.stdout, `"wrong input"`) {
		t.Fatalf("crdbwork cancelled:\n%s", r)
	}
	lm := jsonOf(t, must(t, d.env, "cancelled", "--queue", "jobs", "--json"))
	if rows, _ := lm["items"].([]any); len(rows) != 1 || rows[0].(map[string]any)["by"] != by {
		t.Fatalf("cancelled --json: %v", lm)
	}

	// An unclaimed item (the queue paused, so the worker leaves it) ends
	// at once, in text.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.On}); err != nil {
		t.Fatal(err)
	}
	enq, err = q.Enqueue(ctx, claim.NewItem{Payload: []byte("waiting")})
	if err != nil {
		t.Fatal(err)
	}
	r = must(t, d.env, "cancel", "--queue", "jobs", "--yes", "--wait", "--by", "ops", enq.IDs[0].String())
	if !strings.Contains(r.stdout, "it was not running") || !strings.Contains(r.stdout, "cancelled item "+enq.IDs[0].String()) {
		t.Fatalf("cancel of an unclaimed item:\n%s", r)
	}
	want(t, d.env, 1, []string{"has no item " + enq.IDs[0].String()}, "cancel", "--queue", "jobs", "--yes", enq.IDs[0].String())

	// Cancelled items are kept: requeue --cancelled puts one back (it is
	// no longer listed as cancelled, and a second requeue finds it live);
	// --all needs --yes.
	back := enq.IDs[0]
	if r := must(t, d.env, "requeue", "--queue", "jobs", "--cancelled", back.String()); !strings.Contains(r.stdout, "requeued cancelled item "+back.String()) {
		t.Fatalf("requeue --cancelled:\n%s", r)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND payload = 'waiting'`, back); n != 1 {
		t.Fatalf("the requeued cancelled item: %d rows in the items table", n)
	}
	if r := must(t, d.env, "cancelled", "--queue", "jobs"); strings.Contains(r.stdout, back.String()) {
		t.Fatalf("crdbwork cancelled still lists the requeued item:\n%s", r)
	}
	want(t, d.env, 1, []string{"is live"}, "requeue", "--queue", "jobs", "--cancelled", back.String())
	want(t, d.env, 2, []string{"would requeue every cancelled item"}, "requeue", "--queue", "jobs", "--cancelled", "--all")
	want(t, d.env, 2, []string{"--death and the filters"}, "requeue", "--queue", "jobs", "--cancelled", "--reason", "failed", "--all")
	if rm := jsonOf(t, must(t, d.env, "requeue", "--queue", "jobs", "--cancelled", "--all", "--yes", "--json")); rm["requeued"] != float64(1) {
		t.Fatalf("requeue --cancelled --all --json (the item that was running): %v", rm)
	}
	if n := d.count(t, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, running); n != 1 {
		t.Fatalf("the cancelled running item requeued: %d rows", n)
	}

	// A snoozed item shows in status.
	if _, err := d.pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, payload, snoozes, vesting_at) VALUES (gen_random_uuid(), 'jobs', '\x00', 2, now() + INTERVAL '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if r := must(t, d.env, "status", "--queue", "jobs"); !strings.Contains(r.stdout, "1 snoozed") {
		t.Fatalf("status does not count the snoozed item:\n%s", r)
	}
	if sm := jsonOf(t, must(t, d.env, "status", "--queue", "jobs", "--json")); sm["snoozed"] != float64(1) {
		t.Fatalf("status --json snoozed: %v", sm["snoozed"])
	}
}
