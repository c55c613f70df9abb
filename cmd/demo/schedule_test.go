package main

import (
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/schedule"
)

// startWork starts a `demo work` process.
func startWork(t *testing.T, env []string, name string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"work", "--name", name, "--task-time", "1ms", "--concurrency", "8"}, extra...)
	cmd := exec.Command(demoBin, args...)
	cmd.Env = env
	p := &proc{name: name, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// `demo work --every 1s` processes on two queues (one schedule catching up
// missed periods, one skipping them), two per queue, are SIGKILLed
// mid-period; while none runs, at least three periods pass; then one
// process per queue comes back. Across both lives, every period has at most
// one item (counted in the items table and, once acked, in demo_results),
// and after the gap: the catch-up queue gets one item for the latest missed
// period and the current one, the skip queue only the current one; no other
// missed period gets an item.
func TestWorkEveryKilledAcrossPeriods(t *testing.T) {
	t.Parallel()
	const every = time.Second
	url := testschema.NewURL(t)
	env := demoEnv("DATABASE_URL=" + url)
	db, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	ctx := context.Background()
	scalar := func(dst any, query string, args ...any) {
		t.Helper()
		if err := db.QueryRow(ctx, query, args...).Scan(dst); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	dbNow := func() time.Time {
		var now time.Time
		scalar(&now, `SELECT now()`)
		return now
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		await.Until(t, what, cond)
	}
	lastPeriod := func(queue string) time.Time {
		var last time.Time
		err := db.QueryRow(ctx, `SELECT last_period FROM crdbwork_schedules WHERE queue = $1 AND name = $2`, queue, demoSchedule).Scan(&last)
		if err != nil {
			return time.Time{}
		}
		return last
	}
	// items counts the items of period p of queue, pending or acked.
	items := func(queue string, p time.Time) int {
		id := schedule.ItemID(queue, demoSchedule, p)
		var n int
		scalar(&n, `SELECT (SELECT count(*) FROM crdbwork_items WHERE id = $1) + (SELECT count(*) FROM demo_results WHERE item_id = $1)`, id)
		return n
	}
	queues := map[string][]string{
		"catch-up": {"--every", every.String()},
		"skip":     {"--every", every.String(), "--skip-missed"},
	}

	// First life: two processes per queue, until each schedule has
	// recorded three periods.
	var first []*proc
	begin := map[string]time.Time{}
	start := dbNow().Truncate(every)
	for q, flags := range queues {
		for i := range 2 {
			first = append(first, startWork(t, env, fmt.Sprintf("%s-%d", q, i), append([]string{"--queue", q}, flags...)...))
		}
	}
	for q := range queues {
		waitFor("the first period of "+q, func() bool { return !lastPeriod(q).IsZero() })
		begin[q] = lastPeriod(q)
		waitFor("three periods of "+q, func() bool { return !lastPeriod(q).Before(begin[q].Add(2 * every)) })
	}
	for _, p := range first {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range first {
		<-p.exited
	}
	last := map[string]time.Time{}
	latest := time.Time{}
	for q := range queues {
		last[q] = lastPeriod(q)
		if last[q].After(latest) {
			latest = last[q]
		}
	}
	// Down for at least three whole periods.
	waitFor("three periods without a process", func() bool { return !dbNow().Before(latest.Add(4 * every)) })
	restart := dbNow().Truncate(every)

	// Second life: one process per queue, until each schedule recorded a
	// period after the gap and its items are in.
	var second []*proc
	for q, flags := range queues {
		second = append(second, startWork(t, env, q+"-back", append([]string{"--queue", q}, flags...)...))
	}
	for q := range queues {
		waitFor("a period after the gap on "+q, func() bool { return lastPeriod(q).After(last[q].Add(3 * every)) })
	}
	for _, p := range second {
		p.stopGracefully(t)
	}

	end := dbNow()
	for q := range queues {
		var after []time.Time
		for p := start.Add(-3 * every); p.Before(end); p = p.Add(every) {
			n := items(q, p)
			switch {
			case n > 1:
				t.Fatalf("%s: period %s has %d items", q, p.Format("15:04:05"), n)
			case p.Before(start) && n != 0:
				t.Fatalf("%s: period %s, before any process ran, has an item", q, p.Format("15:04:05"))
			case !p.Before(begin[q]) && !p.After(last[q]) && n != 1:
				t.Logf("%s: period %s of the first life has no item (the runners were late by a whole period)", q, p.Format("15:04:05"))
			case p.After(last[q]) && n == 1:
				after = append(after, p)
			}
		}
		if len(after) < 2 && q == "catch-up" || len(after) < 1 {
			t.Fatalf("%s: items after the gap for periods %v", q, after)
		}
		switch q {
		case "catch-up":
			// The first item after the gap is the catch-up: the period just
			// before the first the process saw as current; the periods
			// between it and the gap's start have none.
			if !after[1].Equal(after[0].Add(every)) || after[0].Before(last[q].Add(3*every)) || after[0].Before(restart.Add(-every)) {
				t.Fatalf("%s: last period before the kill %s, back at %s; items after the gap at %v, want the latest missed period and the current one",
					q, last[q].Format("15:04:05"), restart.Format("15:04:05"), after)
			}
		case "skip":
			if after[0].Before(restart) {
				t.Fatalf("%s: last period before the kill %s, back at %s; an item for missed period %s",
					q, last[q].Format("15:04:05"), restart.Format("15:04:05"), after[0].Format("15:04:05"))
			}
		}
		t.Logf("%s: first life %s–%s, back at %s, items after the gap %v", q, begin[q].Format("15:04:05"), last[q].Format("15:04:05"), restart.Format("15:04:05"), after)
	}
}
