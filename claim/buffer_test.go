package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/faultproxy"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// countingDB counts the calls made on a pool: statements run on the pool
// itself and transactions begun, each one round trip or one transaction.
type countingDB struct {
	*pgxpool.Pool
	calls atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.calls.Add(1)
	return c.Pool.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.calls.Add(1)
	return c.Pool.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.calls.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

func (c *countingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c.calls.Add(1)
	return c.Pool.BeginTx(ctx, opts)
}

func newBuffer(t testing.TB, q *claim.Queue, opts claim.BufferOptions) *claim.Buffer {
	t.Helper()
	b, err := claim.NewBuffer(q, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(time.Minute))
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return b
}

// Many goroutines enqueue through one buffer, with generated and
// caller-given ids, some given twice at once: every id returned exists
// exactly once with its payload, each caller-given id is reported new to
// exactly one of its callers, and the items shared statements (far fewer
// database calls than items).
func TestBufferConcurrentEnqueueEachItemOnce(t *testing.T) {
	t.Parallel()
	const goroutines, perGoroutine = 64, 40
	pool := setup(t)
	db := &countingDB{Pool: pool}
	q, err := claim.New(db, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	buf := newBuffer(t, q, claim.BufferOptions{})
	ctx := context.Background()
	// Ids given by two goroutines each: goroutine g and g+1 share shared[g/2].
	shared := make([]uuid.UUID, goroutines/2)
	for i := range shared {
		shared[i] = uuid.New()
	}
	type got struct {
		id      uuid.UUID
		isNew   bool
		payload string
	}
	results := make([][]got, goroutines)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perGoroutine {
				it := claim.NewItem{Payload: []byte(fmt.Sprintf("g%d-%d", g, i)), Key: fmt.Sprint("k", i%7)}
				switch {
				case i == perGoroutine/2:
					it.ID, it.Payload = shared[g/2], []byte(fmt.Sprint("shared", g/2))
				case i%3 == 0:
					it.ID = uuid.New()
				}
				res, err := buf.Enqueue(ctx, it)
				if err != nil {
					errs <- fmt.Errorf("goroutine %d item %d: %w", g, i, err)
					return
				}
				if len(res.IDs) != 1 || len(res.New) != 1 || len(res.Done) != 1 {
					errs <- fmt.Errorf("goroutine %d item %d: %+v, want one id, New and Done", g, i, res)
					return
				}
				id, isNew := res.IDs[0], res.New[0]
				if it.ID != (uuid.UUID{}) && id != it.ID {
					errs <- fmt.Errorf("goroutine %d item %d: id %s, want the caller's %s", g, i, id, it.ID)
					return
				}
				results[g] = append(results[g], got{id, isNew, string(it.Payload)})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	newCount := map[uuid.UUID]int{}
	calls := 0
	for _, rs := range results {
		for _, r := range rs {
			calls++
			if r.isNew {
				newCount[r.id]++
			}
		}
	}
	distinct := goroutines*perGoroutine - goroutines/2
	if len(newCount) != distinct {
		t.Fatalf("%d distinct ids reported new, want %d", len(newCount), distinct)
	}
	for id, n := range newCount {
		if n != 1 {
			t.Fatalf("id %s reported new %d times", id, n)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id, payload FROM crdbwork_items`)
	if err != nil {
		t.Fatal(err)
	}
	inTable := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var p []byte
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		if _, dup := inTable[id]; dup {
			t.Fatalf("id %s twice in the table", id)
		}
		inTable[id] = string(p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(inTable) != distinct {
		t.Fatalf("%d rows, want %d", len(inTable), distinct)
	}
	for _, rs := range results {
		for _, r := range rs {
			if p, ok := inTable[r.id]; !ok || p != r.payload {
				t.Fatalf("id %s: payload %q in the table (present %v), want %q", r.id, p, ok, r.payload)
			}
		}
	}
	st := buf.Stats()
	n := db.calls.Load()
	t.Logf("%d Enqueue calls: %d database calls, %d flushes, largest %d items", calls, n, st.Flushes, st.Largest)
	if n > int64(calls/4) {
		t.Fatalf("%d database calls for %d concurrent enqueues: the buffer did not share statements", n, calls)
	}
	if st.Items != int64(calls) {
		t.Fatalf("Stats().Items = %d, want %d", st.Items, calls)
	}
}

// Items refused by validation fail alone at once; an item the server
// refuses (its caller-given id belongs to another queue's item) fails alone
// after its flush is split; the good items of the same flush are enqueued.
func TestBufferBadItemFailsAlone(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	foreign, err := other.Enqueue(ctx, claim.NewItem{Payload: []byte("other's")})
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{MaxPayload: 100})
	const n = 16
	// One flush of exactly n items: it waits (up to a minute) for all of them.
	buf := newBuffer(t, q, claim.BufferOptions{MaxItems: n, MaxWait: time.Minute})

	if _, err := buf.Enqueue(ctx, claim.NewItem{Payload: make([]byte, 101)}); !errors.Is(err, claim.ErrPayloadTooLarge) {
		t.Fatalf("oversized item: %v, want ErrPayloadTooLarge at once", err)
	}
	if _, err := buf.Enqueue(ctx, claim.NewItem{Key: "bad\x00key"}); err == nil {
		t.Fatal("a key with a NUL byte was accepted")
	}
	type outcome struct {
		i   int
		id  uuid.UUID
		err error
	}
	out := make(chan outcome, n)
	for i := range n {
		go func() {
			it := claim.NewItem{Payload: []byte(fmt.Sprint("good", i)), ID: uuid.New()}
			if i%2 == 1 {
				it.ID = uuid.UUID{} // generated
			}
			if i == n/3 {
				it.ID, it.Payload = foreign.IDs[0], []byte("bad")
			}
			res, err := buf.Enqueue(ctx, it)
			var id uuid.UUID
			if len(res.IDs) == 1 {
				id = res.IDs[0]
			}
			out <- outcome{i, id, err}
		}()
	}
	good := 0
	for range n {
		o := <-out
		if o.i == n/3 {
			if !errors.Is(o.err, claim.ErrIDInOtherQueue) || o.id != (uuid.UUID{}) {
				t.Fatalf("the foreign id: %s, %v; want ErrIDInOtherQueue and no id", o.id, o.err)
			}
			continue
		}
		if o.err != nil {
			t.Fatalf("good item %d failed with the bad one: %v", o.i, o.err)
		}
		if count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND queue = 'default'`, o.id) != 1 {
			t.Fatalf("good item %d (%s) is not in the table", o.i, o.id)
		}
		good++
	}
	if good != n-1 {
		t.Fatalf("%d good items, want %d", good, n-1)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'default'`); c != n-1 {
		t.Fatalf("%d items in the queue, want %d", c, n-1)
	}
	st := buf.Stats()
	if st.Splits == 0 {
		t.Fatalf("stats %+v: want a split flush", st)
	}
	t.Logf("stats %+v", st)
}

// A caller whose context ends before its flush withdraws its item (nothing
// enqueued, a plain error). One whose context ends while its flush is in
// flight gets ErrOutcomeUnknown with its id, and the flush goes on for the
// others: here it waits on a row lock, commits once the lock goes, and the
// gone caller's item is in the table.
func TestBufferCancelledCaller(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	testdb.Quiet(t, pool) // the test's own transaction is committed once, not retried
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	buf := newBuffer(t, q, claim.BufferOptions{MaxItems: 3, MaxWait: time.Minute})

	// Withdrawn before its flush.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := buf.Enqueue(cctx, claim.NewItem{Payload: []byte("withdrawn")})
		done <- err
	}()
	await.Until(t, "the item waiting in the buffer", func() (bool, string) {
		st := buf.Stats()
		return st.Waiting == 1, fmt.Sprintf("%+v", st)
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, claim.ErrOutcomeUnknown) {
		t.Fatalf("caller cancelled before its flush: %v, want context.Canceled and not unknown", err)
	}

	// A transaction holds the insert of id x: a flush carrying x waits.
	x := uuid.New()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := q.EnqueueTx(ctx, tx, claim.NewItem{ID: x, Payload: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		id    uuid.UUID
		isNew bool
		err   error
	}
	answer := func(res claim.Enqueued, err error) outcome {
		o := outcome{err: err}
		if len(res.IDs) == 1 {
			o.id = res.IDs[0]
		}
		if len(res.New) == 1 {
			o.isNew = res.New[0]
		}
		return o
	}
	gone, stay := make(chan outcome, 1), make(chan outcome, 2)
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	go func() {
		gone <- answer(buf.Enqueue(gctx, claim.NewItem{Payload: []byte("gone")}))
	}()
	for _, it := range []claim.NewItem{{ID: x, Payload: []byte("x")}, {Payload: []byte("stay")}} {
		go func() {
			stay <- answer(buf.Enqueue(ctx, it))
		}()
	}
	await.Until(t, "a flush", func() (bool, string) {
		st := buf.Stats()
		return st.Flushes > 0, fmt.Sprintf("%+v", st)
	})
	gcancel()
	g := <-gone
	if !errors.Is(g.err, claim.ErrOutcomeUnknown) || !errors.Is(g.err, context.Canceled) || g.id == (uuid.UUID{}) {
		t.Fatalf("caller cancelled in flight: %s, %v; want its id and ErrOutcomeUnknown", g.id, g.err)
	}
	select {
	case o := <-stay:
		t.Fatalf("a caller was answered while its flush waits on a lock: %+v", o)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		o := <-stay
		if o.err != nil {
			t.Fatalf("a caller of the flush failed: %v", o.err)
		}
		if o.id == x && o.isNew {
			t.Fatal("x reported new, but the transaction had added it")
		}
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, g.id); c != 1 {
		t.Fatalf("the gone caller's item: %d rows, want 1 (its flush committed)", c)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE payload = 'withdrawn'`); c != 0 {
		t.Fatal("a withdrawn item was enqueued")
	}

	// Close flushes what waits, then refuses new items.
	late := make(chan error, 1)
	go func() {
		_, err := buf.Enqueue(ctx, claim.NewItem{Payload: []byte("before close")})
		late <- err
	}()
	await.Until(t, "the item waiting in the buffer", func() (bool, string) {
		st := buf.Stats()
		return st.Waiting == 1, fmt.Sprintf("%+v", st)
	})
	if err := buf.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-late; err != nil {
		t.Fatalf("item waiting at Close: %v", err)
	}
	if _, err := buf.Enqueue(ctx, claim.NewItem{Payload: []byte("after")}); !errors.Is(err, claim.ErrBufferClosed) {
		t.Fatalf("Enqueue after Close: %v, want ErrBufferClosed", err)
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE payload = 'before close'`); c != 1 {
		t.Fatalf("item waiting at Close: %d rows, want 1", c)
	}
}

// A flush whose answer is lost: every caller of it gets ErrOutcomeUnknown
// and its id; enqueued again with those ids, nothing is added (the flush
// did commit).
func TestBufferOutcomeUnknown(t *testing.T) {
	t.Parallel()
	_, pool, proxy := proxied(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("warm-up")}); err != nil {
		t.Fatal(err) // the schema check runs before the fault
	}
	const n = 8
	buf := newBuffer(t, q, claim.BufferOptions{MaxItems: n, MaxWait: time.Minute})
	proxy.Arm(faultproxy.Rule{Match: faultproxy.Contains("INSERT INTO"), Action: faultproxy.DropAnswer})
	type outcome struct {
		id  uuid.UUID
		err error
	}
	out := make(chan outcome, n)
	for i := range n {
		go func() {
			res, err := buf.Enqueue(ctx, claim.NewItem{Payload: []byte(fmt.Sprint("u", i))})
			var id uuid.UUID
			if len(res.IDs) == 1 {
				id = res.IDs[0]
			}
			out <- outcome{id, err}
		}()
	}
	var retry []claim.NewItem
	for range n {
		o := <-out
		if !errors.Is(o.err, claim.ErrOutcomeUnknown) || o.id == (uuid.UUID{}) {
			t.Fatalf("caller of a flush whose answer was lost: %s, %v; want its id and ErrOutcomeUnknown", o.id, o.err)
		}
		retry = append(retry, claim.NewItem{ID: o.id, Payload: []byte("again")})
	}
	if proxy.Fired() != 1 {
		t.Fatalf("the fault fired %d times, want 1", proxy.Fired())
	}
	res, err := q.Enqueue(ctx, retry...)
	if err != nil {
		t.Fatal(err)
	}
	if res.Added() != 0 {
		t.Fatalf("the retry added %d items: the lost flush had committed them all", res.Added())
	}
	if c := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE payload <> 'warm-up'`); c != n {
		t.Fatalf("%d items, want %d", c, n)
	}
}

// The database server restarts twice while 16 producers enqueue through a
// buffer with caller-given ids. Every call is told the truth: an id
// reported enqueued is in the table exactly once, an id reported failed
// (plainly) is not, an unknown one is either; enqueues succeed again after
// each restart.
func TestBufferDatabaseRestart(t *testing.T) {
	t.Parallel()
	srv, url := testdb.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(5*time.Minute))
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{})
	buf := newBuffer(t, q, claim.BufferOptions{FlushTimeout: 10 * time.Second})

	var mu sync.Mutex
	var ok, failed, unknown []uuid.UUID
	var okAfter atomic.Int64 // successes since the last restart
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := uuid.New()
				cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				got, err := buf.Enqueue(cctx, claim.NewItem{ID: id, Payload: []byte("r")})
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					if len(got.IDs) != 1 || got.IDs[0] != id {
						t.Errorf("ids %v returned for %s", got.IDs, id)
					}
					ok = append(ok, id)
					okAfter.Add(1)
				case errors.Is(err, claim.ErrOutcomeUnknown):
					unknown = append(unknown, id)
				default:
					failed = append(failed, id)
				}
				mu.Unlock()
				if err != nil {
					// A producer's pause, not a wait: the database is
					// down, and a producer does not spin.
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	stopped := false
	stopProducers := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopProducers) // a failed wait leaves them running
	waitOK := func(what string) {
		t.Helper()
		okAfter.Store(0)
		await.Until(t, "200 enqueues to succeed "+what, func() (bool, string) {
			n := okAfter.Load()
			return n >= 200, fmt.Sprintf("%d succeeded", n)
		}, await.Within(2*time.Minute))
	}
	waitOK("before the restarts")
	for i := range 2 {
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitOK(fmt.Sprint("after restart ", i+1))
	}
	stopProducers()

	present := map[uuid.UUID]int{}
	rows, err := pool.Query(ctx, `SELECT id FROM crdbwork_items`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		present[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ok {
		if present[id] != 1 {
			t.Fatalf("id %s reported enqueued: %d rows", id, present[id])
		}
	}
	for _, id := range failed {
		if present[id] != 0 {
			t.Fatalf("id %s reported failed (not unknown) is in the table", id)
		}
	}
	resolved := 0
	for _, id := range unknown {
		resolved += present[id]
	}
	if len(present) != len(ok)+resolved {
		t.Fatalf("%d rows, want %d enqueued + %d unknown that committed", len(present), len(ok), resolved)
	}
	t.Logf("%d enqueued, %d failed, %d unknown (%d of them committed); stats %+v", len(ok), len(failed), len(unknown), resolved, buf.Stats())
	if len(failed)+len(unknown) == 0 {
		t.Log("no enqueue was caught by the restarts")
	}
}
