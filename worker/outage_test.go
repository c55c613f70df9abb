package worker_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// proxy forwards TCP connections to a database server until cut: then it
// drops every open connection and refuses new ones until restored, which
// is what a worker sees when the database (or the network to it) goes away.
type proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { l.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *proxy) serve() {
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
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// cut drops every connection and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *proxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// A database that goes away for longer than the session expiry, under load:
// the workers lose their sessions, keep retrying, start new sessions when it
// is back, and every item is still recorded exactly once, each by a session
// that owned its part.
func TestDatabaseOutage(t *testing.T) {
	const n = 3000
	direct := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, direct, crsql.Tables{}, "default", 16); err != nil {
		t.Fatal(err)
	}
	enqueue(t, direct, "default", n, true)

	cfg := direct.Config()
	if cfg.ConnConfig.Host == "" || cfg.ConnConfig.Host[0] == '/' {
		t.Skipf("the database is on a Unix socket (%q); the outage proxy needs TCP", cfg.ConnConfig.Host)
	}
	p := newProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, fmtPort(cfg.ConnConfig.Port)))
	u, err := url.Parse(cfg.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.l.Addr().String()
	proxied, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)

	var workers []*running
	for range 2 {
		workers = append(workers, start(t, proxied, recordHandler(2*time.Millisecond), worker.Options{
			Parts: 16, Concurrency: 8, RestartDelay: 200 * time.Millisecond,
			Partition: partition.Options{Poll: 200 * time.Millisecond},
		}))
	}
	waitFor(t, "some items to be done", time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM results`) >= n/5
	})
	p.cut()
	outage := 3 * fastSession.Expiry
	time.Sleep(outage) // the outage itself, not a wait for a condition
	p.restore()
	t.Logf("database unreachable for %v", outage)

	waitFor(t, "the queue to drain after the outage", 2*time.Minute, func() bool {
		return count(t, direct, `SELECT count(*) FROM crdbwork_items`) == 0
	})
	var lost int64
	for _, r := range workers {
		r.Stop(t)
		lost += r.w.Stats().SessionsLost
	}
	assertExactlyOnce(t, direct, n)
	if bad := count(t, direct, `SELECT count(*) FROM results WHERE NOT owned`); bad != 0 {
		t.Errorf("%d results recorded by a session that did not own the item's part", bad)
	}
	if lost == 0 {
		t.Error("no session was lost: the outage did not reach the workers")
	}
	t.Logf("sessions lost: %d", lost)
}

func fmtPort(p uint16) string { return strconv.Itoa(int(p)) }
