package testdb

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a test database until Cut: then it drops
// every open connection and refuses new ones until Restore. It is what a
// client sees when the database server, or the network to it, goes away —
// a real fault for tests, with nothing mocked.
type Proxy struct {
	l      net.Listener
	target string
	url    string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

// NewProxy starts a proxy in front of the server of dbURL (a URL from New's
// pool config or NewURL) and returns it; URL is dbURL through the proxy. The
// proxy stops when the test ends. A server on a Unix socket cannot be
// proxied: the test fails.
func NewProxy(t testing.TB, dbURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testdb: proxy: parse %q: %v", dbURL, err)
	}
	if u.Host == "" || u.Hostname() == "" {
		t.Fatalf("testdb: proxy: %q names no TCP host", dbURL)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: proxy: %v", err)
	}
	p := &Proxy{l: l, target: u.Host, conns: map[net.Conn]struct{}{}}
	u.Host = l.Addr().String()
	p.url = u.String()
	t.Cleanup(func() { l.Close(); p.Cut() })
	go p.serve()
	return p
}

// URL returns the database URL through the proxy.
func (p *Proxy) URL() string { return p.url }

func (p *Proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.down { // cut while dialling
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// Cut drops every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Restore accepts connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}
