package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/cli"
)

// DefaultDashboardAddr is where crdbwork dashboard listens by default:
// this machine only.
const DefaultDashboardAddr = "127.0.0.1:7433"

// passwordVar is the environment variable of the dashboard's basic-auth
// password (not a flag: a command line is visible to every user of the
// machine).
const passwordVar = "CRDBWORK_DASHBOARD_PASSWORD"

func cmdDashboard(ctx context.Context, name string, args []string, out *cli.Console) error {
	var g globals
	var addr, user, passwordFile string
	var readOnly, openRemote bool
	var refresh time.Duration
	f := prog.NewFlagSet(name, `Serves the live web dashboard of every queue (package dashboard) at --addr
until interrupted: queues, sessions and parts, items and dead items, tenants,
and the actions (requeue, cancel, delete dead items, pause and resume, limits
and parts), each confirmed in the page and recorded in the audit list.

Safe by default: it listens on `+DefaultDashboardAddr+` (this machine only). It
refuses an address other machines can reach unless basic auth is on (a
password in `+passwordVar+` or --auth-password-file) or
--allow-remote-without-auth is given. Basic auth over plain HTTP sends the
password readable: put a TLS proxy in front for remote use. --read-only
refuses every action. It answers only requests for the names it serves
(403 otherwise, a guard against DNS rebinding): loopback names and
addresses, the address it listens on (every address of this machine when it
listens on all of them), and the names given with --allow-host, such as the
name a proxy in front of it passes on. With --json it prints {"url": ...}
once it listens.`)
	f.StringVar(&g.databaseURL, "database-url", "", "URL", cli.URLUsage, nil)
	f.StringVar(&g.schema, "schema", "", "NAME", "schema of the crdbwork tables (default: the connection's search path)", nil)
	f.StringVar(&g.prefix, "prefix", "", "PREFIX", "prefix of the crdbwork tables, in place of crdbwork_", nil)
	f.BoolVar(&g.json, "json", false, "print the address as JSON on stdout once listening")
	f.StringVar(&addr, "addr", DefaultDashboardAddr, "HOST:PORT", "the address to listen on (port 0: any free port)", nil)
	f.BoolVar(&readOnly, "read-only", false, "show everything, change nothing: every action is refused")
	f.StringVar(&user, "auth-user", "admin", "NAME", "the basic-auth user name (with a password)", nil)
	f.StringVar(&passwordFile, "auth-password-file", "", "FILE", "a file holding the basic-auth password (else "+passwordVar+"; none: no auth)", nil)
	f.BoolVar(&openRemote, "allow-remote-without-auth", false, "listen on an address other machines can reach without basic auth")
	var allowHosts hostList
	f.Add(&allowHosts, "allow-host", "NAME[:PORT]", "also answer requests for this host name or address (repeat, or separate with commas; *.DOMAIN for the names under DOMAIN)")
	f.FlagOnly("allow-remote-without-auth")
	f.DurationVar(&refresh, "refresh", dashboard.DefaultRefresh, false, "how often the pages update")
	if err := f.Parse(args, out.Stdout()); err != nil {
		return err
	}
	password := os.Getenv(passwordVar)
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return f.UsageError("--auth-password-file: %v", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
		if password == "" {
			return f.UsageError("--auth-password-file: %s is empty", passwordFile)
		}
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return f.UsageError("--addr %q: %v", addr, err)
	}
	if password == "" && !openRemote && !loopback(ctx, host) {
		return &cli.ExitError{Code: 2, Msg: fmt.Sprintf("refused: %s can be reached from other machines, and basic auth is off", addr),
			Hint: "set " + passwordVar + " (or --auth-password-file), listen on 127.0.0.1, or give --allow-remote-without-auth"}
	}
	if refresh < 100*time.Millisecond {
		return f.UsageError("--refresh %v is below 100ms", refresh)
	}
	pool, err := g.open(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return cli.Failf(1, "listening on %s: %v", addr, err)
	}
	defer ln.Close()
	served, err := listenHosts(host, ln.Addr())
	if err != nil {
		return cli.Failf(1, "listing the addresses of this machine: %v", err)
	}
	opts := dashboard.Options{Tables: g.tables(), ReadOnly: readOnly, Refresh: refresh, AllowedHosts: append(served, allowHosts...)}
	if password != "" {
		opts.Auth = func(r *http.Request) (string, bool) {
			u, _, _ := r.BasicAuth()
			return u, true // checked by basicAuth before
		}
	}
	h, err := dashboard.New(pool, opts)
	if err != nil {
		return f.UsageError("%v", err)
	}
	if password != "" {
		h = basicAuth(h, user, password)
	}
	url := "http://" + ln.Addr().String() + "/"
	if g.json {
		if err := cli.PrintJSON(out, map[string]any{"url": url, "read_only": readOnly, "basic_auth": password != ""}); err != nil {
			return err
		}
	} else {
		mode := ""
		if readOnly {
			mode = ", read-only"
		}
		if password != "" {
			mode += ", basic auth as " + user
		}
		out.Printf("crdbwork dashboard: serving %s%s (Ctrl-C stops)\n", url, mode)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return cli.Failf(1, "serving: %v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return cli.Failf(1, "stopping: %v", err)
	}
	return nil
}

// hostList is a flag of host names, repeated or separated by commas.
type hostList []string

func (l *hostList) String() string { return strings.Join(*l, ",") }

func (l *hostList) Set(s string) error {
	for _, h := range strings.Split(s, ",") {
		if h = strings.TrimSpace(h); h == "" {
			return errors.New("an empty host name")
		}
		*l = append(*l, h)
	}
	return nil
}

// listenHosts returns the hosts a dashboard listening at ln (asked for as
// host) answers besides the loopback ones, which it always answers: the
// host it was told to listen on, with the port it got, or every address
// of this machine when it listens on all of them.
func listenHosts(host string, ln net.Addr) ([]string, error) {
	tcp, ok := ln.(*net.TCPAddr)
	if !ok {
		return nil, fmt.Errorf("not a TCP address: %v", ln)
	}
	port := fmt.Sprint(tcp.Port)
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() {
			out = append(out, net.JoinHostPort(n.IP.String(), port))
		}
	}
	return out, nil
}

// loopback reports whether host names this machine only: a loopback
// address, or a name all of whose addresses are.
func loopback(ctx context.Context, host string) bool {
	if host == "" {
		return false // every interface
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// basicAuth lets through the requests with user's name and password (each
// compared in constant time, as hashes), and answers the others 401 with a
// challenge.
func basicAuth(h http.Handler, user, password string) http.Handler {
	wantU, wantP := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		gotU, gotP := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
		if !ok || subtle.ConstantTimeCompare(gotU[:], wantU[:])&subtle.ConstantTimeCompare(gotP[:], wantP[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="crdbwork dashboard", charset="UTF-8"`)
			http.Error(w, "not authorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
