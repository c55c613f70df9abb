package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// startDashboard runs crdbwork dashboard with args on a free port and
// returns its URL; the process is stopped (SIGTERM) at the test's end,
// and must exit 0.
func startDashboard(t *testing.T, e []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"dashboard", "--addr", "127.0.0.1:0", "--json"}, args...)...)
	cmd.Env = e
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("crdbwork dashboard printed no address: %s", stderr.String())
	}
	var v struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil || v.URL == "" {
		_ = cmd.Process.Kill()
		t.Fatalf("crdbwork dashboard printed %q (%v): %s", line, err, stderr.String())
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("crdbwork dashboard ended with %v: %s", err, stderr.String())
		}
	})
	return v.URL
}

func httpStatus(t *testing.T, method, url, user, password string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), method, url, nil)
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestDashboardCommand(t *testing.T) {
	d := newDB(t, crsql.Tables{})
	d.enqueue(t, "mail", 3)

	// Safe by default: an address other machines reach needs auth or an
	// explicit flag.
	want(t, d.env, 2, []string{"refused", "CRDBWORK_DASHBOARD_PASSWORD"}, "dashboard", "--addr", "0.0.0.0:0")
	want(t, d.env, 2, []string{"refused"}, "dashboard", "--addr", ":0")

	// Basic auth from the environment: required for every page.
	url := startDashboard(t, append(d.env, "CRDBWORK_DASHBOARD_PASSWORD=s3cret"), "--auth-user", "ops")
	if c := httpStatus(t, "GET", url, "", ""); c != http.StatusUnauthorized {
		t.Errorf("no credentials: %d, want 401", c)
	}
	if c := httpStatus(t, "GET", url, "ops", "wrong"); c != http.StatusUnauthorized {
		t.Errorf("a wrong password: %d, want 401", c)
	}
	if c := httpStatus(t, "GET", url+"sessions", "ops", "s3cret"); c != http.StatusOK {
		t.Errorf("the right password: %d, want 200", c)
	}

	// The command line's actions are in the audit list too.
	must(t, d.env, "pause", "--queue", "mail")
	must(t, d.env, "pause", "--queue", "mail") // already paused: nothing done, nothing recorded
	must(t, d.env, "resume", "--queue", "mail")
	if n := d.count(t, `SELECT count(*) FROM crdbwork_audit WHERE source = 'cli' AND queue = 'mail' AND action IN ('pause', 'resume') AND actor <> ''`); n != 2 {
		t.Errorf("%d audit rows of the command line's pause and resume, want 2", n)
	}

	// Read-only: actions are refused.
	ro := startDashboard(t, d.env, "--read-only")
	if c := httpStatus(t, "GET", ro, "", ""); c != http.StatusOK {
		t.Errorf("read-only page: %d", c)
	}
	if c := httpStatus(t, "POST", ro+"action", "", ""); c != http.StatusForbidden {
		t.Errorf("read-only action: %d, want 403", c)
	}
}
