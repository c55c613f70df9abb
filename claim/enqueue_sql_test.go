package claim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// sqlEnqueued is one answer of crdbwork_enqueue.
type sqlEnqueued struct {
	ID          uuid.UUID
	Added, Done bool
}

// sqlEnqueue calls crdbwork_enqueue(args) through db.
func sqlEnqueue(ctx context.Context, db crsql.DB, args string, vals ...any) (sqlEnqueued, error) {
	var r sqlEnqueued
	err := db.QueryRow(ctx, `SELECT item_id, added, done FROM crdbwork_enqueue(`+args+`)`, vals...).Scan(&r.ID, &r.Added, &r.Done)
	return r, err
}

// psql runs the real psql binary on url with one command and returns its
// output (unaligned, tuples only) and exit error.
func psql(t *testing.T, url, command string) (string, string, error) {
	t.Helper()
	bin, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql binary")
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-F", "|", "-c", command, url)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return strings.TrimSpace(out.String()), errOut.String(), err
}

func sqlSetup(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	url := setupURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// An item enqueued from psql is claimed and acked like any other, with its
// payload, key, part (the Go API's part for the key), priority, attempts,
// metadata and headers; the same id enqueued again from psql is a
// duplicate, still queued (added false, done false) and, once acked,
// ended (done true) within the dedup window, exactly as the Go API
// reports it for the same id.
func TestSQLEnqueueFromPsqlIsClaimedAckedAndDeduplicated(t *testing.T) {
	t.Parallel()
	pool, url := sqlSetup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "mail", 8); err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	call := `SELECT item_id, added, done FROM crdbwork_enqueue(` + testdb.EnqueueArgs("'mail'", "convert_to('hello', 'UTF8')",
		"id", "'"+id.String()+"'", "key", "'user-7'", "priority", "3", "max_attempts", "4",
		"metadata", `'\x6d'::BYTEA`, "headers", `'{"traceparent": "00-x"}'`) + `)`
	out, stderr, err := psql(t, url, call)
	if err != nil {
		t.Fatalf("psql: %v: %s", err, stderr)
	}
	if out != id.String()+"|t|f" {
		t.Fatalf("psql answered %q, want %s|t|f", out, id)
	}
	// Again, while it is queued: a duplicate, not done.
	if out, stderr, err = psql(t, url, call); err != nil || out != id.String()+"|f|f" {
		t.Fatalf("psql again: %q, %v %s; want %s|f|f", out, err, stderr, id)
	}
	q := newQueue(t, pool, claim.Options{Queue: "mail"})
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v, %d items; want 1", err, len(items))
	}
	it := items[0]
	if it.ID != id || string(it.Payload) != "hello" || it.Key != "user-7" || it.Priority != 3 || it.MaxAttempts != 4 ||
		string(it.Metadata) != "m" || it.Headers["traceparent"] != "00-x" || it.Part != claim.PartOf("user-7", "", 8) || it.Attempt != 1 {
		t.Fatalf("claimed %+v; want the psql item in part %d", it, claim.PartOf("user-7", "", 8))
	}
	if err := q.Ack(ctx, it, nil); err != nil {
		t.Fatal(err)
	}
	// Acked: done within the window, from psql and from Go alike.
	if out, stderr, err = psql(t, url, call); err != nil || out != id.String()+"|f|t" {
		t.Fatalf("psql after the ack: %q, %v %s; want %s|f|t", out, err, stderr, id)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("hello")})
	if err != nil || res.New[0] || !res.Done[0] {
		t.Fatalf("Go enqueue of the acked id: %+v, %v; want not new, done", res, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 0 {
		t.Fatalf("%d items after the ack and the duplicates, want 0", n)
	}
	// With the window off, the id is enqueued again, as by Go.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{DedupOff: true}}); err != nil {
		t.Fatal(err)
	}
	if r, err := sqlEnqueue(ctx, pool, `'mail', ''::BYTEA, $1`, id); err != nil || !r.Added {
		t.Fatalf("enqueue with the window off: %+v, %v; want added", r, err)
	}
}

// Bad arguments give a clear SQL error (with its SQLSTATE) and write
// nothing, from psql (a non-zero exit) and from Go; an id of another
// queue's item is refused as the Go API refuses it.
func TestSQLEnqueueRefusesBadInput(t *testing.T) {
	t.Parallel()
	pool, url := sqlSetup(t)
	ctx := context.Background()
	_, stderr, err := psql(t, url, `SELECT * FROM crdbwork_enqueue(`+testdb.EnqueueArgs("'q'", "''::BYTEA", "key", "repeat('k', 2049)")+`)`)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(stderr, "the key is 2049 bytes, the limit is 2048") {
		t.Fatalf("psql with a long key: %v, stderr %q; want a failure naming the limit", err, stderr)
	}
	other, err := sqlEnqueue(ctx, pool, `'other', ''::BYTEA`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args, code, msg string
		vals            []any
	}{
		{`NULL, ''::BYTEA`, "22023", "the queue name is required", nil},
		{`'', ''::BYTEA`, "22023", "the queue name is required", nil},
		{`'q', $1`, "54000", "the payload is 1048577 bytes", []any{make([]byte, 1<<20+1)}},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "metadata", "$1"), "54000", "the metadata is 1048577 bytes", []any{make([]byte, 1<<20+1)}},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "tenant", "repeat('t', 2049)"), "22023", "the tenant is 2049 bytes", nil},
		{`repeat('q', 513), ''::BYTEA`, "22023", "the queue name is 513 bytes", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "delay", "INTERVAL '-1 second'"), "22023", "negative delay", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "delay", "INTERVAL '1 second'", "run_at", "now()"), "22023", "not both", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "max_attempts", "-1"), "22023", "negative max_attempts", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "ttl", "INTERVAL '8761 hours'"), "22023", "ttl", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "timeout", "INTERVAL '0 seconds'"), "22023", "timeout", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "timeout", "INTERVAL '8761 hours'"), "22023", "timeout", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "priority", "NULL"), "22023", "priority", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "headers", "'[1]'"), "22023", "headers must be a JSON object", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "headers", `'{"a": 1}'`), "22023", "headers must be a JSON object of strings", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "headers", `'{"": "x"}'`), "22023", "non-empty names", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "headers", "jsonb_build_object('a', repeat('x', 16384))"), "22023", "over 16384 bytes", nil},
		{testdb.EnqueueArgs("'q'", "''::BYTEA", "id", "$1"), "23505", "is an item of queue other", []any{other.ID}},
	} {
		_, err := sqlEnqueue(ctx, pool, c.args, c.vals...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != c.code || !strings.Contains(pgErr.Message, c.msg) {
			t.Errorf("crdbwork_enqueue(%s): %v; want SQLSTATE %s and %q", c.args, err, c.code, c.msg)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items`); n != 1 {
		t.Fatalf("%d items after the refused calls, want only the other queue's", n)
	}
	// What the Go API refuses for the same reasons, it refuses too.
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: other.ID}); !errors.Is(err, claim.ErrIDInOtherQueue) {
		t.Fatalf("Go enqueue of the other queue's id: %v", err)
	}
}

// Keys and tenants fix the same parts as the Go API's; a fair queue's SQL
// enqueues are stamped with turns like Go's, so that a newcomer tenant is
// claimed before a backlogged one's later items; delays, run_at, TTLs and
// at-most-once land as the Go API puts them.
func TestSQLEnqueuePartsFairnessAndTimes(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "p", 64); err != nil {
		t.Fatal(err)
	}
	keys := []string{"a", "user-7", "ключ", "🙂 emoji", strings.Repeat("long", 512), "ten"}
	for _, k := range keys {
		for _, args := range []string{testdb.EnqueueArgs("'p'", "''::BYTEA", "key", "$1"), testdb.EnqueueArgs("'p'", "''::BYTEA", "tenant", "$1")} {
			r, err := sqlEnqueue(ctx, pool, args, k)
			if err != nil {
				t.Fatal(err)
			}
			var part int
			if err := pool.QueryRow(ctx, `SELECT part FROM crdbwork_items WHERE id = $1`, r.ID).Scan(&part); err != nil {
				t.Fatal(err)
			}
			if want := claim.PartOf(k, "", 64); part != want {
				t.Errorf("%s %.20q: part %d, Go's %d", args, k, part, want)
			}
		}
	}

	fq := newQueue(t, pool, claim.Options{Queue: "fair"})
	if err := fq.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'fair'", "convert_to('big', 'UTF8')", "tenant", "'big'")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'fair'", "convert_to('small', 'UTF8')", "tenant", "'small'")); err != nil {
		t.Fatal(err)
	}
	s := startSession(t, ctx, pool)
	items, err := fq.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(items) != 2 {
		t.Fatalf("fair claim: %v, %d items", err, len(items))
	}
	if items[0].Tenant != "big" || items[1].Tenant != "small" {
		t.Errorf("fair claim took %s then %s; want big, then the newcomer small before big's backlog", items[0].Tenant, items[1].Tenant)
	}

	r, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'t'", "''::BYTEA", "delay", "INTERVAL '1 hour'", "ttl", "INTERVAL '2 hours'", "at_most_once", "true", "max_attempts", "9"))
	if err != nil {
		t.Fatal(err)
	}
	var delay, ttl float64
	var maxAttempts int
	var amo bool
	if err := pool.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM vesting_at - enqueued_at), EXTRACT(EPOCH FROM expires_at - enqueued_at), max_attempts, at_most_once
		FROM crdbwork_items WHERE id = $1`, r.ID).Scan(&delay, &ttl, &maxAttempts, &amo); err != nil {
		t.Fatal(err)
	}
	if delay != 3600 || ttl != 7200 || maxAttempts != 1 || !amo {
		t.Errorf("delay %vs ttl %vs max_attempts %d at_most_once %v; want 3600, 7200, 1 (at most once), true", delay, ttl, maxAttempts, amo)
	}
	at := time.Now().Add(90 * time.Minute)
	if r, err = sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'t'", "''::BYTEA", "run_at", "$1"), at); err != nil {
		t.Fatal(err)
	}
	var vesting time.Time
	if err := pool.QueryRow(ctx, `SELECT vesting_at FROM crdbwork_items WHERE id = $1`, r.ID).Scan(&vesting); err != nil {
		t.Fatal(err)
	}
	if d := vesting.Sub(at); d < -time.Second || d > time.Second {
		t.Errorf("run_at %v: vesting at %v", at, vesting)
	}
}

// An ack of the same id committing while the SQL enqueue waits for the
// acked row (PostgreSQL's default READ COMMITTED, outside a transaction)
// adds nothing: the function sees the ack's record of the ended id and
// answers done, as the Go API's serializable enqueue does.
func TestSQLEnqueueRacingAnAckAddsNothing(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("the race is PostgreSQL's READ COMMITTED, and so is its guard (the function's locking read, postgres only); the test finds the waiting call in pg_stat_activity, empty on CockroachDB")
	}
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "race"})
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	id := res.IDs[0]
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v, %d", err, len(items))
	}
	inAck, release := make(chan struct{}), make(chan struct{})
	ackErr := make(chan error, 1)
	go func() {
		first := true
		ackErr <- q.Ack(ctx, items[0], func(ctx context.Context, tx pgx.Tx) error {
			if first { // the ack's delete and ended record are written: hold them
				first = false
				close(inAck)
				<-release
			}
			return nil
		})
	}()
	<-inAck
	enq := make(chan sqlEnqueued, 1)
	enqErr := make(chan error, 1)
	go func() {
		r, err := sqlEnqueue(ctx, pool, `'race', ''::BYTEA, $1`, id)
		enq <- r
		enqErr <- err
	}()
	// Wait until the enqueue waits for the ack's lock.
	released := false
	t.Cleanup(func() { // a failed wait leaves the ack holding its locks
		if !released {
			close(release)
		}
	})
	await.Until(t, "the enqueue to wait for the ack's lock", func() bool {
		return count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%crdbwork_enqueue%'`) > 0
	})
	released = true
	close(release)
	if err := <-ackErr; err != nil {
		t.Fatal(err)
	}
	r, err := <-enq, <-enqErr
	if err != nil || r.Added || !r.Done {
		t.Fatalf("the racing enqueue answered %+v, %v; want not added, done", r, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id); n != 0 {
		t.Fatalf("the acked id is queued again (%d rows)", n)
	}
}

// With a schema and a prefix, Apply creates the function in the schema,
// under the prefix, on those tables; its enqueue of an item due now sends
// the queue's wake-up on the channel the Go API uses for those tables, at
// commit (PostgreSQL); a delayed item sends none.
func TestSQLEnqueueRenamedTablesAndWakeUp(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tables := crsql.Tables{Schema: "work's", Prefix: "w_"}
	if err := crsql.Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	// The wake-up is PostgreSQL's (LISTEN/NOTIFY); on CockroachDB only the
	// function's place and tables are checked.
	postgres := testdb.Kind(t) == "postgres"
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	stmts := store.New(tables)
	ch := stmts.NotifyChannel("mail")
	if postgres {
		if err := stmts.NotifyListen(ctx, conn, ch); err != nil {
			t.Fatal(err)
		}
	}
	var id uuid.UUID
	fn := pgx.Identifier{"work's", "w_enqueue"}.Sanitize()
	if err := pool.QueryRow(ctx, `SELECT item_id FROM `+fn+`(`+testdb.EnqueueArgs("'mail'", "''::BYTEA", "delay", "INTERVAL '1 hour'")+`)`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT item_id FROM `+fn+`('mail', convert_to('now', 'UTF8'))`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if postgres {
		wctx, cancel := context.WithTimeout(ctx, await.Stretch(10*time.Second))
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil || n.Channel != ch {
			t.Fatalf("notification %+v, %v; want one on %s", n, err, ch)
		}
	}
	q := newQueue(t, pool, claim.Options{Queue: "mail", Tables: tables})
	st, err := q.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unclaimed != 2 {
		t.Errorf("the renamed tables hold %+v; want 2 unclaimed items", st)
	}
	if !postgres {
		return
	}
	// Only one notification: the delayed item sent none. A barrier shows
	// it without a wait: an item of another queue, due now, enqueued after
	// both; notifications are delivered in commit order, so one the delayed
	// item sent would come before the barrier's.
	barrier := stmts.NotifyChannel("barrier")
	if err := stmts.NotifyListen(ctx, conn, barrier); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT item_id FROM `+fn+`('barrier', convert_to('b', 'UTF8'))`); err != nil {
		t.Fatal(err)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, await.Stretch(10*time.Second))
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for the barrier's notification: %v", err)
		}
		if n.Channel == barrier {
			break
		}
		t.Errorf("a second notification before the barrier's: %+v", n)
	}
}

// The function's statements are index-backed: on tables with thousands of
// items and ended ids (analyzed), calls of every path (keys of a
// sequenced queue, a fair queue's tenants, a duplicate, an ended id,
// another queue's id) scan
// neither the items nor the ended ids sequentially (PostgreSQL's per-table
// counters).
func TestSQLEnqueueScansNoTable(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("counts sequential scans in pg_stat_user_tables, PostgreSQL's (an empty table on CockroachDB)")
	}
	pool, url := sqlSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "big"})
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
		t.Fatal(err)
	}
	// Sequenced, half of the items with a key: a keyed call reads the
	// key's sequence order too.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	items := payloads(5000)
	for i := range items {
		items[i].Tenant = fmt.Sprint("t", i%50)
		if i%2 == 0 {
			items[i].Key = fmt.Sprint("k", i%100)
		}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome) SELECT 'big', gen_random_uuid(), 'acked' FROM generate_series(1, 5000)`); err != nil {
		t.Fatal(err)
	}
	var ended, queued uuid.UUID
	if err := pool.QueryRow(ctx, `SELECT id FROM crdbwork_ended LIMIT 1`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT id FROM crdbwork_items LIMIT 1`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE crdbwork_items; ANALYZE crdbwork_ended; ANALYZE crdbwork_queues`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The setup ran on the pool's connections (its reads above scan the
	// tables), whose counts reach pg_stat_user_tables when their backends
	// flush them: at most once a second, or when they exit. Close them and
	// wait until their backends are gone, so that none is counted during
	// the calls.
	pool.Reset()
	await.Until(t, "the pool's backends to exit (their statistics flushed)", func() (bool, string) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0, fmt.Sprintf("%d other backends", n)
	})
	scans := func() map[string]int64 {
		t.Helper()
		if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		rows, err := conn.Query(ctx, `SELECT relname, COALESCE(seq_scan, 0) FROM pg_stat_user_tables WHERE relname LIKE 'crdbwork_%'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			out[name] = n
		}
		return out
	}
	before := scans()
	calls := []struct {
		args string
		vals []any
	}{
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "key", "'k1'"), nil},
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "key", "'k2'", "tenant", "'t2'"), nil},
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "tenant", "'t7'"), nil},
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "tenant", "'newcomer'", "priority", "3"), nil},
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "id", "$1"), []any{queued}},
		{testdb.EnqueueArgs("'big'", "''::BYTEA", "id", "$1"), []any{ended}},
		{`'other', ''::BYTEA`, nil},
	}
	for range 3 { // custom and generic plans alike
		for _, c := range calls {
			if _, err := sqlEnqueue(ctx, conn, c.args, c.vals...); err != nil {
				t.Fatal(err)
			}
		}
	}
	after := scans()
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'big' AND item_key IN ('k1', 'k2') AND seq_order IS NULL`); n != 0 {
		t.Errorf("%d keyed items of the sequenced queue without a sequence order", n)
	}
	// crdbwork_queues holds two rows: PostgreSQL rightly scans it whole
	// (so do the Go API's statements); its reads are by primary key.
	for _, table := range []string{"crdbwork_items", "crdbwork_ended"} {
		if after[table] != before[table] {
			t.Errorf("%s: %d sequential scans during the calls", table, after[table]-before[table])
		}
	}
}

// The function treats the id of a waiting item (enqueued from Go with
// After) as a duplicate, as Enqueue does: no second, claimable copy; and
// the id of another queue's waiting item is refused like another queue's
// item's.
func TestSQLEnqueueOfAWaitingIDIsADuplicate(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "sqlwait"})
	root, dep := uuid.New(), uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: root, Payload: []byte("root")}, claim.NewItem{ID: dep, Payload: []byte("dep"), After: []uuid.UUID{root}}); err != nil {
		t.Fatal(err)
	}
	r, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'sqlwait'", "''::BYTEA", "id", "$1"), dep)
	if err != nil {
		t.Fatal(err)
	}
	if r.Added || r.Done {
		t.Fatalf("crdbwork_enqueue of a waiting id: added %v, done %v; want neither", r.Added, r.Done)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, dep); n != 0 {
		t.Fatalf("the waiting id is in the items table %d times, want 0 until its prerequisite is acked", n)
	}
	if _, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'other'", "''::BYTEA", "id", "$1"), dep); err == nil || !strings.Contains(err.Error(), "is an item of queue sqlwait") {
		t.Fatalf("crdbwork_enqueue of another queue's waiting id: %v; want it refused", err)
	}
}

// An item enqueued from SQL with a timeout of its own comes back with it
// from the claim, as NewItem.Timeout does; a call with the 13 arguments of
// the function's older revisions (before timeout) still works, without one.
func TestSQLEnqueueTimeout(t *testing.T) {
	t.Parallel()
	pool, _ := sqlSetup(t)
	ctx := context.Background()
	with, err := sqlEnqueue(ctx, pool, testdb.EnqueueArgs("'tq'", "''::BYTEA", "timeout", "INTERVAL '90 seconds'"))
	if err != nil {
		t.Fatal(err)
	}
	old, err := sqlEnqueue(ctx, pool, `'tq', ''::BYTEA, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false`)
	if err != nil {
		t.Fatalf("a call with the older revisions' 13 arguments: %v", err)
	}
	q := newQueue(t, pool, claim.Options{Queue: "tq"})
	s := startSession(t, ctx, pool)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(items) != 2 {
		t.Fatalf("claim: %v %v", items, err)
	}
	for _, it := range items {
		want := map[uuid.UUID]time.Duration{with.ID: 90 * time.Second, old.ID: 0}[it.ID]
		if it.Timeout != want {
			t.Errorf("item %s: timeout %v, want %v", it.ID, it.Timeout, want)
		}
	}
}
