package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/await"
)

// TestTwoQueuesOneDatabase runs `demo work --queue X --parts 8` processes
// for two queues of one database, 400 items each: every item of both
// queues must end (acked once) within the deadline. When a queue's parts
// were divided among every live session of the database, each process
// took only half of its queue's parts and the other half stayed unclaimed
// for ever. Then `demo status` must show which sessions work which queue
// and own which parts, in text and in --json.
func TestTwoQueuesOneDatabase(t *testing.T) {
	t.Parallel()
	const items = 400
	_, env, pool := migrated(t)
	queues := []string{"alpha", "beta"}
	for _, q := range queues {
		if r := demo(t, time.Minute, env, "enqueue", "--queue", q, "--count", fmt.Sprint(items), "--parts", "8"); r.code != 0 {
			t.Fatalf("enqueue into %s: exit status %d\n%s", q, r.code, r.stderr)
		}
	}
	procs := map[string]*proc{}
	for _, q := range queues {
		procs[q] = startWork(t, env, q+"-worker", "--queue", q, "--parts", "8", "--heartbeat", "200ms", "--expiry", "1s", "--rebalance", "200ms")
	}
	await.Until(t, "every item of both queues to end", func() (bool, string) {
		if countRows(t, pool, `SELECT count(*) FROM crdbwork_items`) == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d items of alpha and %d of beta not ended (%d unclaimed)",
			countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'alpha'`),
			countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'beta'`),
			countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL`))
	}, await.Show(func() string {
		var tails []string
		for _, p := range procs {
			tails = append(tails, p.name+":\n"+lastLines(p.stderr.String(), 10))
		}
		return strings.Join(tails, "\n")
	}))
	v := lastJSON(t, demo(t, time.Minute, env, "verify", "--json"))
	if num(t, v, "enqueued") != 2*items || num(t, v, "acked") != 2*items || num(t, v, "duplicates") != 0 || num(t, v, "lost") != 0 {
		t.Errorf("verify: %v; want all %d items of both queues acked once", v, 2*items)
	}

	// Status: each queue's member is its own worker, owning all 8 parts.
	var st struct {
		QueueMembers []struct {
			Queue   string `json:"queue"`
			Members []struct {
				Session  string `json:"session"`
				Name     string `json:"name"`
				Joined   bool   `json:"joined"`
				Live     bool   `json:"live"`
				Parts    string `json:"parts"`
				NumParts int    `json:"num_parts"`
			} `json:"members"`
		} `json:"queue_members"`
	}
	r := op(t, time.Minute, env, "status", "--queue", "alpha", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 0 {
		t.Fatalf("status --json: exit status %d, %v\n%s", r.code, err, r.stdout)
	}
	if len(st.QueueMembers) != 2 {
		t.Fatalf("status --json: queue_members %+v; want alpha and beta", st.QueueMembers)
	}
	for i, q := range queues {
		qm := st.QueueMembers[i]
		if qm.Queue != q || len(qm.Members) != 1 {
			t.Errorf("status --json: members of %q: %+v; want %s-worker alone", q, qm, q)
			continue
		}
		m := qm.Members[0]
		if m.Name != q+"-worker" || !m.Joined || !m.Live || m.Parts != "0-7" || m.NumParts != 8 {
			t.Errorf("status --json: member of %q: %+v; want %s-worker, joined, live, owning parts 0-7", q, m, q)
		}
	}
	r = op(t, time.Minute, env, "status", "--queue", "alpha")
	t.Logf("status:\n%s", r.stdout)
	for _, q := range queues {
		if !strings.Contains(r.stdout, "queues worked") || !containsLine(r.stdout, q, q+"-worker", "0-7") {
			t.Errorf("status does not show %s-worker working %s with parts 0-7:\n%s", q, q, r.stdout)
		}
	}
	for _, p := range procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.exited
	}
}

// containsLine reports whether a line of text contains every word.
func containsLine(text string, words ...string) bool {
	for _, line := range strings.Split(text, "\n") {
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return true
		}
	}
	return false
}
