package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestLimitHoldsWhileProcessesAreKilled sets a queue limit of 5 with `demo
// limit` and works 800 items off with three `demo work` processes of 8
// handlers each that record every handler run's start and end (database
// clock); every 120 results one of them is killed with SIGKILL and
// replaced. The most runs at once (a killed process's unfinished runs end
// at its kill) must not exceed 5, and every item must end.
func TestLimitHoldsWhileProcessesAreKilled(t *testing.T) {
	t.Parallel()
	const items, limit = 800, 5
	f := newFaultDemo(t, testschema.NewURL(t), items)
	r := op(t, time.Minute, f.env, "limit", "--max-in-flight", fmt.Sprint(limit))
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("at most %d in flight", limit)) {
		t.Fatalf("demo limit: exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if r := op(t, time.Minute, f.env, "status"); r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("limits: queue: at most %d in flight", limit)) {
		t.Fatalf("demo status does not show the limit: exit status %d\nstdout:\n%s", r.code, r.stdout)
	}
	args := []string{"--concurrency", "8", "--task-time", "20ms", "--record-runs"}
	var procs []*proc
	n := 0
	hb, expiry := sessionTiming(250*time.Millisecond, 6)
	startOne := func() {
		procs = append(procs, f.work(fmt.Sprint("limit-worker-", n), hb, expiry, args...))
		n++
	}
	for range 3 {
		startOne()
	}
	killedAt := map[int]time.Time{} // pid -> a database time just after its death
	kills := 0
	for next := 120; next < items; next += 120 {
		f.waitProgress(next)
		i := rand.IntN(len(procs))
		victim := procs[i]
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatalf("killing %s: %v; its stderr:\n%s", victim.name, err, victim.stderr.String())
		}
		<-victim.exited
		var now time.Time
		if err := f.db.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		killedAt[victim.cmd.Process.Pid] = now
		kills++
		procs = append(procs[:i], procs[i+1:]...)
		startOne()
	}
	f.assertEnded(time.Now(), 2*time.Minute, procs...)

	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	rows, err := f.db.Query(context.Background(), `SELECT pid, started_at, ended_at FROM demo_runs`)
	if err != nil {
		t.Fatal(err)
	}
	var busy time.Duration
	var first, last time.Time
	for rows.Next() {
		var pid int64
		var start time.Time
		var end *time.Time
		if err := rows.Scan(&pid, &start, &end); err != nil {
			t.Fatal(err)
		}
		stop, ok := killedAt[int(pid)]
		if end != nil {
			stop = *end
		} else if !ok {
			t.Fatalf("a run of process %d has no end, and the process was not killed", pid)
		}
		events = append(events, event{start, 1}, event{stop, -1})
		busy += stop.Sub(start)
		if first.IsZero() || start.Before(first) {
			first = start
		}
		if stop.After(last) {
			last = stop
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Ends sort before starts at the same instant.
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	cur, most := 0, 0
	for _, e := range events {
		cur += e.delta
		most = max(most, cur)
	}
	mean := float64(busy) / float64(last.Sub(first))
	t.Logf("%d runs, %d kills: at most %d at once (limit %d), mean %.2f (%.0f%% of the limit)", len(events)/2, kills, most, limit, mean, 100*mean/limit)
	if len(events)/2 < items {
		t.Errorf("%d runs recorded for %d items", len(events)/2, items)
	}
	if most > limit {
		t.Errorf("%d handler runs at once; the limit is %d", most, limit)
	}
}

// TestLimitCommand sets the queue's, the default tenant and one tenant's
// limits with `crdbwork limit`, reads them back as JSON, removes the tenant's,
// and checks that bad input exits 2 and changes nothing.
func TestLimitCommand(t *testing.T) {
	t.Parallel()
	env := demoEnv("DATABASE_URL=" + testschema.NewURL(t))
	for _, args := range [][]string{
		{"limit", "--max-in-flight", "7", "--create"},
		{"limit", "--rate", "12.5"},
		{"limit", "--each-tenant", "--max-in-flight", "3"},
		{"limit", "--tenant", "acme", "--max-in-flight", "2", "--rate", "1.5"},
		{"limit", "--tenant", "gone", "--rate", "1"},
		{"limit", "--tenant", "gone", "--remove"},
	} {
		if r := op(t, time.Minute, env, args...); r.code != 0 {
			t.Fatalf("crdbwork %s: exit status %d\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	want := `{"max_in_flight":7,"rate":12.5,"tenant_max_in_flight":3,"tenant_rate":0,"tenants":{"acme":{"max_in_flight":2,"rate":1.5}}}`
	if r := op(t, time.Minute, env, "limit", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != want {
		t.Fatalf("demo limit --json: exit status %d, %s\nwant %s", r.code, r.stdout, want)
	}
	for _, args := range [][]string{
		{"limit", "--rate", "-1"},
		{"limit", "--rate", "fast"},
		{"limit", "--max-in-flight", "-2"},
		{"limit", "--remove"},
		{"limit", "--tenant", "acme"},
		{"limit", "--tenant", "acme", "--each-tenant", "--rate", "1"},
		{"limit", "--tenant", "acme", "--remove", "--rate", "1"},
	} {
		if r := op(t, time.Minute, env, args...); r.code != 2 {
			t.Errorf("crdbwork %s: exit status %d, want 2\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if r := op(t, time.Minute, env, "limit", "--json"); strings.TrimSpace(r.stdout) != want {
		t.Fatalf("bad input changed the limits: %s", r.stdout)
	}
}
