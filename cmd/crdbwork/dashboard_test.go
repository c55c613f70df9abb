package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/crdbwork/crdbwork/internal/await"
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
	up := false
	t.Cleanup(func() { // unless it came up: then the cleanup below stops it
		if !up {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Logf("crdbwork dashboard's stderr: %s", stderr.String())
		}
	})
	line := await.Recv(t, "crdbwork dashboard to print its address", lines)
	var v struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil || v.URL == "" {
		t.Fatalf("crdbwork dashboard printed %q (%v)", line, err)
	}
	up = true
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
	t.Parallel()
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

// hostStatus sends a GET to url with host as its Host header.
func hostStatus(t *testing.T, url, host string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", url, nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDashboardCommandHosts: crdbwork dashboard answers its loopback names,
// the address it listens on and the names given with --allow-host, and
// refuses any other Host with 403 (DNS rebinding: before, a page of
// attacker.example pointed at 127.0.0.1 was served). Listening on every
// address, it answers each address of this machine. A --allow-host that
// cannot be a host is a usage error.
func TestDashboardCommandHosts(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	d.enqueue(t, "mail", 1)
	u := startDashboard(t, d.env, "--allow-host", "ops.example.com,*.corp.example", "--allow-host", "10.9.8.7:7433")
	parsed, err := neturl.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	port := parsed.Port()
	for host, code := range map[string]int{
		"127.0.0.1:" + port:            http.StatusOK,
		"localhost:" + port:            http.StatusOK,
		"[::1]:" + port:                http.StatusOK,
		"ops.example.com":              http.StatusOK,
		"a.corp.example:" + port:       http.StatusOK,
		"10.9.8.7:7433":                http.StatusOK,
		"10.9.8.7:" + port:             http.StatusForbidden,
		"attacker.example:" + port:     http.StatusForbidden,
		"attacker.example":             http.StatusForbidden,
		"ops.example.com.evil.example": http.StatusForbidden,
	} {
		if got := hostStatus(t, u+"item?id=00000000-0000-0000-0000-000000000000", host); got != code && !(code == http.StatusOK && got == http.StatusNotFound) {
			t.Errorf("GET with Host %q: %d, want %d", host, got, code)
		}
		if got := hostStatus(t, u, host); got != code {
			t.Errorf("GET / with Host %q: %d, want %d", host, got, code)
		}
	}

	// Listening on every address: this machine's addresses are its own.
	all := startDashboard(t, d.env, "--addr", "0.0.0.0:0", "--allow-remote-without-auth")
	parsed, err = neturl.Parse(all)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			if got := hostStatus(t, all, net.JoinHostPort(n.IP.String(), parsed.Port())); got != http.StatusOK {
				t.Errorf("listening on 0.0.0.0: GET / with Host %s: %d, want 200", n.IP, got)
			}
		}
	}
	if got := hostStatus(t, all, "attacker.example:"+parsed.Port()); got != http.StatusForbidden {
		t.Errorf("listening on 0.0.0.0: GET / with Host attacker.example: %d, want 403", got)
	}

	want(t, d.env, 2, []string{"allowed host"}, "dashboard", "--addr", "127.0.0.1:0", "--allow-host", "http://ops.example.com")
	want(t, d.env, 2, []string{"allow-host"}, "dashboard", "--addr", "127.0.0.1:0", "--allow-host", "a,,b")
}
