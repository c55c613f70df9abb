package claim_test

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
)

// cockroachMessageLimit is CockroachDB's default bound on one protocol
// message (sql.conn.max_read_buffer_message_size, 16 MiB).
const cockroachMessageLimit = 16 << 20

// TestEnqueueMessagesStayUnderCockroachLimit enqueues one batch whose
// keys and tenants alone exceed 16 MiB (5,000 items with keys and tenants
// of MaxKeyLength bytes and tiny payloads), through connections that measure every
// protocol message the client sends: none may exceed CockroachDB's default
// bound, which PostgreSQL does not have (so only the measurement can see
// it here). Every item must be enqueued.
func TestEnqueueMessagesStayUnderCockroachLimit(t *testing.T) {
	t.Parallel()
	url := setupURL(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	// Plain text, so that the counting connection reads the messages.
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	var biggest maxSize
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, max: &biggest}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := newQueue(t, pool, claim.Options{})
	const n = 5000
	items := make([]claim.NewItem, n)
	for i := range items {
		// Caller-given ids: the INSERT path (generated ids may go by COPY).
		tenant := strings.Repeat(string(rune('a'+i%26)), claim.MaxKeyLength-8) + uuid.NewString()[:8]
		items[i] = claim.NewItem{ID: uuid.New(), Payload: []byte("x"), Tenant: tenant, Key: "k" + tenant[1:]}
	}
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if res.Added() != n {
		t.Fatalf("added %d items, want %d", res.Added(), n)
	}
	var count int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE length(tenant) = $1`, claim.MaxKeyLength).Scan(&count); err != nil || count != n {
		t.Fatalf("%d items with their tenants in the table (%v), want %d", count, err, n)
	}
	got := biggest.get()
	t.Logf("the biggest message sent was %d bytes (CockroachDB's default bound: %d)", got, cockroachMessageLimit)
	if got > cockroachMessageLimit {
		t.Fatalf("a protocol message of %d bytes was sent: CockroachDB refuses messages over %d bytes by default", got, cockroachMessageLimit)
	}
	if got < 1<<20 {
		t.Fatalf("the biggest message sent was %d bytes: the connection did not measure the enqueue", got)
	}
}

// maxSize is the largest message seen, shared by the connections.
type maxSize struct {
	mu sync.Mutex
	n  int
}

func (m *maxSize) see(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n = max(m.n, n)
}

func (m *maxSize) get() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// countingConn parses the frontend messages written through it and records
// the length of the largest. The first message (the startup message) has no
// type byte; every later one is a type byte and a length word that counts
// itself and the body.
type countingConn struct {
	net.Conn
	max     *maxSize
	started bool
	head    []byte // the header read so far of the current message
	left    int    // bytes of the current message's body still to come
}

func (c *countingConn) Write(b []byte) (int, error) {
	for p := b; len(p) > 0; {
		if c.left > 0 {
			k := min(c.left, len(p))
			c.left -= k
			p = p[k:]
			continue
		}
		headLen := 5
		if !c.started {
			headLen = 4
		}
		k := min(headLen-len(c.head), len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
		if len(c.head) < headLen {
			continue
		}
		size := int(binary.BigEndian.Uint32(c.head[headLen-4:]))
		c.max.see(size)
		c.left = size - 4
		c.head, c.started = c.head[:0], true
	}
	return c.Conn.Write(b)
}
