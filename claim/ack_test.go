package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
)

// A record that fails only at COMMIT (a deferred unique constraint) inside a
// group-committed AckMany: the batch falls back to acking each item on its
// own, so only the bad item fails; with MaxAttempts 1 it alone ends dead.
// (CockroachDB has no deferred constraints: there the same fallback path is
// taken by the other failures of a batch's transaction — a failing record,
// TestAckEachCommitsTogetherAndIsolatesFailures — and by COMMIT errors other
// than serialization failures and unknown outcomes.)
func TestAckEachFallsBackWhenCommitFails(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if testdb.Kind(t) != "postgres" {
		t.Skip("needs a deferred constraint (PostgreSQL)")
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE outputs (
		k TEXT NOT NULL CONSTRAINT outputs_k_unique UNIQUE DEFERRABLE INITIALLY DEFERRED,
		item_id UUID NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outputs (k, item_id) VALUES ('taken', gen_random_uuid())`); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, pool, claim.Options{MaxAttempts: 1})
	s := startSession(t, ctx, pool)
	const n, bad = 32, 17
	if _, err := q.Enqueue(ctx, payloads(n)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: n})
	if err != nil || len(got) != n {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	reqs := make([]claim.AckRequest, n)
	for i, it := range got {
		key := fmt.Sprint("key-", i)
		if i == bad {
			key = "taken" // accepted by the INSERT, refused at COMMIT
		}
		reqs[i] = claim.AckRequest{Item: it, Record: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO outputs (k, item_id) VALUES ($1, $2)`, key, it.ID)
			return err
		}}
	}
	errs := q.AckMany(ctx, reqs, claim.AckOptions{})
	for i, err := range errs {
		switch {
		case i == bad && err == nil:
			t.Fatal("the item whose record fails at COMMIT was reported acked")
		case i != bad && err != nil:
			t.Fatalf("item %d: %v; only item %d's record fails", i, err, bad)
		}
	}
	t.Logf("the bad item's error: %v", errs[bad])
	if out, err := q.Nack(ctx, got[bad], errs[bad]); err != nil || out != claim.Dead {
		t.Fatalf("nack of the bad item = %v, %v; want Dead", out, err)
	}
	if a, d, left := count(t, pool, `SELECT count(*) FROM outputs WHERE k <> 'taken'`),
		count(t, pool, `SELECT count(*) FROM crdbwork_dead_items`),
		count(t, pool, `SELECT count(*) FROM crdbwork_items`); a != n-1 || d != 1 || left != 0 {
		t.Fatalf("%d results, %d dead, %d items left; want %d, 1, 0", a, d, left, n-1)
	}
}

// A bulk record hook gets, once per transaction and in it, the requests
// whose delete succeeded, after their per-item Records, with their Values.
func TestAckManyBatchRecord(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(6)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 6})
	if err != nil || len(got) != 6 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	if err := q.Release(ctx, got[2]); err != nil { // its claim is lost
		t.Fatal(err)
	}
	var calls [][]string
	var perItem int
	batch := func(ctx context.Context, tx pgx.Tx, acked []claim.AckRequest) error {
		ids := make([]string, len(acked))
		vals := make([]string, len(acked))
		for i, r := range acked {
			ids[i], vals[i] = r.Item.ID.String(), r.Value.(string)
		}
		calls = append(calls, vals)
		_, err := tx.Exec(ctx, `INSERT INTO results (item_id, session_id) SELECT unnest($1::UUID[]), $2`, ids, s.ID())
		return err
	}
	reqs := make([]claim.AckRequest, len(got))
	for i, it := range got {
		reqs[i] = claim.AckRequest{Item: it, Value: fmt.Sprint("v", i), Record: func(context.Context, pgx.Tx) error {
			perItem++
			if len(calls) != 0 {
				return errors.New("Record ran after the batch hook")
			}
			return nil
		}}
	}
	errs := q.AckMany(ctx, reqs, claim.AckOptions{Batch: batch})
	for i, err := range errs {
		if (i == 2) != errors.Is(err, claim.ErrClaimLost) || i != 2 && err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if len(calls) != 1 || strings.Join(calls[0], " ") != "v0 v1 v3 v4 v5" || perItem != 5 {
		t.Fatalf("batch hook calls %v, per-item records %d; want one call with v0 v1 v3 v4 v5, and 5", calls, perItem)
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 5 {
		t.Fatalf("%d results, want 5", n)
	}
}

// Panics in a Record or in the batch hook are recovered inside claim: they
// become that item's error (wrapping ErrRecordPanic, with the stack), and
// the other items of the batch are acked.
func TestRecordPanicsAreRecovered(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(8)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 8})
	if err != nil || len(got) != 8 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	// Ack alone.
	err = q.Ack(ctx, got[0], func(context.Context, pgx.Tx) error { panic("record exploded") })
	if !errors.Is(err, claim.ErrRecordPanic) || !strings.Contains(err.Error(), "record exploded") || !strings.Contains(err.Error(), "ack_test.go") {
		t.Fatalf("Ack with a panicking record = %v, want ErrRecordPanic with the value and stack", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND claim IS NOT NULL`, got[0].ID); n != 1 {
		t.Fatal("the item of a panicked record is not still claimed")
	}
	// A per-item Record and the batch hook (for one Value) panic in AckMany.
	var reqs []claim.AckRequest
	for i, it := range got[1:] {
		r := claim.AckRequest{Item: it, Value: i, Record: record(it)}
		if i == 2 {
			r.Record = func(context.Context, pgx.Tx) error { panic(fmt.Sprint("item ", i)) }
		}
		reqs = append(reqs, r)
	}
	batch := func(_ context.Context, _ pgx.Tx, acked []claim.AckRequest) error {
		for _, r := range acked {
			if r.Value.(int) == 5 {
				panic("batch hook exploded")
			}
		}
		return nil
	}
	errs := q.AckMany(ctx, reqs, claim.AckOptions{Batch: batch})
	for i, err := range errs {
		switch i {
		case 2, 5:
			if !errors.Is(err, claim.ErrRecordPanic) {
				t.Errorf("item %d: %v, want ErrRecordPanic", i, err)
			}
		default:
			if err != nil {
				t.Errorf("item %d: %v, want acked", i, err)
			}
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM results`); n != 5 {
		t.Fatalf("%d results, want 5", n)
	}
	// AckBatch too.
	if _, err := q.AckBatch(ctx, got[:1], func(context.Context, pgx.Tx, []claim.Item) error { panic("batch") }); !errors.Is(err, claim.ErrRecordPanic) {
		t.Fatalf("AckBatch with a panicking record = %v", err)
	}
}

// Error texts are stored whatever bytes they hold: NUL bytes, invalid UTF-8,
// and very long texts, through Nack and through dead-lettering.
func TestNackStoresAnyErrorText(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	s := startSession(t, ctx, pool)
	if _, err := q.Enqueue(ctx, payloads(2)...); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	nasty := "payload \x00\xff\xfe quoted: " + strings.Repeat("é", 20000)
	if _, err := q.Nack(ctx, got[0], errors.New(nasty)); err != nil {
		t.Fatalf("Nack with a binary error text: %v", err)
	}
	if out, err := q.Nack(ctx, got[1], claim.Permanent(errors.New(nasty))); err != nil || out != claim.Dead {
		t.Fatalf("dead-lettering with a binary error text: %v %v", out, err)
	}
	var stored, dead string
	if err := pool.QueryRow(ctx, `SELECT last_error FROM crdbwork_items WHERE id = $1`, got[0].ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT last_error FROM crdbwork_dead_items WHERE id = $1`, got[1].ID).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{stored, dead} {
		if !strings.HasPrefix(s, `payload \x00`+"\uFFFD") || !utf8.ValidString(s) || len(s) > claim.MaxErrorText {
			t.Fatalf("stored error text %q… (%d bytes)", s[:min(len(s), 40)], len(s))
		}
	}
	if got := claim.SafeText("fine"); got != "fine" {
		t.Fatalf("SafeText changed a plain text: %q", got)
	}
}
