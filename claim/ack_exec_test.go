package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// execSetup returns a pool (with a tracer) on a fresh database with the
// schema and a table of results without a key (a result written twice
// shows as two rows), and a queue with n items claimed by one session.
func execSetup(t *testing.T, n int) (*pgxpool.Pool, *pipeTracer, *claim.Queue, []claim.Item) {
	t.Helper()
	direct := setup(t)
	ctx := context.Background()
	if _, err := direct.Exec(ctx, `CREATE TABLE exec_results (item_id UUID NOT NULL, value TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg := direct.Config()
	tr := &pipeTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, direct)
	if _, err := q.Enqueue(ctx, payloads(n)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
	if err != nil || len(got) != n {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	return pool, tr, q, got
}

const insertResult = `INSERT INTO exec_results (item_id, value) VALUES ($1, $2)`

// execRequests gives each item the Exec record of its result, "v<i>".
func execRequests(items []claim.Item) []claim.AckRequest {
	reqs := make([]claim.AckRequest, len(items))
	for i, it := range items {
		reqs[i] = claim.AckRequest{Item: it, Record: claim.Exec(insertResult, it.ID, fmt.Sprint("v", i))}
	}
	return reqs
}

// results returns the number of result rows of each item.
func results(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT item_id::TEXT, count(*)::INT FROM exec_results GROUP BY item_id`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// On PostgreSQL an ack whose records are all Exec's is one batch: BEGIN,
// the all-or-nothing fenced delete, the records' statements and COMMIT.
func TestAckExecRecordsAreOneBatch(t *testing.T) {
	t.Parallel()
	pool, tr, q, got := execSetup(t, 8)
	if testdb.Kind(t) != "postgres" {
		t.Skip("the one-batch ack is PostgreSQL's")
	}
	testdb.Quiet(t, pool) // the test counts batches: a retry would add some
	ctx := context.Background()
	reqs := execRequests(got)
	reqs[3].Record = nil // nothing to record: it joins the batch too
	tr.reset()
	for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if batches, queries := tr.seen(); len(batches) != 1 || batches[0] != 10 || len(queries) != 0 {
		t.Fatalf("batches of %v statements and %d other statements %q; want [10] (BEGIN, the delete, 7 results, COMMIT) and none", batches, len(queries), queries)
	}
	res := results(t, pool)
	for i, it := range got {
		if want := map[bool]int{true: 0, false: 1}[i == 3]; res[it.ID.String()] != want {
			t.Fatalf("item %d has %d results, want %d", i, res[it.ID.String()], want)
		}
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 {
		t.Fatalf("%d items left, want 0", left)
	}
}

// An ack of many items with Exec records whose one batch fails (a claim
// was lost; on CockroachDB, always) is two batches whatever their number —
// BEGIN with the fenced delete, then the statements of the items whose
// claims held with COMMIT — and no statement of its own per item; the
// items whose claims were lost get no result.
func TestAckExecRecordsGoWithCommit(t *testing.T) {
	t.Parallel()
	pool, tr, q, got := execSetup(t, 8)
	testdb.Quiet(t, pool) // the test counts batches: a retry would add some
	ctx := context.Background()
	for _, i := range []int{2, 5} { // their claims are lost
		if err := q.Release(ctx, got[i]); err != nil {
			t.Fatal(err)
		}
	}
	tr.reset()
	errs := q.AckMany(ctx, execRequests(got), claim.AckOptions{})
	for i, err := range errs {
		lost := i == 2 || i == 5
		if lost != errors.Is(err, claim.ErrClaimLost) || !lost && err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	batches, queries := tr.seen()
	if testdb.Kind(t) == "postgres" {
		// The one-batch ack (BEGIN, the delete, 8 results, COMMIT) failed
		// on the lost claims and was rolled back.
		if len(batches) == 0 || batches[0] != 11 || len(queries) != 1 || queries[0] != "ROLLBACK" {
			t.Fatalf("batches of %v statements and other statements %q; want the one-batch ack first (11) and its ROLLBACK", batches, queries)
		}
		batches, queries = batches[1:], nil
	}
	if len(batches) != 2 || batches[0] != 2 || batches[1] != 7 || len(queries) != 0 {
		t.Fatalf("batches of %v statements and %d other statements %q; want [2 7] (BEGIN with the delete; 6 results with COMMIT) and none", batches, len(queries), queries)
	}
	res := results(t, pool)
	for i, it := range got {
		want := 1
		if i == 2 || i == 5 {
			want = 0
		}
		if res[it.ID.String()] != want {
			t.Fatalf("item %d has %d results, want %d (all: %v)", i, res[it.ID.String()], want, res)
		}
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 2 {
		t.Fatalf("%d items left, want the 2 whose claims were lost", left)
	}
}

// A queued statement that fails fails only its own item: the transaction
// is rolled back, and the items are acked again one by one.
func TestAckExecFailingStatementFailsOnlyItsItem(t *testing.T) {
	t.Parallel()
	pool, _, q, got := execSetup(t, 6)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX ON exec_results (item_id)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, insertResult, got[4].ID, "taken"); err != nil {
		t.Fatal(err)
	}
	errs := q.AckMany(ctx, execRequests(got), claim.AckOptions{})
	for i, err := range errs {
		if (i == 4) != (err != nil) || errors.Is(err, claim.ErrClaimLost) || errors.Is(err, claim.ErrOutcomeUnknown) {
			t.Fatalf("item %d: %v; only item 4's result cannot be written", i, err)
		}
	}
	if r, left := count(t, pool, `SELECT count(*) FROM exec_results WHERE value <> 'taken'`), count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, got[4].ID); r != 5 || left != 1 {
		t.Fatalf("%d results, item 4 left %d times; want 5 results and item 4 still there", r, left)
	}
}

// A record function beside Exec records runs at once and sees the writes
// of the Exec records before it; the Exec records after it go with COMMIT.
func TestAckExecMixedWithRecordFunctions(t *testing.T) {
	t.Parallel()
	pool, _, q, got := execSetup(t, 5)
	ctx := context.Background()
	reqs := execRequests(got)
	var seen []int
	reqs[2].Record = func(ctx context.Context, tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM exec_results`).Scan(&n); err != nil {
			return err
		}
		seen = append(seen, n) // a retry runs it again
		_, err := tx.Exec(ctx, insertResult, got[2].ID, "from a function")
		return err
	}
	for i, err := range q.AckMany(ctx, reqs, claim.AckOptions{}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if len(seen) == 0 || seen[len(seen)-1] != 2 {
		t.Fatalf("the record function saw %v results; want the 2 of the Exec records before it", seen)
	}
	res := results(t, pool)
	for i, it := range got {
		if res[it.ID.String()] != 1 {
			t.Fatalf("item %d has %d results, want 1 (all: %v)", i, res[it.ID.String()], res)
		}
	}
}

// Serialization failures (40001) raised by the server at a queued
// statement and at the pipelined COMMIT roll the whole transaction back
// and it runs again: every item ends acked with exactly one result, and
// the retries are counted.
func TestAckExecRetriesDoNotWriteTwice(t *testing.T) {
	t.Parallel()
	pool, _, q, got := execSetup(t, 10)
	if testdb.Kind(t) != "postgres" {
		t.Skip("the faults are PostgreSQL triggers (a deferred constraint trigger at COMMIT)")
	}
	ctx := context.Background()
	// Sequences are not transactional: each draw survives the rollback it
	// causes. Every third result insert fails, and the first two COMMITs.
	for _, s := range []string{
		`CREATE SEQUENCE insert_draws`,
		`CREATE SEQUENCE commit_draws`,
		`CREATE FUNCTION fail_some_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('insert_draws') % 3 = 0 THEN
				RAISE EXCEPTION 'injected insert conflict' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER fail_some_inserts BEFORE INSERT ON exec_results FOR EACH ROW EXECUTE FUNCTION fail_some_inserts()`,
		`CREATE FUNCTION fail_first_commits() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('commit_draws') <= 2 THEN
				RAISE EXCEPTION 'injected commit conflict' USING ERRCODE = '40001';
			END IF;
			RETURN NULL;
		END $$`,
		`CREATE CONSTRAINT TRIGGER fail_first_commits AFTER INSERT ON exec_results DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW WHEN (NEW.value = 'v0') EXECUTE FUNCTION fail_first_commits()`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	before := q.Stats().Retries["ack"]
	for i, err := range q.AckMany(ctx, execRequests(got), claim.AckOptions{}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	res := results(t, pool)
	for i, it := range got {
		if res[it.ID.String()] != 1 {
			t.Fatalf("item %d has %d results, want exactly 1 (all: %v)", i, res[it.ID.String()], res)
		}
	}
	var commits int
	if err := pool.QueryRow(ctx, `SELECT last_value FROM commit_draws`).Scan(&commits); err != nil {
		t.Fatal(err)
	}
	if left := count(t, pool, `SELECT count(*) FROM crdbwork_items`); left != 0 || commits < 3 || q.Stats().Retries["ack"]-before < 3 {
		t.Fatalf("%d items left, %d COMMIT draws, %d retries; want 0, at least 3 (two failed), at least 3", left, commits, q.Stats().Retries["ack"]-before)
	}
}

// Under CockroachDB's fault model (CRDBWORK_TEST_FAULTS=crdb: 40001 at the
// statements after BEGIN and at COMMIT, raised by the server at a high rate
// here) every ack of Exec records either commits its items with exactly
// one result each or writes nothing of them; nothing is written twice.
// Without the fault model it checks the same on quiet acks.
func TestAckExecUnderFaults(t *testing.T) {
	t.Parallel()
	const n, per = 120, 12
	pool, _, q, got := execSetup(t, n)
	faults := testdb.FaultsOn()
	if faults {
		testdb.SetFaultRate(t, pool, 0.3, 0)
	}
	ctx := context.Background()
	acked := map[string]bool{}
	for from := 0; from < n; from += per {
		batch := got[from : from+per]
		for i, err := range q.AckMany(ctx, execRequests(batch), claim.AckOptions{}) {
			switch {
			case err == nil:
				acked[batch[i].ID.String()] = true
			case errors.Is(err, claim.ErrOutcomeUnknown):
				t.Fatalf("item %d: %v; the fault model has no unknown outcomes", from+i, err)
			}
		}
	}
	if faults {
		testdb.Quiet(t, pool)
	}
	res := results(t, pool)
	for i, it := range got {
		want := 0
		if acked[it.ID.String()] {
			want = 1
		}
		left := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, it.ID)
		if res[it.ID.String()] != want || left != 1-want {
			t.Fatalf("item %d (acked %v): %d results and %d rows left; want %d and %d", i, want == 1, res[it.ID.String()], left, want, 1-want)
		}
	}
	if len(acked) == 0 || faults && q.Stats().Retries["ack"] == 0 {
		t.Fatalf("%d of %d acked, %d retries; want acks, and retries under the fault model", len(acked), n, q.Stats().Retries["ack"])
	}
}
