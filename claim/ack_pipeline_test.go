package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// pipeTracer counts the batches and the plain statements (BEGIN of a
// pgx.Tx included) a pool sends.
type pipeTracer struct {
	mu      sync.Mutex
	batches []int // statements per batch
	queries []string
}

func (p *pipeTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	p.mu.Lock()
	p.queries = append(p.queries, d.SQL)
	p.mu.Unlock()
	return ctx
}
func (p *pipeTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *pipeTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	p.mu.Lock()
	p.batches = append(p.batches, d.Batch.Len())
	p.mu.Unlock()
	return ctx
}
func (p *pipeTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (p *pipeTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (p *pipeTracer) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches, p.queries = nil, nil
}

func (p *pipeTracer) seen() ([]int, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.batches...), append([]string(nil), p.queries...)
}

// pipelineSetup returns a pool on a fresh database with the schema, a
// table of result rows whose primary key is the item's id, and the pool's
// tracer; and a session that has claimed n items.
func pipelineSetup(t *testing.T, n int) (*pgxpool.Pool, *pipeTracer, *claim.Queue, []claim.Item) {
	t.Helper()
	direct := setup(t)
	if testdb.Kind(t) != "postgres" {
		t.Skip("the pipelined ack is PostgreSQL's")
	}
	testdb.Quiet(t, direct) // the tests count the pipelines and the records' calls: a retry would add some
	ctx := context.Background()
	if _, err := direct.Exec(ctx, `CREATE TABLE pipe_results (item_id UUID PRIMARY KEY, value TEXT NOT NULL)`); err != nil {
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

// pipeStatement records each acked request's Value in pipe_results, and
// keeps the values of every call.
func pipeStatement(calls *[][]string) claim.BatchStatement {
	return func(acked []claim.AckRequest) (string, []any) {
		ids := make([]string, len(acked))
		vals := make([]string, len(acked))
		for i, r := range acked {
			ids[i], vals[i] = r.Item.ID.String(), r.Value.(string)
		}
		*calls = append(*calls, vals)
		return `INSERT INTO pipe_results (item_id, value) SELECT * FROM unnest($1::UUID[], $2::TEXT[])`, []any{ids, vals}
	}
}

func pipeRequests(items []claim.Item) []claim.AckRequest {
	reqs := make([]claim.AckRequest, len(items))
	for i, it := range items {
		reqs[i] = claim.AckRequest{Item: it, Value: fmt.Sprint("v", i)}
	}
	return reqs
}

// With its results given as one statement, an ack transaction is one
// batch — BEGIN, the fenced delete, the statement, COMMIT — and nothing
// else but what follows every committed ack, whatever its path: the
// release of the acked items' dependents, which in a queue without
// dependencies is one probe of its edges (one index seek, LIMIT 1) at most
// once a second per process: every item is deleted and its result written
// once.
func TestAckPipelineIsOneBatch(t *testing.T) {
	t.Parallel()
	pool, tr, q, got := pipelineSetup(t, 8)
	ctx := context.Background()
	var calls [][]string
	tr.reset()
	errs := q.AckMany(ctx, pipeRequests(got), claim.AckOptions{Statement: pipeStatement(&calls)})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	batches, queries := tr.seen()
	var others []string
	for _, sql := range queries {
		if !strings.Contains(sql, "crdbwork_waits_for") || !strings.Contains(sql, "LIMIT 1") {
			others = append(others, sql) // not the probe of the queue's edges
		}
	}
	if len(batches) != 1 || batches[0] != 4 || len(others) != 0 || len(queries) > 1 {
		t.Fatalf("sent batches of %v statements and the statements %q; want one batch of 4 and at most the probe of the queue's edges", batches, queries)
	}
	if len(calls) != 1 || strings.Join(calls[0], " ") != "v0 v1 v2 v3 v4 v5 v6 v7" {
		t.Fatalf("statement calls %v; want one with v0 … v7", calls)
	}
	if r, left := count(t, pool, `SELECT count(*) FROM pipe_results AS r JOIN crdbwork_ended AS e ON e.id = r.item_id`),
		count(t, pool, `SELECT count(*) FROM crdbwork_items`); r != 8 || left != 0 {
		t.Fatalf("%d results of ended items, %d items left; want 8 and 0", r, left)
	}
	if st := q.Stats(); st.Acked != 8 || st.LostClaims != 0 {
		t.Fatalf("stats %+v: want 8 acked, none lost", st)
	}
}

// A lost claim stops the pipelined transaction before COMMIT: nothing of it
// is written, and the ordinary ack then acks the items whose claims held
// and reports the lost one; its result is never written.
func TestAckPipelineLostClaimWritesNothingOfIt(t *testing.T) {
	t.Parallel()
	pool, tr, q, got := pipelineSetup(t, 6)
	ctx := context.Background()
	if err := q.Release(ctx, got[2]); err != nil { // its claim is lost
		t.Fatal(err)
	}
	var calls [][]string
	tr.reset()
	errs := q.AckMany(ctx, pipeRequests(got), claim.AckOptions{Statement: pipeStatement(&calls)})
	for i, err := range errs {
		if (i == 2) != errors.Is(err, claim.ErrClaimLost) || i != 2 && err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if len(calls) != 2 || strings.Join(calls[0], " ") != "v0 v1 v2 v3 v4 v5" || strings.Join(calls[1], " ") != "v0 v1 v3 v4 v5" {
		t.Fatalf("statement calls %v; want the pipeline's (all six) and then the ordinary ack's (without v2)", calls)
	}
	if batches, _ := tr.seen(); len(batches) != 3 || batches[0] != 4 || batches[1] != 2 || batches[2] != 2 {
		t.Fatalf("batches of %v statements; want the one pipeline (4), then the ordinary ack's BEGIN with its delete (2) and its statement with COMMIT (2)", batches)
	}
	var lostResults int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pipe_results WHERE item_id = $1`, got[2].ID).Scan(&lostResults); err != nil {
		t.Fatal(err)
	}
	if r, left := count(t, pool, `SELECT count(*) FROM pipe_results`), count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE claim IS NULL`); r != 5 || left != 1 || lostResults != 0 {
		t.Fatalf("%d results (%d of the lost item), %d unclaimed items left; want 5, 0, 1", r, lostResults, left)
	}
	// The connection the failed pipeline used went back to the pool usable.
	for range 4 {
		if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
	}
}

// A results' statement that fails (here: one item's result row exists
// already) rolls the pipelined transaction back; the ordinary ack then
// isolates the item it cannot record, and acks the others.
func TestAckPipelineFailingStatementIsolatesItsItem(t *testing.T) {
	t.Parallel()
	pool, _, q, got := pipelineSetup(t, 5)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO pipe_results (item_id, value) VALUES ($1, 'taken')`, got[3].ID); err != nil {
		t.Fatal(err)
	}
	var calls [][]string
	errs := q.AckMany(ctx, pipeRequests(got), claim.AckOptions{Statement: pipeStatement(&calls)})
	for i, err := range errs {
		if (i == 3) != (err != nil) {
			t.Fatalf("item %d: %v; only item 3's result cannot be written", i, err)
		}
	}
	if r, left := count(t, pool, `SELECT count(*) FROM pipe_results WHERE value <> 'taken'`), count(t, pool, `SELECT count(*) FROM crdbwork_items`); r != 4 || left != 1 {
		t.Fatalf("%d results, %d items left; want 4 and the unrecorded item", r, left)
	}
}

// Where the pipeline does not apply (a per-item Record, or a Go
// BatchRecord beside the statement) the ordinary transaction runs every
// record, the statement included.
func TestAckStatementWithoutPipeline(t *testing.T) {
	t.Parallel()
	pool, tr, q, got := pipelineSetup(t, 4)
	ctx := context.Background()
	var calls [][]string
	var batchCalls int
	reqs := pipeRequests(got)
	tr.reset()
	errs := q.AckMany(ctx, reqs, claim.AckOptions{Statement: pipeStatement(&calls), Batch: func(context.Context, pgx.Tx, []claim.AckRequest) error {
		batchCalls++
		if len(calls) != 0 {
			return errors.New("the statement ran before the BatchRecord")
		}
		return nil
	}})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	// The ordinary transaction: BEGIN with the delete, then the statement
	// with COMMIT.
	if batches, queries := tr.seen(); len(batches) != 2 || batches[0] != 2 || batches[1] != 2 || len(queries) != 0 || batchCalls != 1 || len(calls) != 1 {
		t.Fatalf("batches of %v statements, %d other statements, %d BatchRecord calls, %d statement calls; want [2 2], 0, 1, 1", batches, len(queries), batchCalls, len(calls))
	}
	if r := count(t, pool, `SELECT count(*) FROM pipe_results`); r != 4 {
		t.Fatalf("%d results, want 4", r)
	}
}
