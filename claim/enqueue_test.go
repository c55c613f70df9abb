package claim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// wire counts what the client sends on every connection of a pool (a dial
// wrapper, no proxy): the bytes, and the largest protocol message.
type wire struct {
	mu     sync.Mutex
	maxMsg int   // largest client message since the last call of largest
	sent   int64 // bytes the client sent
}

// pool returns a pool on a fresh database with the schema, whose
// connections go through w.
func (w *wire) pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(setupURL(t))
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
	return pool
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

// msgSplitter follows the boundaries of the client's protocol messages: a
// type byte (except for the first message, the startup message) and a
// 4-byte length that counts itself.
type msgSplitter struct {
	untyped bool // the next message has no type byte
	head    []byte
	left    int // bytes of the current message's body still to come
}

// feed consumes p and calls done with the total length of each message
// whose header is complete.
func (s *msgSplitter) feed(p []byte, done func(length int)) {
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
		s.untyped = false
		s.head = s.head[:0]
		s.left = length - 4
		done(length)
	}
}

type wireConn struct {
	net.Conn
	w   *wire
	out msgSplitter
}

func (c *wireConn) Write(p []byte) (int, error) {
	c.w.mu.Lock()
	c.w.sent += int64(len(p))
	c.out.feed(p, func(length int) { c.w.maxMsg = max(c.w.maxMsg, length) })
	c.w.mu.Unlock()
	return c.Conn.Write(p)
}

func itemsWith(n int, id func(i int) uuid.UUID) []claim.NewItem {
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{ID: id(i), Payload: []byte(fmt.Sprint("p", i))}
	}
	return items
}

func TestEnqueueIsIdempotentOnCallerIDs(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	a, b := uuid.New(), uuid.New()
	first, err := q.Enqueue(ctx,
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
	again, err := q.Enqueue(ctx,
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
	if err != nil || len(ids.IDs) != 1 || ids.IDs[0] != a {
		t.Fatalf("Enqueue of a present id: %v, %v", ids, err)
	}
	// The caller's transaction, retried whole on a serialization failure
	// as EnqueueTx asks of its callers (CockroachDB, or the fault model).
	err = retry.Tx(ctx, pool, nil, func(ctx context.Context, tx pgx.Tx) error {
		res, err := q.EnqueueTx(ctx, tx, claim.NewItem{ID: b, Payload: []byte("x")}, claim.NewItem{ID: uuid.New(), Payload: []byte("d")})
		if err == nil && fmt.Sprint(res.New) != "[false true]" {
			err = fmt.Errorf("EnqueueTx: new %v, want [false true]", res.New)
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
	if _, err := other.Enqueue(ctx, claim.NewItem{ID: b, Payload: []byte("o")}); !errors.Is(err, claim.ErrIDInOtherQueue) {
		t.Fatalf("enqueue of one item with another queue's id: %v, want ErrIDInOtherQueue", err)
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
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	ids := make([]uuid.UUID, 12000)
	for i := range ids {
		ids[i] = uuid.New()
	}
	items := itemsWith(len(ids), func(i int) uuid.UUID { return ids[i] })
	res, err := q.Enqueue(ctx, items[:7000]...)
	if err != nil || res.Added() != 7000 {
		t.Fatalf("first: added %d, %v", res.Added(), err)
	}
	res, err = q.Enqueue(ctx, items...)
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

// Producers racing to enqueue the same caller-given ids: each id is added
// once, by one of them, and neither fails.
func TestEnqueueSameIDsConcurrently(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	// Three rounds of 500 ids: each producer's enqueue is one statement
	// (under insertRows), as with more ids, and three producers in their
	// own orders overlap on their rows at once.
	const rounds, perRound = 3, 500
	for round := range rounds {
		ids := make([]uuid.UUID, perRound)
		for i := range ids {
			ids[i] = uuid.New()
		}
		var wg sync.WaitGroup
		added := make([]int, 3)
		errs := make([]error, 3)
		for p := range added {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each producer sends the ids in its own order, so that
				// their transactions overlap on different rows first.
				items := itemsWith(len(ids), func(i int) uuid.UUID { return ids[(i*(p+1)+p*7)%len(ids)] })
				if p == 1 {
					items = itemsWith(len(ids), func(i int) uuid.UUID { return ids[len(ids)-1-i] })
				}
				res, err := q.Enqueue(ctx, items...)
				added[p], errs[p] = res.Added(), err
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if total := added[0] + added[1] + added[2]; total != len(ids) {
			t.Fatalf("round %d: the producers added %v items, %d in all, want %d", round, added, total, len(ids))
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != rounds*perRound {
		t.Fatalf("%d rows, want %d", n, rounds*perRound)
	}
	t.Logf("enqueue transactions run again after a conflict: %d", q.Stats().Retries["enqueue"])
}

// Many generated ids go by COPY: every column arrives as the INSERT would
// write it, parts agree with items enqueued one at a time, and vesting
// times come from the database clock.
func TestEnqueueBulkMatchesSingle(t *testing.T) {
	t.Parallel()
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
	if len(ids.IDs) != n {
		t.Fatalf("%d ids", len(ids.IDs))
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
	for i, id := range ids.IDs {
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
	t.Parallel()
	ctx := context.Background()
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
			t.Parallel()
			w := &wire{}
			pool := w.pool(t)
			q := newQueue(t, pool, claim.Options{})
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
				FROM crdbwork_items WHERE id = ANY($1)`, ids.IDs).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			if sum != int64(total) {
				t.Fatalf("%d bytes of items arrived, want %d", sum, total)
			}
		})
	}
	// The limits hold whatever MaxPayload says.
	big := newQueue(t, setup(t), claim.Options{MaxPayload: 64 << 20})
	if _, err := big.Enqueue(ctx, claim.NewItem{Payload: make([]byte, claim.MaxPayloadLimit+1)}); !errors.Is(err, claim.ErrPayloadTooLarge) {
		t.Fatalf("payload over MaxPayloadLimit: %v, want ErrPayloadTooLarge", err)
	}
}

// An enqueue whose answer is lost (a proxy forwards the statement or COMMIT
// and drops the connection before the answer) returns the ids with an error
// wrapping ErrOutcomeUnknown; enqueued again with those ids, it adds nothing:
// the first one did commit. The same with CockroachDB's 40003 to the
// COMMIT, which committed or did not: the retry adds exactly what is
// missing (invariants 10 and 13).
func TestEnqueueRetryAfterUnknownOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		match  func(string) bool
		items  int
		given  bool
		action faultproxy.Action // 0: DropAnswer
	}{
		{name: "statement", match: faultproxy.Contains("INSERT INTO"), items: 3},   // one statement, no transaction
		{name: "commit-copy", match: faultproxy.IsCommit, items: 500},              // COPY in a transaction
		{name: "commit-insert", match: faultproxy.IsCommit, items: 3, given: true}, // caller-given ids: a transaction
		{name: "commit-copy-40003", match: faultproxy.IsCommit, items: 500, action: faultproxy.AmbiguousForward},
		{name: "commit-copy-40003-rolled-back", match: faultproxy.IsCommit, items: 500, action: faultproxy.AmbiguousDrop},
		{name: "commit-insert-40003-rolled-back", match: faultproxy.IsCommit, items: 3, given: true, action: faultproxy.AmbiguousDrop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			proxy, url, err := faultproxy.ForURL(setupURL(t))
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			pool, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			testdb.Quiet(t, pool) // the COMMIT whose answer is lost commits (no injected 40001)
			ctx := context.Background()
			q := newQueue(t, pool, claim.Options{})
			items := itemsWith(tc.items, func(int) uuid.UUID { return uuid.UUID{} })
			if tc.given {
				items = itemsWith(tc.items, func(int) uuid.UUID { return uuid.New() })
			}
			if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("warm-up")}); err != nil {
				t.Fatal(err) // the schema check runs once, before the fault
			}
			action, committed := tc.action, tc.items
			switch action {
			case 0:
				action = faultproxy.DropAnswer
			case faultproxy.AmbiguousDrop:
				committed = 0
			}
			proxy.Arm(faultproxy.Rule{Match: tc.match, Action: action})
			ids, err := q.Enqueue(ctx, items...)
			if proxy.Fired() != 1 {
				t.Fatalf("the fault fired %d times, want 1 (err %v)", proxy.Fired(), err)
			}
			if !errors.Is(err, claim.ErrOutcomeUnknown) {
				t.Fatalf("Enqueue with its answer lost: %v, want ErrOutcomeUnknown", err)
			}
			if len(ids.IDs) != tc.items {
				t.Fatalf("%d ids returned with the unknown outcome, want %d", len(ids.IDs), tc.items)
			}
			const others = `SELECT count(*) FROM crdbwork_items WHERE payload <> 'warm-up'`
			if n := count(t, pool, others); n != committed {
				t.Fatalf("%d rows after the unknown outcome, want %d (what the server committed)", n, committed)
			}
			for i := range items {
				items[i].ID = ids.IDs[i]
			}
			res, err := q.Enqueue(ctx, items...)
			if err != nil {
				t.Fatal(err)
			}
			if res.Added() != tc.items-committed {
				t.Fatalf("the retry added %d items, want %d", res.Added(), tc.items-committed)
			}
			if n := count(t, pool, others); n != tc.items {
				t.Fatalf("%d rows after the retry, want %d", n, tc.items)
			}
		})
	}
}

// EnqueueTx of many items (COPY) inside the caller's transaction: the items
// exist if and only if that transaction commits, and the call reports them
// added as Enqueue does.
func TestEnqueueTxBulk(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transactions are committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := q.EnqueueTx(ctx, tx, payloads(1000)...)
		if err != nil || len(ids.IDs) != 1000 || ids.Added() != 1000 || len(ids.Done) != 1000 {
			t.Fatalf("EnqueueTx: %d ids, %d added, %v", len(ids.IDs), ids.Added(), err)
		}
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
			t.Fatalf("%d items visible before the caller's commit", n)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if commit {
			want = 1000
		}
		if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = ANY($1)`, ids.IDs); n != want {
			t.Fatalf("commit %v: %d items, want %d", commit, n, want)
		}
	}
}
