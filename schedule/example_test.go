package schedule_test

import (
	"context"
	"fmt"
	"log"
	"time"
	_ "time/tzdata" // CRON_TZ zones on systems without a zone database

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/schedule"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// A nightly report and a cache refresh every five minutes. Every process
// that runs these schedules runs the same Runner beside its worker; between
// them, they enqueue one item per period. Here two runners race and the
// first Tick of each is shown: only one of them enqueues each period's item.
func ExampleRunner() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}

	schedules := []schedule.Schedule{
		{
			Name: "nightly-report",
			Cron: "CRON_TZ=Europe/Paris 30 2 * * *", // 02:30 in Paris
			Make: func(period time.Time) claim.NewItem {
				// The payload names the night, whichever process builds it.
				return claim.NewItem{Payload: []byte("report for " + period.Format("2006-01-02"))}
			},
			Missed: schedule.CatchUp, // down over the night: one report when back
		},
		{
			Name:   "refresh-cache",
			Every:  5 * time.Minute,
			Item:   claim.NewItem{Payload: []byte("refresh"), TTL: 5 * time.Minute},
			Missed: schedule.Skip, // a missed refresh is worthless later
		},
	}
	q, err := claim.New(pool, claim.Options{Queue: "maintenance"})
	if err != nil {
		log.Fatal(err)
	}
	// Two runners, as two processes would run them.
	a, err := schedule.New(q, schedule.Options{}, schedules...)
	if err != nil {
		log.Fatal(err)
	}
	b, err := schedule.New(q, schedule.Options{}, schedules...)
	if err != nil {
		log.Fatal(err)
	}
	// In a service: go a.Run(ctx), beside worker.Run.
	firedA, err := a.Tick(ctx)
	if err != nil {
		log.Fatal(err)
	}
	firedB, err := b.Tick(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued by a:", len(firedA), "by b:", len(firedB))
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE queue = 'maintenance'`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("items:", n)

	// A typo in a cron expression is refused before anything runs.
	_, err = schedule.New(q, schedule.Options{}, schedule.Schedule{Name: "typo", Cron: "0 25 * * *"})
	fmt.Println(err)
	// Output:
	// enqueued by a: 2 by b: 0
	// items: 2
	// schedule: schedule "typo": bad schedule: cron expression "0 25 * * *": end of range (25) above maximum (23): 25
}

// A schedule stored in the database, added, paused and removed at run time
// by a process that runs no schedule (an operator's tool, or crdbwork
// schedules): the runners of the queue, started without it, pick it up.
func ExamplePut() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	// A runner with no schedule of its own: it runs the stored ones.
	r, err := schedule.New(q, schedule.Options{})
	if err != nil {
		log.Fatal(err)
	}

	// README:begin stored-schedule
	// From any process: store the schedule; every runner of the queue
	// runs it from its next reload (schedule.Options.Reload, 10 s).
	err = schedule.Put(ctx, q, schedule.Schedule{
		Name:  "hourly-export",
		Every: time.Hour,
		Item:  claim.NewItem{Payload: []byte(`{"export":"orders"}`), Timeout: 10 * time.Minute},
	})
	// README:end stored-schedule
	if err != nil {
		log.Fatal(err)
	}
	fired, err := r.Tick(ctx) // what Run does at each period
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range fired {
		fmt.Println("enqueued:", f.Schedule)
	}

	// README:begin stored-schedule-ops
	if err := schedule.Pause(ctx, q, "hourly-export", true); err != nil { // every runner stops it
		log.Fatal(err)
	}
	list, err := schedule.List(ctx, pool, crsql.Tables{}, "reports", 0)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range list {
		fmt.Println(s.Name, "stored:", s.Stored, "paused:", s.Paused, "every:", s.Schedule.Every)
	}
	if err := schedule.Delete(ctx, q, "hourly-export"); err != nil { // and forgets it
		log.Fatal(err)
	}
	// README:end stored-schedule-ops
	fired, err = r.Tick(ctx)
	fmt.Println("after the deletion:", len(fired), err)
	// Output:
	// enqueued: hourly-export
	// hourly-export stored: true paused: true every: 1h0m0s
	// after the deletion: 0 <nil>
}
