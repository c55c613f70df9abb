package claim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// wire watches the PostgreSQL protocol on every connection of a pool: it
// records the largest message the client sent, and, when armed, lets the
// server run the next statement containing a trigger text but cuts the
// connection before its answer reaches the client.
type wire struct {
	mu      sync.Mutex
	maxMsg  int   // largest client message, in bytes
	sent    int64 // bytes the client sent
	trigger string
	armed   atomic.Bool
	cut     atomic.Int32 // connections cut
}

// pool returns a pool on a fresh database with the schema, whose
// connections go through w.
func (w *wire) pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &wireConn{Conn: c, w: w, out: msgSplitter{untyped: true}}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// arm makes the next client message that contains trigger run on the
// server and lose its answer.
func (w *wire) arm(trigger string) {
	w.mu.Lock()
	w.trigger = trigger
	w.mu.Unlock()
	w.armed.Store(true)
}

// largest returns the largest client message since the last call, and the
// bytes the client sent so far.
func (w *wire) largest() (int, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.maxMsg
	w.maxMsg = 0
	return m, w.sent
}

// msgSplitter follows message boundaries in one direction of the protocol:
// a type byte (except for the client's first message) and a 4-byte length
// that counts itself.
type msgSplitter struct {
	untyped bool // the next message has no type byte (the startup message)
	head    []byte
	left    int // bytes of the current message's body still to come
	typ     byte
}

// feed consumes p and calls done for each message whose header is complete
// (with its type and total length).
func (s *msgSplitter) feed(p []byte, done func(typ byte, length int)) {
	for len(p) > 0 {
		if s.left > 0 {
			n := min(s.left, len(p))
			s.left -= n
			p = p[n:]
			continue
		}
		need := 5
		if s.untyped {
			need = 4
		}
		n := min(need-len(s.head), len(p))
		s.head = append(s.head, p[:n]...)
		p = p[n:]
		if len(s.head) < need {
			return
		}
		length := int(binary.BigEndian.Uint32(s.head[need-4:]))
		s.typ = 0
		if !s.untyped {
			s.typ = s.head[0]
		}
		s.untyped = false
		s.head = s.head[:0]
		s.left = length - 4
		done(s.typ, length)
	}
}

type wireConn struct {
	net.Conn
	w       *wire
	out, in msgSplitter
	primed  bool // the triggering statement was seen
	muted   bool // the answer to the triggering statement is being dropped
}

func (c *wireConn) Write(p []byte) (int, error) {
	runs := false // p executes a statement (Execute, or a simple Query)
	c.w.mu.Lock()
	c.w.sent += int64(len(p))
	c.out.feed(p, func(typ byte, length int) {
		c.w.maxMsg = max(c.w.maxMsg, length)
		runs = runs || typ == 'E' || typ == 'Q'
	})
	trigger := c.w.trigger
	c.w.mu.Unlock()
	// The statement's text comes with its Parse, which pgx sends before
	// the Bind and Execute that run it.
	if trigger != "" && c.w.armed.Load() && bytes.Contains(bytes.ToUpper(p), []byte(trigger)) {
		c.primed = true
	}
	if c.primed && runs && c.w.armed.CompareAndSwap(true, false) {
		c.muted = true
	}
	return c.Conn.Write(p)
}

func (c *wireConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		ready := false
		c.in.feed(p[:n], func(typ byte, _ int) { ready = ready || typ == 'Z' })
		if !c.muted || n == 0 {
			return n, err
		}
		// Drop the answer; once the server says it is ready again (the
		// statement and its implicit or explicit commit are done), cut.
		if ready {
			c.w.cut.Add(1)
			c.Conn.Close()
			return 0, io.ErrUnexpectedEOF
		}
		if err != nil {
			return 0, err
		}
	}
}

func newWire() *wire { return &wire{} }

var errOutcomeUnknown = claim.ErrOutcomeUnknownForTest

func itemsWith(n int, id func(i int) uuid.UUID) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{ID: id(i), Payload: []byte(fmt.Sprint("p", i))}
	}
	return items
}

func TestEnqueueIsIdempotentOnCallerIDs(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	a, b := uuid.New(), uuid.New()
	first, err := q.EnqueueReport(ctx,
		claim.NewItem{ID: a, Payload: []byte("a")},
		claim.NewItem{Payload: []byte("generated")},
		claim.NewItem{ID: b, Payload: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	if first.IDs[0] != a || first.IDs[2] != b || first.IDs[1] == (uuid.UUID{}) {
		t.Fatalf("ids %v, want the caller's at 0 and 2 and a generated one at 1", first.IDs)
	}
	if fmt.Sprint(first.New) != "[true true true]" || first.Added() != 3 {
		t.Fatalf("first enqueue: new %v, added %d", first.New, first.Added())
	}
	// Again, with other payloads and a new id among them: only the new one
	// is added; the present ones keep their payload.
	c := uuid.New()
	again, err := q.EnqueueReport(ctx,
		claim.NewItem{ID: b, Payload: []byte("changed")},
		claim.NewItem{ID: c, Payload: []byte("c")},
		claim.NewItem{ID: a, Payload: []byte("changed")})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again.New) != "[false true false]" || again.Added() != 1 {
		t.Fatalf("second enqueue: new %v, want [false true false]", again.New)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE payload = 'changed'`); n != 0 {
		t.Fatalf("a repeated enqueue overwrote %d payloads", n)
	}
	if s := q.Stats().Enqueued; s != 4 {
		t.Fatalf("Stats().Enqueued = %d, want 4 (items added)", s)
	}
	// Enqueue (ids only) is idempotent too, and so is EnqueueTx.
	ids, err := q.Enqueue(ctx, claim.NewItem{ID: a, Payload: []byte("x")})
	if err != nil || len(ids) != 1 || ids[0] != a {
		t.Fatalf("Enqueue of a present id: %v, %v", ids, err)
	}
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		res, err := q.EnqueueReportTx(ctx, tx, claim.NewItem{ID: b, Payload: []byte("x")}, claim.NewItem{ID: uuid.New(), Payload: []byte("d")})
		if err == nil && fmt.Sprint(res.New) != "[false true]" {
			err = fmt.Errorf("EnqueueReportTx: new %v, want [false true]", res.New)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 5 {
		t.Fatalf("%d rows, want 5", n)
	}

	// An id of another queue's item is refused, and nothing of the call is
	// enqueued.
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	_, err = other.Enqueue(ctx, claim.NewItem{ID: uuid.New(), Payload: []byte("o")}, claim.NewItem{ID: a, Payload: []byte("o")})
	if !errors.Is(err, claim.ErrIDInOtherQueue) || !strings.Contains(err.Error(), "item 1") {
		t.Fatalf("enqueue of another queue's id: %v, want ErrIDInOtherQueue naming item 1", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'other'`); n != 0 {
		t.Fatalf("a refused enqueue left %d items", n)
	}
	// The same id twice in one call is bad input.
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: c}, claim.NewItem{ID: c}); err == nil || !strings.Contains(err.Error(), "items 0 and 1") {
		t.Fatalf("one id twice: %v, want an error naming items 0 and 1", err)
	}
}

// A bulk enqueue of caller-given ids, repeated, adds nothing the second
// time, across several statements.
func TestEnqueueManyCallerIDsTwice(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids := make([]uuid.UUID, 12000)
	for i := range ids {
		ids[i] = uuid.New()
	}
	items := itemsWith(len(ids), func(i int) uuid.UUID { return ids[i] })
	res, err := q.EnqueueReport(ctx, items[:7000]...)
	if err != nil || res.Added() != 7000 {
		t.Fatalf("first: added %d, %v", res.Added(), err)
	}
	res, err = q.EnqueueReport(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	for i, isNew := range res.New {
		if isNew != (i >= 7000) || res.IDs[i] != ids[i] {
			t.Fatalf("item %d: new %v, id %v", i, isNew, res.IDs[i])
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 12000 {
		t.Fatalf("%d rows, want 12000", n)
	}
}

// Many generated ids go by COPY: every column arrives as the INSERT would
// write it, parts agree with items enqueued one at a time, and vesting
// times come from the database clock.
func TestEnqueueBulkMatchesSingle(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, num_parts) VALUES ('bulk', 7), ('single', 7)`); err != nil {
		t.Fatal(err)
	}
	bulk := newQueue(t, pool, claim.Options{Queue: "bulk", MaxAttempts: 9})
	single := newQueue(t, pool, claim.Options{Queue: "single", MaxAttempts: 9})
	const n = 3000
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i)), Key: fmt.Sprint("key-", i%50), Priority: i % 3,
			Delay: time.Duration(i%4) * time.Hour, MaxAttempts: i % 2}
		if i%5 == 0 {
			items[i].Metadata = []byte("meta")
		}
		if i%7 == 0 {
			items[i].Key = ""
		}
	}
	items[1].Payload = nil
	ids, err := bulk.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d ids", len(ids))
	}
	for _, it := range items[:60] {
		if _, err := single.Enqueue(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id, part, item_key, priority, max_attempts, payload, metadata,
		(EXTRACT(EPOCH FROM vesting_at - enqueued_at) * 1000000)::BIGINT, enqueued_at
		FROM crdbwork_items WHERE queue = 'bulk'`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		part, prio, maxAttempts, delay int64
		key                            *string
		payload, meta                  []byte
		enqueued                       time.Time
	}
	got := map[uuid.UUID]row{}
	for rows.Next() {
		var id uuid.UUID
		var r row
		if err := rows.Scan(&id, &r.part, &r.key, &r.prio, &r.maxAttempts, &r.payload, &r.meta, &r.delay, &r.enqueued); err != nil {
			t.Fatal(err)
		}
		got[id] = r
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(got) != n {
		t.Fatalf("%d rows, want %d", len(got), n)
	}
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		r, it := got[id], items[i]
		wantMax := int64(it.MaxAttempts)
		if wantMax == 0 {
			wantMax = 9
		}
		if string(r.payload) != string(it.Payload) || r.payload == nil || string(r.meta) != string(it.Metadata) ||
			(r.meta == nil) != (it.Metadata == nil) || r.prio != int64(it.Priority) || r.maxAttempts != wantMax ||
			r.delay != it.Delay.Microseconds() || (r.key == nil) != (it.Key == "") || (r.key != nil && *r.key != it.Key) {
			t.Fatalf("item %d: row %+v, item %+v", i, r, it)
		}
		if it.Key != "" {
			h := fnv.New64a()
			h.Write([]byte(it.Key))
			if want := int64(h.Sum64()&(1<<63-1)) % 7; r.part != want {
				t.Fatalf("item %d with key %q in part %d, want %d", i, it.Key, r.part, want)
			}
		}
		if r.enqueued.After(dbNow) || dbNow.Sub(r.enqueued) > time.Minute {
			t.Fatalf("enqueued_at %v, database now %v", r.enqueued, dbNow)
		}
	}
	// Items with a key land in the same part whichever way they came.
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items s JOIN crdbwork_items b
		ON s.item_key = b.item_key AND s.queue = 'single' AND b.queue = 'bulk' AND s.part <> b.part`); n != 0 {
		t.Fatalf("%d keyed items in another part than the same key enqueued alone", n)
	}
	// Keyless items are spread over every part.
	if n := count(t, pool, `SELECT count(DISTINCT part) FROM crdbwork_items WHERE queue = 'bulk' AND item_key IS NULL`); n != 7 {
		t.Fatalf("keyless items in %d parts, want 7", n)
	}
}

// A call whose items add up to more than 16 MiB is split so that no
// protocol message carries more than 8 MiB, by INSERT and by COPY.
func TestEnqueueSplitsByBytes(t *testing.T) {
	w := newWire()
	pool := w.pool(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	mib := bytes.Repeat([]byte{'x'}, 1<<20)
	for _, tc := range []struct {
		name   string
		items  int
		size   int
		meta   bool
		callID bool
	}{
		{"insert", 40, 1 << 20, false, false},
		{"insert-caller-ids", 20, 1 << 20, true, true},
		{"copy", 100, 300 << 10, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := make([]claim.NewItem, tc.items)
			for i := range items {
				items[i].Payload = mib[:tc.size]
				if tc.meta {
					items[i].Metadata = mib[:tc.size]
				}
				if tc.callID {
					items[i].ID = uuid.New()
				}
			}
			_, before := w.largest()
			ids, err := q.Enqueue(ctx, items...)
			if err != nil {
				t.Fatal(err)
			}
			largest, after := w.largest()
			total := tc.items * tc.size
			if tc.meta {
				total *= 2
			}
			if total <= 16<<20 || after-before < int64(total) {
				t.Fatalf("sent %d bytes for %d bytes of items: the test must send over 16 MiB", after-before, total)
			}
			if largest > 8<<20+64<<10 {
				t.Fatalf("largest message sent: %d bytes, over 8 MiB", largest)
			}
			var sum int64
			if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(length(payload) + COALESCE(length(metadata), 0)), 0)
				FROM crdbwork_items WHERE id = ANY($1)`, ids).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			if sum != int64(total) {
				t.Fatalf("%d bytes of items arrived, want %d", sum, total)
			}
		})
	}
	// The limits hold whatever MaxPayload says.
	big := newQueue(t, pool, claim.Options{MaxPayload: 64 << 20})
	if _, err := big.Enqueue(ctx, claim.NewItem{Payload: make([]byte, claim.MaxPayloadLimit+1)}); !errors.Is(err, claim.ErrPayloadTooLarge) {
		t.Fatalf("payload over MaxPayloadLimit: %v, want ErrPayloadTooLarge", err)
	}
}

// An enqueue whose answer is lost returns the ids with ErrOutcomeUnknown;
// enqueued again with those ids, it adds nothing (the first one did commit).
func TestEnqueueRetryAfterUnknownOutcome(t *testing.T) {
	for _, tc := range []struct {
		name, trigger string
		items         int
	}{
		{"statement", "INSERT INTO", 3}, // one statement, no transaction
		{"commit", "COMMIT", 500},       // COPY in a transaction; COMMIT's answer lost
		{"commit-insert", "COMMIT", 3},  // caller-given ids below
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWire()
			pool := w.pool(t)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{})
			items := itemsWith(tc.items, func(int) uuid.UUID { return uuid.UUID{} })
			if tc.name == "commit-insert" {
				items = itemsWith(tc.items, func(int) uuid.UUID { return uuid.New() })
			}
			w.arm(tc.trigger)
			ids, err := q.Enqueue(ctx, items...)
			if w.cut.Load() != 1 {
				t.Fatalf("%d connections cut, want 1 (err %v)", w.cut.Load(), err)
			}
			if !errors.Is(err, errOutcomeUnknown) {
				t.Fatalf("Enqueue with its answer lost: %v, want an outcome-unknown error", err)
			}
			if len(ids) != tc.items {
				t.Fatalf("%d ids returned with the unknown outcome, want %d", len(ids), tc.items)
			}
			if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != tc.items {
				t.Fatalf("%d rows after the lost answer, want %d (the server committed)", n, tc.items)
			}
			for i := range items {
				items[i].ID = ids[i]
			}
			res, err := q.EnqueueReport(ctx, items...)
			if err != nil {
				t.Fatal(err)
			}
			if res.Added() != 0 {
				t.Fatalf("the retry added %d items, want 0", res.Added())
			}
			if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != tc.items {
				t.Fatalf("%d rows after the retry, want %d", n, tc.items)
			}
		})
	}
}
