package dashboard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// hosts decides which Host headers the dashboard answers (Options.
// AllowedHosts). A browser sends the name in its address bar as the Host,
// and treats a page and the addresses of its own name as one origin: a
// page of another site whose name is then made to resolve to this machine
// (DNS rebinding) reaches a dashboard on a loopback address with that
// site's name as the Host, reads its pages, and gets a cookie and CSRF
// token that are valid for it. Answering only the names the dashboard is
// reached by closes that way in; loopback names cannot be rebound (the
// browser resolves them itself), nor can addresses.
type hosts struct {
	any bool
	// names are allowed with any port; exact are host:port pairs;
	// suffixes (".example.com", from "*.example.com") allow the names
	// under them with any port. All lower case, addresses in their
	// canonical form.
	names, exact map[string]bool
	suffixes     []string
}

// newHosts parses the entries of Options.AllowedHosts.
func newHosts(entries []string) (hosts, error) {
	h := hosts{names: map[string]bool{}, exact: map[string]bool{}}
	for _, e := range entries {
		if e == "*" {
			h.any = true
			continue
		}
		host, port, err := splitHost(e)
		if err != nil || host == "" || strings.ContainsAny(host, "/ \t@*") && !strings.HasPrefix(host, "*.") {
			return hosts{}, fmt.Errorf("dashboard: allowed host %q: want a name or address, with an optional :port, \"*.\" and a domain, or \"*\"", e)
		}
		switch {
		case strings.HasPrefix(host, "*."):
			if port != "" || strings.ContainsAny(host[2:], "/ \t@*:") || host[2:] == "" {
				return hosts{}, fmt.Errorf("dashboard: allowed host %q: a name under a domain (\"*.example.com\") takes no port", e)
			}
			h.suffixes = append(h.suffixes, host[1:])
		case port != "":
			h.exact[net.JoinHostPort(host, port)] = true
		default:
			h.names[host] = true
		}
	}
	return h, nil
}

// splitHost splits a Host header value or an allowed host into its host,
// lower case (an address in its canonical form, without brackets), and its
// port ("" when it has none). A bracketed IPv6 address may have a port; an
// unbracketed one has none.
func splitHost(s string) (host, port string, err error) {
	s = strings.ToLower(s)
	switch {
	case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
		host = s[1 : len(s)-1]
	case strings.HasPrefix(s, "["), strings.Count(s, ":") == 1:
		if host, port, err = net.SplitHostPort(s); err != nil {
			return "", "", err
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return "", "", fmt.Errorf("bad port %q", port)
		}
	default:
		host = s // a name, an IPv4 address, or an unbracketed IPv6 one
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().WithZone("").String()
	} else if strings.Contains(host, ":") {
		return "", "", fmt.Errorf("bad address %q", host)
	}
	return host, port, nil
}

// loopbackHost reports whether host (as splitHost returns it) names this
// machine's loopback interface: "localhost", a name under it, or a
// loopback address.
func loopbackHost(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// allows reports whether the dashboard answers a request with Host hostport.
func (h hosts) allows(hostport string) bool {
	if h.any {
		return true
	}
	host, port, err := splitHost(hostport)
	if err != nil || host == "" {
		return false
	}
	if loopbackHost(host) || h.names[host] || (port != "" && h.exact[net.JoinHostPort(host, port)]) {
		return true
	}
	for _, s := range h.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// refuseHost answers a request whose Host the dashboard does not serve.
func refuseHost(w http.ResponseWriter, r *http.Request) {
	http.Error(w, fmt.Sprintf("refused: the dashboard does not answer to the host %q (a guard against DNS rebinding): "+
		"reach it by a name it serves, or allow this one (Options.AllowedHosts of package dashboard)", r.Host),
		http.StatusForbidden)
}
