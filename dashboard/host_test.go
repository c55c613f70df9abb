package dashboard_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// TestForgedHostIsRefused is a DNS rebinding attack on a dashboard served
// on a loopback address without auth: a page of attacker.example, whose
// name the attacker then points at 127.0.0.1, talks to the dashboard as
// its own origin, with attacker.example as the Host. Its reads (an item's
// payload, the pages, the static files) are refused with 403, so it gets
// no CSRF token; and its actions (a cancel, a pause) are refused too, even
// with the browser's same-origin headers and a cookie and token of the
// dashboard's own. Nothing changes. (Before, the page and the item's
// payload were served, and a cancel with the token of that page went
// through.) The dashboard's own names still work: 127.0.0.1, localhost and
// [::1], with the server's port or another (a tunnel's), or none.
func TestForgedHostIsRefused(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ids := enqueue(t, pool, "mail", 2, func(i int, it *claim.NewItem) { it.Payload = []byte(`{"secret":"s3cret"}`) })
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	own := newBrowser(t, srv.URL)
	ownToken := own.token() // a genuine cookie and token of the dashboard
	ownCookie := own.c.Jar.Cookies(u)[0]
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1.attacker.example:" + port, "localhost.attacker.example:" + port} {
		hdr := map[string]string{"Host": host}
		attacker := newBrowser(t, srv.URL) // the page of host: its cookies are host's
		for _, path := range []string{"/item?id=" + ids[0].String(), "/", "/queue?name=mail", "/items?queue=mail", "/sessions", "/audit", "/static/style.css"} {
			code, text, _ := attacker.do("GET", path, nil, hdr)
			if code != http.StatusForbidden || strings.Contains(text, "s3cret") || !strings.Contains(text, "AllowedHosts") {
				t.Errorf("GET %s with Host %q: %d %.300q; want 403 saying how to allow a host", path, host, code, text)
			}
		}
		// The attacker's page posts with the token of the page it read, if
		// it read one; then with the dashboard's own cookie and token.
		_, page, _ := attacker.do("GET", "/", nil, hdr)
		token := ownToken
		if m := tokenRE.FindStringSubmatch(page); m != nil {
			token = m[1]
		}
		sameOrigin := map[string]string{"Host": host, "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}
		withOwn := map[string]string{"Host": host, "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Cookie": ownCookie.String()}
		for _, c := range []struct {
			b     *browser
			token string
			hdr   map[string]string
		}{{attacker, token, sameOrigin}, {newBrowser(t, srv.URL), ownToken, withOwn}} {
			for _, form := range []url.Values{
				{"act": {"cancel"}, "queue": {"mail"}, "sel": {ids[0].String()}, "confirm": {"yes"}, "csrf": {c.token}},
				{"act": {"pause"}, "queue": {"mail"}, "confirm": {"yes"}, "csrf": {c.token}},
			} {
				if code, text, _ := c.b.do("POST", "/action", form, c.hdr); code != http.StatusForbidden || !strings.Contains(text, "AllowedHosts") {
					t.Errorf("POST %s with Host %q: %d %q; want 403 saying how to allow a host", form.Get("act"), host, code, text)
				}
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, ids[0]); n != 1 {
		t.Fatal("a request with a forged Host cancelled the item")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); n != 0 {
		t.Fatal("a request with a forged Host paused the queue")
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_audit`); n != 0 {
		t.Fatalf("%d actions audited after requests with a forged Host, want none", n)
	}

	// The dashboard's own names: pages, the payload, and actions.
	paused := false
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "LocalHost:" + port, "localhost", "127.0.0.1:8080", "[::1]:8080"} {
		hb := newBrowser(t, srv.URL)
		hdr := map[string]string{"Host": host}
		code, text, _ := hb.do("GET", "/item?id="+ids[1].String(), nil, hdr)
		if code != http.StatusOK || !strings.Contains(text, "s3cret") {
			t.Fatalf("GET the item with Host %q: %d; want 200 and its payload", host, code)
		}
		code, text, _ = hb.do("GET", "/", nil, hdr)
		m := tokenRE.FindStringSubmatch(text)
		if code != http.StatusOK || m == nil {
			t.Fatalf("GET / with Host %q: %d; want 200 and a token", host, code)
		}
		act := "pause"
		if paused {
			act = "resume"
		}
		form := url.Values{"act": {act}, "queue": {"mail"}, "confirm": {"yes"}, "csrf": {m[1]}}
		if code, text, _ := hb.do("POST", "/action", form, map[string]string{"Host": host, "Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}); code != http.StatusSeeOther {
			t.Fatalf("POST %s with Host %q: %d %s; want 303", act, host, code, text)
		}
		paused = !paused
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_queues WHERE paused`); (n == 1) != paused {
			t.Fatalf("after %s with Host %q: paused = %v", act, host, n == 1)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, ids[1]); n != 1 {
		t.Fatal("the reads removed the item")
	}
}

// TestAllowedHosts: the names an operator allows are served, with any
// port or the one given, and names under a domain with "*."; others are
// still refused; "*" serves every Host; entries that cannot be a host are
// refused by New.
func TestAllowedHosts(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{AllowedHosts: []string{"Ops.Example.com", "10.0.0.5:7433", "[fd00::5]:7433", "fd00::6", "*.corp.example"}})
	enqueue(t, pool, "mail", 1, nil)
	b := newBrowser(t, srv.URL)
	for host, want := range map[string]int{
		"ops.example.com":          http.StatusOK,
		"ops.example.com:8443":     http.StatusOK,
		"10.0.0.5:7433":            http.StatusOK,
		"[fd00::5]:7433":           http.StatusOK,
		"[fd00::6]:80":             http.StatusOK,
		"a.corp.example":           http.StatusOK,
		"a.b.corp.example:9000":    http.StatusOK,
		"localhost:1234":           http.StatusOK,
		"10.0.0.5:7434":            http.StatusForbidden,
		"10.0.0.5":                 http.StatusForbidden,
		"[fd00::5]:7434":           http.StatusForbidden,
		"corp.example":             http.StatusForbidden,
		"evilcorp.example":         http.StatusForbidden,
		"ops.example.com.evil.net": http.StatusForbidden,
		"example.com":              http.StatusForbidden,
	} {
		if code, text, _ := b.do("GET", "/", nil, map[string]string{"Host": host}); code != want {
			t.Errorf("GET / with Host %q: %d %q; want %d", host, code, text, want)
		}
	}
	_, any := setupOn(t, pool, dashboard.Options{AllowedHosts: []string{"*"}})
	if code, _, _ := newBrowser(t, any.URL).do("GET", "/", nil, map[string]string{"Host": "attacker.example"}); code != http.StatusOK {
		t.Errorf("AllowedHosts *: %d for any Host, want 200", code)
	}
	for _, bad := range []string{"", "http://ops.example.com", "ops.example.com/path", "ops example", "ops.example.com:99999", "*.corp.example:443", "*.", "a*b", "user@host", "[fd00::5", "fd00::5:7433x"} {
		if _, err := dashboard.New(pool, dashboard.Options{AllowedHosts: []string{bad}}); err == nil {
			t.Errorf("New accepted the allowed host %q", bad)
		}
	}
}
