//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestFaultDemoFrozenInTransaction freezes a `demo work` process with
// SIGSTOP at a moment when one of its connections is idle in a transaction
// (it froze between the statements of an ack, say): the server holds that
// transaction's row locks for as long as the connection lives, and deleting
// the frozen session touches the items it locked, so every peer's reaper of
// expired sessions would wait on it for as long as the process stays
// frozen. The worker's connections end a transaction idle longer than the
// session expiry (demo work sets idle_in_transaction_session_timeout), so
// bound: the peer deletes the frozen session within the expiry, the idle
// timeout (the expiry) and deployRecovery's reaping and slack; then every
// item ends within 30 s of the thaw, exactly once.
func TestFaultDemoFrozenInTransaction(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("catches the frozen process with a transaction open in pg_stat_activity (its client ports and transaction id), PostgreSQL's; CockroachDB's is an empty table kept for compatibility")
	}
	const items = 3000
	heartbeat, expiry := sessionTiming(250*time.Millisecond, 6)
	f := newFaultDemo(t, testschema.NewURL(t), items)
	frozen := f.work("frozen-tx-worker", heartbeat, expiry, "--task-time", "1ms", "--concurrency", "32", "--ack-batch", "8")
	peer := f.work("peer-worker", heartbeat, expiry)
	sid := f.sessionOf(frozen.name)
	f.waitProgress(100)

	// Stop and look, until a connection of the frozen process is idle in a
	// transaction that has written (it has a transaction id, and holds the
	// locks of the rows it wrote); thaw and try again a little later
	// otherwise.
	pid := frozen.cmd.Process.Pid
	var caught string
	tries := 0
	await.Until(t, frozen.name+" to be caught with a transaction open", func() (bool, string) {
		tries++
		if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		await.Until(t, "the process to stop", func() bool { return processState(t, pid) == 'T' })
		// The statements it had sent complete (their backends leave the
		// state active, PostgreSQL's pg_stat_activity): a transaction of
		// it is then idle, or none is open.
		ports := clientPorts(t, pid)
		await.Until(t, "the frozen process's statements in flight to complete", func() (bool, string) {
			var active string
			err := f.db.QueryRow(context.Background(), `SELECT COALESCE(string_agg(left(query, 120), ' | '), '')
				FROM pg_stat_activity WHERE state = 'active' AND client_port = ANY($1)`, ports).Scan(&active)
			if err != nil {
				t.Fatal(err)
			}
			return active == "", "still running: " + active
		})
		err := f.db.QueryRow(context.Background(), `SELECT COALESCE(string_agg(left(query, 120), ' | '), '')
			FROM pg_stat_activity WHERE state = 'idle in transaction' AND backend_xid IS NOT NULL AND client_port = ANY($1)`, ports).Scan(&caught)
		if err != nil {
			t.Fatal(err)
		}
		if caught != "" {
			return true, ""
		}
		if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Let it run a few milliseconds (drawn) before the next try.
		time.Sleep(time.Duration(5+time.Now().UnixNano()%20) * time.Millisecond)
		return false, fmt.Sprintf("%d tries; %d of %d items have results", tries, f.count(`SELECT count(*) FROM demo_results`), items)
	}, await.Every(time.Millisecond))
	t.Logf("froze %s with a transaction open (try %d): %s", frozen.name, tries, caught)
	bound := expiry + expiry + 2*heartbeat + f.leaseSlack
	took := await.Until(t, fmt.Sprintf("the frozen session to be deleted (bound %v)", bound), func() bool {
		return f.count(`SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, sid) == 0
	}, await.Within(bound), await.Show(func() string {
		d := &deployment{t: t, f: f}
		return "the database's transactions:\n" + d.transactions()
	}))
	t.Logf("the frozen session was deleted %v after the freeze (bound %v)", took.Round(time.Millisecond), bound)
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	f.assertEnded(time.Now(), 30*time.Second, frozen, peer)
}

// processState returns the state letter of /proc/PID/stat ('T': stopped).
func processState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		t.Fatalf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2]
}

// clientPorts returns the local TCP ports of the sockets process pid has
// open (IPv4 and IPv6): its connections' client ports as the server sees
// them.
func clientPorts(t *testing.T, pid int) []int32 {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var ports []int32
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		sc.Scan() // the header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, port, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(port, 16, 32); ok && err == nil {
				ports = append(ports, int32(p))
			}
		}
		file.Close()
	}
	return ports
}
