package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/schedule"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// storedItems returns the payload and enqueue time (database clock) of
// each item of queue, by id.
func storedItems(t testing.TB, pool *pgxpool.Pool, queue string) map[uuid.UUID]struct {
	payload  string
	enqueued time.Time
} {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, convert_from(payload, 'UTF8'), enqueued_at FROM crdbwork_items WHERE queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID]struct {
		payload  string
		enqueued time.Time
	}{}
	for rows.Next() {
		var id uuid.UUID
		var p string
		var at time.Time
		if err := rows.Scan(&id, &p, &at); err != nil {
			t.Fatal(err)
		}
		out[id] = struct {
			payload  string
			enqueued time.Time
		}{p, at}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A schedule stored in the database runs on a fleet of runners that were
// started without it, each with its own pool (processes of a deployment),
// and is changed, paused, resumed and deleted while they run, from a
// process that runs none (an operator's):
//
//   - added: every runner picks it up without a restart, and each period
//     gets one item, reported enqueued by exactly one runner;
//   - changed (a new payload and a period twice as long): the items
//     enqueued after the change carry the new payload, with the new
//     periods' ids;
//   - paused: no item is enqueued after the pause committed, through three
//     reloads of every runner and two periods; resumed, items come again;
//   - deleted: no item after the deletion committed, and every runner
//     forgets it.
//
// A schedule in code runs beside it in every runner all along.
func TestStoredScheduleChangedWhileRunnersRun(t *testing.T) {
	t.Parallel()
	url := testschema.NewURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *pgxpool.Pool {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	admin := open() // the operator's process: runs no schedule
	every := await.Stretch(200 * time.Millisecond).Truncate(time.Millisecond)
	const queue, runners = "reports", 3
	inCode := schedule.Schedule{Name: "in-code", Every: every, Item: claim.NewItem{Payload: []byte("code")}}

	var mu sync.Mutex
	reported := map[uuid.UUID]int{}
	stored := make([]int, runners) // per runner: stored schedules after its last reload
	reloads := make([]*await.Rounds, runners)
	var wg sync.WaitGroup
	for i := range runners {
		pool := open()
		q, err := claim.New(pool, claim.Options{Queue: queue})
		if err != nil {
			t.Fatal(err)
		}
		reloads[i] = await.NewRounds(fmt.Sprintf("reloads of runner %d", i))
		r, err := schedule.New(q, schedule.Options{Reload: every / 2,
			OnEnqueue: func(f schedule.Fired) {
				if f.New {
					mu.Lock()
					reported[f.ID]++
					mu.Unlock()
				}
			},
			OnReload: func(n int, err error) {
				mu.Lock()
				stored[i] = n
				mu.Unlock()
				reloads[i].Tick()
			}}, inCode)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = r.Run(ctx) }()
	}
	defer wg.Wait()
	defer cancel()
	for i := range runners {
		reloads[i].Wait(t, 1) // running, without the stored schedule
	}
	aq, err := claim.New(admin, claim.Options{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	allSee := func(what string, want int) {
		t.Helper()
		await.Until(t, what, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			for _, n := range stored {
				if n != want {
					return false, fmt.Sprintf("stored schedules per runner %v", stored)
				}
			}
			return true, ""
		})
	}
	itemsWith := func(payload string, after time.Time) int {
		n := 0
		for _, it := range storedItems(t, admin, queue) {
			if it.payload == payload && it.enqueued.After(after) {
				n++
			}
		}
		return n
	}

	// Added.
	nightly := schedule.Schedule{Name: "nightly", Every: every, Item: claim.NewItem{Payload: []byte("v1"), Priority: 2}}
	if err := schedule.Put(ctx, aq, nightly); err != nil {
		t.Fatal(err)
	}
	added := dbNow(t, admin)
	allSee("every runner runs the added schedule", 1)
	await.Until(t, "three items of the stored schedule", func() (bool, string) {
		n := itemsWith("v1", time.Time{})
		return n >= 3, fmt.Sprintf("%d items", n)
	})

	// Changed: a new payload, periods twice as long.
	nightly.Every, nightly.Item.Payload = 2*every, []byte("v2")
	if err := schedule.Put(ctx, aq, nightly); err != nil {
		t.Fatal(err)
	}
	changed := dbNow(t, admin)
	await.Until(t, "two items of the changed schedule", func() (bool, string) {
		n := itemsWith("v2", changed)
		return n >= 2, fmt.Sprintf("%d items", n)
	})
	if n := itemsWith("v1", changed); n != 0 {
		t.Fatalf("%d items with the old payload enqueued after the change committed", n)
	}
	for id, it := range storedItems(t, admin, queue) {
		if it.payload != "v2" {
			continue
		}
		p, err := schedule.PeriodAt(nightly, it.enqueued)
		if err != nil {
			t.Fatal(err)
		}
		if id != schedule.ItemID(queue, "nightly", p) && id != schedule.ItemID(queue, "nightly", p.Add(-2*every)) {
			t.Fatalf("item %s of the changed schedule, enqueued at %s, is not the item of one of its periods", id, it.enqueued.Format("15:04:05.000"))
		}
	}

	// Paused: nothing after the pause committed.
	if err := schedule.Pause(ctx, aq, "nightly", true); err != nil {
		t.Fatal(err)
	}
	paused := dbNow(t, admin)
	for i := range runners {
		reloads[i].Wait(t, 3)
	}
	waitDB(t, admin, paused.Add(4*every))
	if n := itemsWith("v2", paused); n != 0 {
		t.Fatalf("%d items enqueued after the pause committed", n)
	}
	if n := itemsWith("code", paused); n < 1 {
		t.Fatalf("the schedule in code stopped too (%d items after the pause)", n)
	}
	// Resumed.
	if err := schedule.Pause(ctx, aq, "nightly", false); err != nil {
		t.Fatal(err)
	}
	resumed := dbNow(t, admin)
	await.Until(t, "an item after the resume", func() (bool, string) {
		n := itemsWith("v2", resumed)
		return n >= 1, fmt.Sprintf("%d items", n)
	})

	// Deleted.
	if err := schedule.Delete(ctx, aq, "nightly"); err != nil {
		t.Fatal(err)
	}
	deleted := dbNow(t, admin)
	allSee("every runner forgot the deleted schedule", 0)
	waitDB(t, admin, deleted.Add(4*every))
	if n := itemsWith("v2", deleted); n != 0 {
		t.Fatalf("%d items enqueued after the deletion committed", n)
	}
	cancel()
	wg.Wait()

	// One item per period, each reported by one runner.
	items := storedItems(t, admin, queue)
	mu.Lock()
	defer mu.Unlock()
	for id, n := range reported {
		if n != 1 {
			t.Fatalf("item %s reported enqueued by %d runners", id, n)
		}
		if _, ok := items[id]; !ok {
			t.Fatalf("item %s reported enqueued, not in the table", id)
		}
	}
	if len(reported) != len(items) {
		t.Fatalf("%d items reported enqueued, %d in the table", len(reported), len(items))
	}
	t.Logf("%d items since %s (stored and in code)", len(items), added.Format("15:04:05.000"))
}

// What cannot be stored is refused, with nothing written; Delete and Pause
// of unknown names, and Delete of a schedule defined in code, fail with
// ErrNotStored; List shows stored schedules and those in code that fired,
// and Pause stops a schedule in code.
func TestStoredSchedulesRefusalsAndList(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []schedule.Schedule{
		{Name: "make", Every: time.Hour, Make: func(time.Time) claim.NewItem { return claim.NewItem{} }},
		{Name: "unique", Every: time.Hour, Item: claim.NewItem{UniqueKey: "k"}},
		{Name: "after", Every: time.Hour, Item: claim.NewItem{After: []uuid.UUID{uuid.New()}}},
		{Name: "bad-cron", Cron: "61 * * * *"},
		{Name: "", Every: time.Hour},
	} {
		if err := schedule.Put(ctx, q, s); !errors.Is(err, schedule.ErrBadSchedule) {
			t.Errorf("Put of %q: %v, want ErrBadSchedule", s.Name, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_schedules`); n != 0 {
		t.Fatalf("%d rows written by refused Puts", n)
	}
	if err := schedule.Delete(ctx, q, "nope"); !errors.Is(err, schedule.ErrNotStored) {
		t.Fatalf("Delete of an unknown name: %v", err)
	}
	if err := schedule.Pause(ctx, q, "nope", true); !errors.Is(err, schedule.ErrNotStored) {
		t.Fatalf("Pause of an unknown name: %v", err)
	}

	// A schedule in code fires once; one is stored.
	code := schedule.Schedule{Name: "in-code", Every: time.Hour, Item: claim.NewItem{Payload: []byte("c")}}
	r, err := schedule.New(q, schedule.Options{NoStored: true}, code)
	if err != nil {
		t.Fatal(err)
	}
	if fired, err := r.Tick(ctx); err != nil || len(fired) != 1 {
		t.Fatalf("first tick: %v %v", fired, err)
	}
	daily := schedule.Schedule{Name: "daily", Cron: "0 9 * * *", Missed: schedule.Skip,
		Item: claim.NewItem{Payload: []byte(`{"report":"sales"}`), Key: "k", Timeout: time.Minute, Headers: map[string]string{"a": "b"}}}
	if err := schedule.Put(ctx, q, daily); err != nil {
		t.Fatal(err)
	}
	if err := schedule.Delete(ctx, q, "in-code"); !errors.Is(err, schedule.ErrNotStored) {
		t.Fatalf("Delete of a schedule in code: %v", err)
	}
	list, err := schedule.List(ctx, pool, crsql.Tables{}, "", 0)
	if err != nil || len(list) != 2 {
		t.Fatalf("List: %+v %v", list, err)
	}
	d, c := list[0], list[1]
	if d.Name != "daily" || !d.Stored || d.Err != nil || d.Schedule.Cron != daily.Cron || d.Schedule.Missed != schedule.Skip ||
		string(d.Schedule.Item.Payload) != `{"report":"sales"}` || d.Schedule.Item.Timeout != time.Minute || d.Schedule.Item.Headers["a"] != "b" ||
		!d.LastPeriod.IsZero() || d.Next.IsZero() || d.Paused {
		t.Errorf("the stored schedule listed: %+v", d)
	}
	if c.Name != "in-code" || c.Stored || c.LastPeriod.IsZero() || c.Paused {
		t.Errorf("the schedule in code listed: %+v", c)
	}

	// Paused, the schedule in code enqueues nothing, even for a new period.
	if err := schedule.Pause(ctx, q, "in-code", true); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schedules SET last_period = last_period - INTERVAL '1 hour' WHERE name = 'in-code'`); err != nil {
		t.Fatal(err)
	}
	r2, err := schedule.New(q, schedule.Options{NoStored: true}, code)
	if err != nil {
		t.Fatal(err)
	}
	if fired, err := r2.Tick(ctx); err != nil || len(fired) != 0 {
		t.Fatalf("tick of a paused schedule: %v %v, want nothing", fired, err)
	}
	if err := schedule.Pause(ctx, q, "in-code", false); err != nil {
		t.Fatal(err)
	}
	if fired, err := r2.Tick(ctx); err != nil || len(fired) != 1 {
		t.Fatalf("tick of the resumed schedule: %v %v, want its current period", fired, err)
	}
}

// count runs a count query.
func count(t testing.TB, pool *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
