package testdb

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a test database until Cut: then it drops
// every open connection and refuses new ones until Restore. It is what a
// client sees when the database server, or the network to it, goes away —
// a real fault for tests, with nothing mocked. Stall is the other kind of
// partition: connections stay open (and new ones are accepted) but no byte
// goes through until Restore, as when packets are silently dropped.
type Proxy struct {
	l      net.Listener
	target string
	url    string

	mu      sync.Mutex
	flowing *sync.Cond // signalled when a stall ends or a cut closes connections
	down    bool
	stalled bool
	conns   map[net.Conn]struct{}
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
	p.flowing = sync.NewCond(&p.mu)
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
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.down {
				p.flowing.Wait()
			}
			p.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil { // EOF, a reset or a cut: the pair is done
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
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
	p.flowing.Broadcast()
}

// Stall holds every byte in both directions, on open and new connections,
// until Restore (or Cut): the connections neither fail nor answer.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Restore accepts and forwards connections again after Cut or Stall.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down, p.stalled = false, false
	p.flowing.Broadcast()
	p.mu.Unlock()
}
