package worker_test

import (
	"context"
	"fmt"
	"log"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// README:begin kinds-args
// SendMail and Resize are the typed arguments of two kinds of items: the
// kind names the handler, the fields travel as the item's JSON payload.
type SendMail struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

func (SendMail) Kind() string { return "send_mail" }

type Resize struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

func (Resize) Kind() string { return "resize" }

// README:end kinds-args

// One worker, one queue, a handler per kind: each item runs with its
// kind's handler, its arguments decoded; an item of a kind this worker
// does not know ends dead with reason "unknown kind: <kind>".
func ExampleAddKind() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE done (what TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "jobs"})
	if err != nil {
		log.Fatal(err)
	}

	// README:begin kinds-enqueue
	for _, args := range []claim.Args{SendMail{To: "ada@example.com", Subject: "hello"}, Resize{Image: "cat.png", Width: 200}} {
		it, err := claim.ArgsItem(args) // Kind from args.Kind(), Payload its JSON
		if err != nil {
			log.Fatal(err)
		}
		it.Priority = 1 // any other field of the item as usual
		if _, err := q.Enqueue(ctx, it); err != nil {
			log.Fatal(err)
		}
	}
	// README:end kinds-enqueue
	if _, err := q.Enqueue(ctx, claim.NewItem{Kind: "send_sms", Payload: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}

	// README:begin kinds-worker
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[SendMail]) (worker.Record, error) {
		return worker.Exec(`INSERT INTO done (what) VALUES ($1)`, "mail to "+job.Args.To), nil
	})
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[Resize]) (worker.Record, error) {
		return worker.Exec(`INSERT INTO done (what) VALUES ($1)`, fmt.Sprintf("%s at %dpx", job.Args.Image, job.Args.Width)), nil
	})
	handler := kinds.Handler() // the queue's worker.Handler: worker.New(q, handler, opts)
	// README:end kinds-worker
	w, err := worker.New(q, handler, worker.Options{Concurrency: 4, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	runUntil(ctx, w, pool, `SELECT (SELECT count(*) FROM done) + (SELECT count(*) FROM crdbwork_dead_items)`, 3)
	rows, err := pool.Query(ctx, `SELECT what FROM done`)
	if err != nil {
		log.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	page, err := q.DeadItems(ctx, claim.DeadQuery{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead:", page.Items[0].Reason)
	// Output:
	// cat.png at 200px
	// mail to ada@example.com
	// dead: unknown kind: send_sms
}

// A rolling upgrade: items of a kind only the new deployment knows wait
// (snoozed, no attempt used) on the old one, instead of ending dead.
func ExampleKinds_unknownWait() {
	// README:begin kinds-wait
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[SendMail]) (worker.Record, error) {
		return nil, nil
	})
	// An item of a kind this deployment does not know is put back for a
	// minute at a time, for up to a day after its enqueue, so that a newer
	// deployment that knows its kind takes it; then it ends dead.
	kinds.UnknownWait, kinds.UnknownEvery = 24*time.Hour, time.Minute
	kinds.OnUnknown = func(it claim.Item, waits bool) {
		log.Printf("item %s of unknown kind %q (waits: %v)", it.ID, it.Kind, waits)
	}
	handler := kinds.Handler()
	// README:end kinds-wait
	_ = handler
	fmt.Println(kinds.Names())
	// Output: [send_mail]
}
