package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/schedule"
)

// A queue's page lists its schedules (stored, with their periods and next
// period, and in code once fired), and pauses and resumes one, audited;
// a runner then enqueues nothing for the paused schedule.
func TestQueuePageShowsAndPausesSchedules(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{Auth: func(r *http.Request) (string, bool) { return "ada", true }})
	ctx := context.Background()
	enqueue(t, pool, "reports", 1, nil)
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		t.Fatal(err)
	}
	if err := schedule.Put(ctx, q, schedule.Schedule{Name: "nightly", Cron: "0 2 * * *", Item: claim.NewItem{Payload: []byte("n")}}); err != nil {
		t.Fatal(err)
	}
	r, err := schedule.New(q, schedule.Options{}, schedule.Schedule{Name: "in-code", Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	page := b.get("/queue?name=reports")
	for _, want := range []string{`id="q-schedules"`, `data-schedule="nightly"`, "cron 0 2 * * *", `data-schedule="in-code"`, "in code"} {
		if !strings.Contains(page, want) {
			t.Errorf("the queue's page does not show %q", want)
		}
	}
	code, _, _ := act(t, b, url.Values{"act": {"schedule-pause"}, "queue": {"reports"}, "schedule": {"nightly"}})
	if code != http.StatusSeeOther {
		t.Fatalf("schedule-pause answered %d", code)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_schedules WHERE name = 'nightly' AND paused`); n != 1 {
		t.Fatal("the schedule is not paused")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_audit WHERE action = 'schedule-pause' AND actor = 'ada'`); n != 1 {
		t.Errorf("the pause is not audited")
	}
	if page := b.get("/queue?name=reports"); !strings.Contains(page, `value="schedule-resume"`) {
		t.Errorf("the paused schedule has no Resume button")
	}
	// Due now (its last period two days back): the paused schedule gets nothing.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_schedules SET last_period = now() - INTERVAL '2 days' WHERE name = 'nightly'`); err != nil {
		t.Fatal(err)
	}
	if fired, err := r.Tick(ctx); err != nil || len(fired) != 0 {
		t.Fatalf("tick with the schedule paused: %+v %v", fired, err)
	}
	if code, _, _ := act(t, b, url.Values{"act": {"schedule-resume"}, "queue": {"reports"}, "schedule": {"nightly"}}); code != http.StatusSeeOther {
		t.Fatalf("schedule-resume answered %d", code)
	}
	if fired, err := r.Tick(ctx); err != nil || len(fired) == 0 {
		t.Fatalf("tick with the schedule resumed: %+v %v", fired, err)
	}
}
