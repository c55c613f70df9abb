package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/schedule"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork schedules adds a schedule that a running runner (started
// before, without it) picks up and enqueues with the item the command
// gave; lists it (text and JSON) beside a schedule in code; pauses it (the
// runner enqueues nothing for a new period), resumes and removes it; and
// refuses what cannot run.
func TestSchedules(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	q := d.queue(t, "reports", crsql.Tables{})
	var stored int
	r, err := schedule.New(q, schedule.Options{OnReload: func(n int, err error) { stored = n }},
		schedule.Schedule{Name: "in-code", Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Tick(ctx); err != nil || stored != 0 {
		t.Fatalf("first tick: %v, %d stored", err, stored)
	}

	want(t, d.env, 2, []string{"set Every or Cron"}, "schedules", "add", "nightly", "--queue", "reports")
	want(t, d.env, 2, []string{"--every is for add"}, "schedules", "pause", "nightly", "--queue", "reports", "--every", "1h")
	want(t, d.env, 1, []string{"no such schedule"}, "schedules", "remove", "nightly", "--queue", "reports")
	want(t, d.env, 1, []string{"no such schedule"}, "schedules", "remove", "in-code", "--queue", "reports")
	must(t, d.env, "schedules", "add", "nightly", "--queue", "reports", "--every", "1h", "--payload", `{"report":"sales"}`,
		"--priority", "3", "--timeout", "20m", "--skip-missed")

	fired, err := r.Tick(ctx)
	if err != nil || stored != 1 || len(fired) != 1 || fired[0].Schedule != "nightly" {
		t.Fatalf("tick after add: %+v %v (%d stored)", fired, err, stored)
	}
	var payload string
	var priority int
	var timeoutUS int64
	if err := d.pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8'), priority, timeout_us FROM crdbwork_items WHERE id = $1`, fired[0].ID).
		Scan(&payload, &priority, &timeoutUS); err != nil {
		t.Fatal(err)
	}
	if payload != `{"report":"sales"}` || priority != 3 || time.Duration(timeoutUS)*time.Microsecond != 20*time.Minute {
		t.Errorf("the item: payload %s, priority %d, timeout %dµs", payload, priority, timeoutUS)
	}

	out := must(t, d.env, "schedules", "--queue", "reports").stdout
	if !strings.Contains(out, "nightly") || !strings.Contains(out, "stored") || !strings.Contains(out, "1h0m0s") ||
		!strings.Contains(out, "in-code") || !strings.Contains(out, "in code") {
		t.Errorf("schedules list:\n%s", out)
	}
	m := jsonOf(t, must(t, d.env, "schedules", "list", "--json"))
	if m["name"] != "nightly" || m["stored"] != true || m["every"] != "1h0m0s" || m["missed"] != "skip" || m["timeout"] != "20m0s" || m["paused"] != false {
		t.Errorf("schedules list --json (last line): %v", m)
	}

	// Paused: a new period gets no item.
	must(t, d.env, "schedules", "pause", "nightly", "--queue", "reports")
	if _, err := d.pool.Exec(ctx, `UPDATE crdbwork_schedules SET last_period = last_period - INTERVAL '1 hour' WHERE name = 'nightly'`); err != nil {
		t.Fatal(err)
	}
	if fired, err := r.Tick(ctx); err != nil || len(fired) != 0 {
		t.Fatalf("tick of the paused schedule: %+v %v", fired, err)
	}
	if m := jsonOf(t, must(t, d.env, "schedules", "list", "--queue", "reports", "--json")); m["name"] != "nightly" || m["paused"] != true {
		t.Errorf("list of the paused schedule: %v", m)
	}
	must(t, d.env, "schedules", "resume", "nightly", "--queue", "reports")
	if fired, err := r.Tick(ctx); err != nil || len(fired) != 1 {
		t.Fatalf("tick of the resumed schedule: %+v %v", fired, err)
	}

	must(t, d.env, "schedules", "remove", "nightly", "--queue", "reports")
	if _, err := r.Tick(ctx); err != nil || stored != 0 {
		t.Fatalf("tick after remove: %v, %d stored", err, stored)
	}
	if out := must(t, d.env, "schedules", "--queue", "reports").stdout; strings.Contains(out, "nightly") {
		t.Errorf("the removed schedule is listed:\n%s", out)
	}
}
