package main

// Overload degrades, it does not churn (issue 32, goal 4): worker
// processes on a server that is slow to open connections — as a server
// whose CPU is saturated is: it forks each new backend behind a long run
// queue, and 128 worker processes on 2 cores made every connect take
// seconds — keep their sessions, while a process that dies still loses its
// session within its expiry and its items end.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestFaultDemoSlowConnectsKeepSessions runs four `demo work` processes
// whose every new connection takes three heartbeats to open (a proxy holds
// it: faultproxy.DelayConnects), longer than the two heartbeats a heartbeat
// was given before, shorter than the expiry. Before the fix each session
// opened its heartbeat's connection on its first heartbeat and gave the
// connect two heartbeats: every session was lost before its first
// heartbeat, and the fleet re-took its sessions for ever (measured: 537
// sessions lost by 128 processes draining 200,000 items). Now the
// connection is opened before the session's row exists.
//
// Asserted, without timing: each process's first session outlives its
// expiry by heartbeats (its row's heartbeat_at passes created_at + expiry);
// a process SIGKILLed while it holds items loses its session (its row is
// reaped by a peer) and every item ends, acked exactly once; and no
// process that stayed alive lost a session.
func TestFaultDemoSlowConnectsKeepSessions(t *testing.T) {
	t.Parallel()
	const items = 3000
	dbURL := testschema.NewURL(t)
	f := newFaultDemo(t, dbURL, items)
	p, proxied, err := faultproxy.ForURL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// The heartbeat and the connect delay are fixed: three heartbeats, more
	// than the two a connect was given before, whatever the load, and well
	// within the 5 s the demo gives any connect (cli.PingTimeout). The
	// expiry stretches with the machine's load, so that a heartbeat that
	// times out on a loaded machine (after two heartbeats) has the time to
	// open its connection again, three heartbeats and more.
	hb, expiry := 250*time.Millisecond, await.Stretch(4*time.Second)
	p.DelayConnects(3 * hb)
	f.workEnv = demoEnv("DATABASE_URL=" + proxied)
	var procs []*proc
	for i := range 4 {
		procs = append(procs, f.work(fmt.Sprintf("slow-connect-worker-%d", i), hb, expiry, "--report-every", "100ms", "--task-time", "20ms"))
	}
	sids := make([]uuid.UUID, len(procs))
	for i, pr := range procs {
		sids[i] = f.sessionOf(pr.name)
	}
	victim, survivors := procs[0], procs[1:]
	await.Until(t, "the victim to hold items", func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_items WHERE claim = $1`, sids[0]) > 0
	}, await.Show(victim.stderr.String))
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.exited
	for i, pr := range survivors {
		await.Until(t, pr.name+"'s first session to outlive its expiry by heartbeats", func() (bool, string) {
			n := f.count(`SELECT count(*) FROM crdbwork_sessions WHERE id = $1 AND heartbeat_at > created_at + expiry`, sids[i+1])
			return n == 1, fmt.Sprintf("%d such rows of session %s", n, sids[i+1])
		}, await.Show(pr.stderr.String))
	}
	await.Until(t, "the killed process's session to expire and be reaped by a peer", func() (bool, string) {
		n := f.count(`SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, sids[0])
		return n == 0, fmt.Sprintf("%d rows", n)
	})
	f.assertEnded(killed, 30*time.Second, survivors...)
	for i, pr := range survivors {
		st := lastStats(t, pr)
		if st.SessionsLost != 0 || st.Sessions != 1 {
			t.Errorf("%s, alive throughout, started %d sessions and lost %d (want 1 and 0):\n%s", pr.name, st.Sessions, st.SessionsLost,
				lastLines(pr.stderr.String(), 10))
		}
		if n := f.count(`SELECT count(*) FROM demo_results WHERE session_id = $1`, sids[i+1]); n <= 0 {
			t.Errorf("%s's first session recorded no result", pr.name)
		}
	}
}

// lastStats returns the last counters a `demo work --report-every` process
// printed (its final line, once it stopped).
func lastStats(t *testing.T, p *proc) workStats {
	t.Helper()
	out := p.stderr.String()
	i := strings.LastIndex(out, statsPrefix)
	if i < 0 {
		t.Fatalf("%s printed no counters:\n%s", p.name, lastLines(out, 10))
	}
	line, _, _ := strings.Cut(out[i+len(statsPrefix):], "\n")
	var st workStats
	if err := json.Unmarshal([]byte(line), &st); err != nil {
		t.Fatalf("%s's counters %q: %v", p.name, line, err)
	}
	return st
}
