// Package faultproxy is a TCP proxy for fault tests in front of a
// PostgreSQL-protocol server (PostgreSQL or CockroachDB). It injects real
// network faults, nothing mocked:
//
//   - Cut drops every connection and refuses new ones until Restore: what a
//     client sees when the server or the network to it goes away.
//   - Stall holds every answer of the server, on open and new connections,
//     until Restore (or Cut): a partition where nothing fails and nothing
//     answers.
//   - Rules act on the statement a client sends, matched by its SQL text
//     (simple and extended protocol, prepared statements included): drop the
//     connection before the statement reaches the server (it never runs),
//     or forward it and drop the connection before the server's answer comes
//     back (it ran — a COMMIT committed — and the client cannot know), and
//     optionally cut every connection for a while from that moment; or
//     answer it with CockroachDB's SQLSTATE 40003 ("result is ambiguous")
//     whether it ran (AmbiguousForward) or not (AmbiguousDrop).
//   - DropCancels drops the cancel requests clients send: a client that
//     gives up on a statement (its context ended) finds it run all the
//     same, as when its cancel request comes too late.
//
// The proxy reads the client's messages to find the statements; it does not
// support TLS (use sslmode=disable).
package faultproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Action is what a Rule does to the connection that sent a matching
// statement.
type Action int

const (
	// DropStatement closes the connection instead of forwarding the
	// statement: the server never runs it.
	DropStatement Action = iota + 1
	// DropAnswer forwards the statement and closes the connection when the
	// server's answer starts to come back, without passing it on: the
	// statement ran, the client gets a broken connection.
	DropAnswer
	// Pass forwards the statement untouched (use it with Rule.Outage to cut
	// every connection right after the statement was sent).
	Pass
	// AmbiguousForward forwards the statement, swallows the server's
	// answer and answers the client with SQLSTATE 40003 ("result is
	// ambiguous"), as CockroachDB does when it cannot tell whether a
	// COMMIT took effect: the statement ran (a COMMIT committed, unless
	// the server refused it), the connection stays usable and idle, and
	// the client cannot know. Only statements sent with the simple
	// protocol match it (pgx sends COMMIT so); Outage is ignored.
	AmbiguousForward
	// AmbiguousDrop sends ROLLBACK to the server in the statement's place
	// and answers the client with SQLSTATE 40003: the statement (a COMMIT)
	// did not take effect, the connection stays usable and idle, and the
	// client cannot know. Only statements sent with the simple protocol
	// match it; Outage is ignored.
	AmbiguousDrop
)

// AmbiguousCode is the SQLSTATE of the answer of AmbiguousForward and
// AmbiguousDrop (CockroachDB's "result is ambiguous").
const AmbiguousCode = "40003"

// Rule is a fault triggered by a statement.
type Rule struct {
	// Match reports whether the statement's SQL text triggers the rule. It
	// is called from the proxy's goroutines.
	Match func(sql string) bool
	// Action is what happens to the connection.
	Action Action
	// Outage, if positive, cuts every connection when the rule fires and
	// refuses new ones for this long.
	Outage time.Duration
	// Times is how many times the rule fires before it is disarmed; 0 means
	// once.
	Times int
}

// IsCommit matches a COMMIT statement (what pgx sends for Tx.Commit).
func IsCommit(sql string) bool {
	s := strings.TrimRight(strings.TrimSpace(sql), ";")
	return strings.EqualFold(s, "commit") || strings.EqualFold(s, "commit transaction")
}

// Contains returns a Match function for statements whose text contains sub,
// ignoring case.
func Contains(sub string) func(string) bool {
	sub = strings.ToLower(sub)
	return func(sql string) bool { return strings.Contains(strings.ToLower(sql), sub) }
}

// Proxy forwards TCP connections to a server and injects faults. Its
// methods are safe for concurrent use.
type Proxy struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	flowing *sync.Cond // broadcast when a stall ends, or a cut or Close ends the connections
	down    bool
	stalled bool
	closed  bool
	// connectDelay holds each new connection this long before it is
	// forwarded (DelayConnects).
	connectDelay time.Duration
	// dropCancels: cancel requests are dropped (DropCancels).
	dropCancels bool
	conns       map[*conn]struct{}
	rules       []*armed
	wg          sync.WaitGroup

	fired atomic.Int64
	// cancelsDropped counts the cancel requests dropped (DropCancels).
	cancelsDropped atomic.Int64
}

type armed struct {
	Rule
	left  int
	fired chan struct{} // closed when the rule first fires
}

// New starts a proxy on 127.0.0.1 (a port chosen by the kernel) that
// forwards to target ("host:port"). Close it when done.
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{l: l, target: target, conns: map[*conn]struct{}{}}
	p.flowing = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// ForURL starts a proxy in front of the server of a postgres:// URL and
// returns it with the same URL pointing at the proxy.
func ForURL(dbURL string) (*Proxy, string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, "", fmt.Errorf("faultproxy: parse database URL: %w", err)
	}
	if u.Hostname() == "" || u.Port() == "" || strings.HasPrefix(u.Hostname(), "/") {
		return nil, "", fmt.Errorf("faultproxy: the database URL names no TCP host and port (%q)", u.Host)
	}
	p, err := New(u.Host)
	if err != nil {
		return nil, "", err
	}
	u.Host = p.Addr()
	return p, u.String(), nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Fired counts the rule firings so far.
func (p *Proxy) Fired() int64 { return p.fired.Load() }

// Arm adds a rule and returns a channel closed when it first fires.
func (p *Proxy) Arm(r Rule) <-chan struct{} {
	if r.Times <= 0 {
		r.Times = 1
	}
	a := &armed{Rule: r, left: r.Times, fired: make(chan struct{})}
	p.mu.Lock()
	p.rules = append(p.rules, a)
	p.mu.Unlock()
	return a.fired
}

// Disarm removes every rule that has not fired its last time.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	p.rules = nil
	p.mu.Unlock()
}

// Cut drops every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.down = true
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.flowing.Broadcast()
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Stall holds the server's answers on every connection, open or new, until
// Restore or Cut: clients wait, nothing fails.
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// Restore accepts connections again after Cut, and lets answers through
// again after Stall.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.down, p.stalled = false, false
	p.flowing.Broadcast()
	p.mu.Unlock()
}

// CutFor cuts every connection, and restores the proxy after d (in the
// background; it returns at once).
func (p *Proxy) CutFor(d time.Duration) {
	p.Cut()
	time.AfterFunc(d, p.Restore)
}

// DelayConnects holds every new connection d before forwarding it (0:
// none), as a server whose CPU is saturated is slow to start the backend
// of each new connection: the client's connect takes d longer, and the
// connections already open are not slowed.
func (p *Proxy) DelayConnects(d time.Duration) {
	p.mu.Lock()
	p.connectDelay = d
	p.mu.Unlock()
}

// DropCancels makes the proxy drop every cancel request a client sends
// (on: true) instead of forwarding it, until DropCancels(false). A cancel
// request is the client's only way to stop a statement it sent: pgx sends
// one when a context ends while it waits for an answer, closes the
// connection and returns at once, and the server may finish the statement
// before the request arrives, or after the client has moved on (a request
// that comes too late, or is lost, is ignored). With cancels dropped, a
// statement the client gave up on runs to its end — a COMMIT commits —
// while the client goes on as if it had not.
func (p *Proxy) DropCancels(on bool) {
	p.mu.Lock()
	p.dropCancels = on
	p.mu.Unlock()
}

// CancelsDropped counts the cancel requests dropped so far (DropCancels).
func (p *Proxy) CancelsDropped() int64 { return p.cancelsDropped.Load() }

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.l.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, delay := p.down || p.closed, p.connectDelay
		p.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		if delay <= 0 {
			p.open(c)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			time.Sleep(delay)
			p.open(c)
		}()
	}
}

// open forwards the client connection c to the server.
func (p *Proxy) open(c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		c.Close()
		return
	}
	pc := &conn{client: c, server: s, closed: make(chan struct{})}
	p.mu.Lock()
	if p.down || p.closed { // cut while dialling
		p.mu.Unlock()
		pc.close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(2)
	go p.fromClient(pc)
	go p.fromServer(pc)
}

// conn is one proxied connection.
type conn struct {
	client, server net.Conn
	dropAnswer     atomic.Bool
	// ambiguous: the server's next answer (up to its ReadyForQuery) is
	// swallowed and replaced by a 40003 error (AmbiguousForward,
	// AmbiguousDrop).
	ambiguous atomic.Bool
	once      sync.Once
	closed    chan struct{} // closed by close
}

func (c *conn) close() {
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
		close(c.closed)
	})
}

func (p *Proxy) forget(c *conn) {
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// fromServer copies the server's bytes to the client, unless an answer is
// to be dropped or replaced.
func (p *Proxy) fromServer(c *conn) {
	defer p.wg.Done()
	defer p.forget(c)
	buf := make([]byte, 32<<10)
	var swallowed []byte // an answer being replaced (c.ambiguous), so far
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			if c.dropAnswer.Load() {
				return
			}
			out := buf[:n]
			if c.ambiguous.Load() {
				// The answer starts at a message boundary: the client
				// sent the statement after it had read every earlier
				// answer (a simple-protocol query: nothing was pending).
				swallowed = append(swallowed, out...)
				var done bool
				if out, done = replaceAnswer(&swallowed); done {
					c.ambiguous.Store(false)
				}
			}
			if len(out) > 0 {
				p.mu.Lock()
				for p.stalled && !p.down && !p.closed {
					p.flowing.Wait()
				}
				p.mu.Unlock()
				if _, werr := c.client.Write(out); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// replaceAnswer reads the server's messages buffered in *b: once a
// ReadyForQuery is among them it returns the 40003 answer that replaces
// them (followed by whatever came after it) and done; until then nothing,
// keeping the partial answer in *b.
func replaceAnswer(b *[]byte) (out []byte, done bool) {
	for off := 0; len(*b)-off >= 5; {
		typ := (*b)[off]
		n := int(binary.BigEndian.Uint32((*b)[off+1:]))
		if n < 4 || len(*b)-off < 1+n {
			return nil, false
		}
		off += 1 + n
		if typ == 'Z' {
			out = append(ambiguousAnswer(), (*b)[off:]...)
			*b = nil
			return out, true
		}
	}
	return nil, false
}

// ambiguousAnswer is an ErrorResponse with SQLSTATE 40003 followed by
// ReadyForQuery (idle): what CockroachDB answers to a COMMIT whose outcome
// it cannot know.
func ambiguousAnswer() []byte {
	var body []byte
	for _, f := range []struct {
		code byte
		val  string
	}{
		{'S', "ERROR"}, {'V', "ERROR"}, {'C', AmbiguousCode},
		{'M', "result is ambiguous (injected by faultproxy: the statement may or may not have taken effect)"},
	} {
		body = append(body, f.code)
		body = append(append(body, f.val...), 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(4+len(body)))
	msg = append(msg, body...)
	return append(msg, 'Z', 0, 0, 0, 5, 'I')
}

// rollbackQuery is the simple-protocol query that AmbiguousDrop sends in
// place of the statement.
func rollbackQuery() []byte {
	msg := []byte{'Q', 0, 0, 0, 0}
	msg = append(append(msg, "ROLLBACK"...), 0)
	binary.BigEndian.PutUint32(msg[1:], uint32(len(msg)-1))
	return msg
}

// Protocol codes of the untyped first messages.
const (
	sslRequest    = 80877103
	gssencRequest = 80877104
	cancelRequest = 80877102
)

// maxMessage bounds one client message (a guard against a misparse).
const maxMessage = 1 << 30

// fromClient forwards the client's messages one by one, applying the rules
// to the statements they carry.
func (p *Proxy) fromClient(c *conn) {
	defer p.wg.Done()
	defer p.forget(c)
	r := bufio.NewReaderSize(c.client, 32<<10)
	// Startup phase: untyped messages (length, code, body).
	for {
		msg, err := readUntyped(r)
		if err != nil {
			return
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code == cancelRequest {
			p.mu.Lock()
			drop := p.dropCancels
			p.mu.Unlock()
			if drop {
				p.cancelsDropped.Add(1)
				return
			}
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
		if code == cancelRequest {
			return
		}
		if code != sslRequest && code != gssencRequest {
			break
		}
	}
	prepared := map[string]string{} // statement name -> SQL
	portals := map[string]string{}  // portal name -> SQL
	for {
		typ, msg, err := readTyped(r)
		if err != nil {
			return
		}
		body := msg[5:]
		var sql string
		switch typ {
		case 'Q':
			sql = cstring(body, 0)
		case 'P':
			name := cstring(body, 0)
			prepared[name] = cstring(body, len(name)+1)
		case 'B':
			portal := cstring(body, 0)
			stmt := cstring(body, len(portal)+1)
			portals[portal] = prepared[stmt]
		case 'E':
			sql = portals[cstring(body, 0)]
		case 'C': // Close statement or portal
			if len(body) > 0 {
				if body[0] == 'S' {
					delete(prepared, cstring(body, 1))
				} else {
					delete(portals, cstring(body, 1))
				}
			}
		case 'X':
			_, _ = c.server.Write(msg)
			return
		}
		if sql != "" {
			if rule := p.match(sql, typ == 'Q'); rule != nil {
				if !p.apply(c, rule, msg) {
					return
				}
				continue
			}
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
	}
}

// apply does what rule says to the connection c that sent msg, and reports
// whether the connection goes on.
func (p *Proxy) apply(c *conn, rule *armed, msg []byte) bool {
	switch rule.Action {
	case DropStatement:
		if rule.Outage > 0 {
			p.CutFor(rule.Outage)
		}
		return false
	case DropAnswer:
		c.dropAnswer.Store(true)
		if _, err := c.server.Write(msg); err != nil {
			return false
		}
		if rule.Outage > 0 {
			// The outage starts once the answer was dropped (the connection
			// closed): the statement ran, nothing came back.
			go func() {
				<-c.closed
				p.CutFor(rule.Outage)
			}()
		}
		return true
	case AmbiguousForward, AmbiguousDrop:
		c.ambiguous.Store(true)
		if rule.Action == AmbiguousDrop {
			msg = rollbackQuery()
		}
		if _, err := c.server.Write(msg); err != nil {
			return false
		}
		return true
	default: // Pass
		if _, err := c.server.Write(msg); err != nil {
			return false
		}
		if rule.Outage > 0 {
			p.CutFor(rule.Outage)
			return false
		}
		return true
	}
}

// match returns the first armed rule matching sql, counting the firing, or
// nil. simple says whether sql came in a simple-protocol query, the only
// kind the ambiguous actions apply to.
func (p *Proxy) match(sql string, simple bool) *armed {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, a := range p.rules {
		if (a.Action == AmbiguousForward || a.Action == AmbiguousDrop) && !simple {
			continue
		}
		if !a.Match(sql) {
			continue
		}
		if a.left == a.Times {
			close(a.fired)
		}
		a.left--
		if a.left == 0 {
			p.rules = append(p.rules[:i:i], p.rules[i+1:]...)
		}
		p.fired.Add(1)
		return a
	}
	return nil
}

func readUntyped(r *bufio.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > maxMessage {
		return nil, errors.New("faultproxy: bad startup message length")
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

func readTyped(r *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n < 4 || n > maxMessage {
		return 0, nil, errors.New("faultproxy: bad message length")
	}
	msg := make([]byte, 1+n)
	copy(msg, hdr[:])
	_, err := io.ReadFull(r, msg[5:])
	return hdr[0], msg, err
}

// cstring returns the NUL-terminated string at b[off:].
func cstring(b []byte, off int) string {
	if off >= len(b) {
		return ""
	}
	b = b[off:]
	for i, x := range b {
		if x == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
