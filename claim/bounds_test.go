package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/session"
)

// Every bound of docs/enqueue.md ("Bounds") at the bound and one past it,
// on the real server, through every enqueue path (Enqueue, EnqueueTx,
// Buffer, the COPY of a large call, the SQL function): at the bound the
// item is stored, in a queue whose name is itself at its bound, and the
// items whose texts the indexes hold (key, tenant) move through every
// table (waiting, items, dead items, items again) without a refusal; one
// past it, the call fails with an error that names the limit and nothing
// of it is written. One row per field.
func TestBoundsAtAndOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := incompressible(claim.MaxQueueNameLength)
	// Each subtest has a database of its own, the queue and a session.
	setupBounds := func(t *testing.T) (*pgxpool.Pool, *claim.Queue, *session.Session) {
		t.Helper()
		pool, _ := sqlSetup(t)
		testdb.Quiet(t, pool) // its EnqueueTx path commits the test's own transaction once
		q := newQueue(t, pool, claim.Options{Queue: name})
		// Sequenced: a keyed item's entry in crdbwork_items_sequence_order
		// holds the queue's name and the key.
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
			t.Fatal(err)
		}
		return pool, q, startSession(t, ctx, pool)
	}
	t.Run("queue name", func(t *testing.T) {
		t.Parallel()
		pool, _, _ := setupBounds(t)
		if _, err := claim.New(pool, claim.Options{Queue: name + "x"}); err == nil || !strings.Contains(err.Error(), "MaxQueueNameLength") {
			t.Fatalf("a queue name of %d bytes: %v; want an error naming MaxQueueNameLength", len(name)+1, err)
		}
	})
	key, tenant := incompressible(claim.MaxKeyLength), incompressible(claim.MaxKeyLength + 1)[1:]
	prereqs := make([]uuid.UUID, claim.MaxAfter+1)
	for i := range prereqs {
		prereqs[i] = uuid.New()
	}

	type sqlArgs struct {
		args string
		vals []any
	}
	for _, c := range []struct {
		field     string
		at, over  claim.NewItem
		limit     string // what the error of over names
		sqlAt     *sqlArgs
		sqlOver   *sqlArgs
		sqlLimit  string
		moves     bool // the item at the bound is moved through every table
		bigPrereq bool // its After names MaxAfter prerequisites, enqueued first
	}{
		{field: "key", at: claim.NewItem{Key: key}, over: claim.NewItem{Key: key + "k"}, limit: "MaxKeyLength", moves: true,
			sqlAt: &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "key", "$2"), []any{name, key}}, sqlOver: &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "key", "$2"), []any{name, key + "k"}},
			sqlLimit: "the key is 2049 bytes, the limit is 2048"},
		{field: "tenant", at: claim.NewItem{Tenant: tenant}, over: claim.NewItem{Tenant: tenant + "t"}, limit: "MaxKeyLength", moves: true,
			sqlAt: &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "tenant", "$2"), []any{name, tenant}}, sqlOver: &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "tenant", "$2"), []any{name, tenant + "t"}},
			sqlLimit: "the tenant is 2049 bytes, the limit is 2048"},
		{field: "unique key", at: claim.NewItem{UniqueKey: incompressible(claim.MaxUniqueKeyLength)},
			over: claim.NewItem{UniqueKey: incompressible(claim.MaxUniqueKeyLength + 1)}, limit: "MaxUniqueKeyLength"},
		{field: "payload", at: claim.NewItem{Payload: make([]byte, claim.DefaultMaxPayload)},
			over: claim.NewItem{Payload: make([]byte, claim.DefaultMaxPayload+1)}, limit: "MaxPayload",
			sqlAt:    &sqlArgs{`$1, $2`, []any{name, make([]byte, claim.DefaultMaxPayload)}},
			sqlOver:  &sqlArgs{`$1, $2`, []any{name, make([]byte, claim.DefaultMaxPayload+1)}},
			sqlLimit: "the payload is 1048577 bytes"},
		{field: "metadata", at: claim.NewItem{Metadata: make([]byte, claim.DefaultMaxPayload)},
			over: claim.NewItem{Metadata: make([]byte, claim.DefaultMaxPayload+1)}, limit: "MaxPayload",
			sqlAt:    &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "metadata", "$2"), []any{name, make([]byte, claim.DefaultMaxPayload)}},
			sqlOver:  &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "metadata", "$2"), []any{name, make([]byte, claim.DefaultMaxPayload+1)}},
			sqlLimit: "the metadata is 1048577 bytes"},
		{field: "headers", at: claim.NewItem{Headers: map[string]string{"h": strings.Repeat("v", claim.MaxHeadersBytes-1)}},
			over: claim.NewItem{Headers: map[string]string{"h": strings.Repeat("v", claim.MaxHeadersBytes)}}, limit: "MaxHeadersBytes",
			sqlAt:    &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "headers", "jsonb_build_object('h', repeat('v', 16383))"), []any{name}},
			sqlOver:  &sqlArgs{testdb.EnqueueArgs("$1", "''::BYTEA", "headers", "jsonb_build_object('h', repeat('v', 16384))"), []any{name}},
			sqlLimit: "over 16384 bytes"},
		{field: "after", at: claim.NewItem{After: prereqs[:claim.MaxAfter]}, over: claim.NewItem{After: prereqs}, limit: "MaxAfter",
			bigPrereq: true},
	} {
		t.Run(c.field, func(t *testing.T) {
			t.Parallel()
			pool, q, s := setupBounds(t)
			if c.bigPrereq {
				items := make([]claim.NewItem, claim.MaxAfter)
				for i := range items {
					items[i] = claim.NewItem{ID: prereqs[i], Payload: []byte("p")}
				}
				if _, err := q.Enqueue(ctx, items...); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_, _ = pool.Exec(ctx, `DELETE FROM crdbwork_items WHERE id = ANY($1)`, prereqs)
				})
			}
			paths := []struct {
				name    string
				enqueue func(it claim.NewItem) (claim.Enqueued, error)
			}{
				{"Enqueue", func(it claim.NewItem) (claim.Enqueued, error) { return q.Enqueue(ctx, it) }},
				{"EnqueueTx", func(it claim.NewItem) (claim.Enqueued, error) {
					var res claim.Enqueued
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						var err error
						res, err = q.EnqueueTx(ctx, tx, it)
						return err
					})
					return res, err
				}},
				{"COPY", func(it claim.NewItem) (claim.Enqueued, error) {
					// 64 items with generated ids go by COPY.
					items := make([]claim.NewItem, 64)
					for i := range items {
						items[i] = claim.NewItem{Payload: []byte("x")}
					}
					items[63] = it
					res, err := q.Enqueue(ctx, items...)
					if err == nil {
						res.IDs, res.New = res.IDs[63:], res.New[63:]
					}
					return res, err
				}},
				{"Buffer", func(it claim.NewItem) (claim.Enqueued, error) {
					b, err := claim.NewBuffer(q, claim.BufferOptions{})
					if err != nil {
						return claim.Enqueued{}, err
					}
					defer b.Close(ctx)
					return b.Enqueue(ctx, it)
				}},
			}
			for _, p := range paths {
				if p.name == "COPY" && (c.field == "unique key" || c.bigPrereq) {
					continue // a caller-given or derived id, or dependencies: not the COPY
				}
				before := rowsOf(t, pool, name)
				{
					at := c.at
					if at.UniqueKey != "" {
						at.UniqueKey = at.UniqueKey[:len(at.UniqueKey)-1] + p.name[len(p.name)-1:] // one item per path
					}
					res, err := p.enqueue(at)
					if err != nil || !res.New[0] {
						t.Fatalf("%s at the bound: %+v, %v; want added", p.name, res, err)
					}
					if c.moves && p.name == "Enqueue" {
						moveEverywhere(t, q, s.ID(), at)
					}
				}
				before = rowsOf(t, pool, name)
				_, err := p.enqueue(c.over)
				if err == nil || !strings.Contains(err.Error(), c.limit) {
					t.Fatalf("%s one past the bound: %v; want an error naming %s", p.name, err, c.limit)
				}
				if after := rowsOf(t, pool, name); after != before {
					t.Fatalf("%s one past the bound wrote rows: %d before, %d after", p.name, before, after)
				}
			}
			if c.sqlAt == nil {
				return
			}
			if r, err := sqlEnqueue(ctx, pool, c.sqlAt.args, c.sqlAt.vals...); err != nil || !r.Added {
				t.Fatalf("crdbwork_enqueue at the bound: %+v, %v; want added", r, err)
			}
			before := rowsOf(t, pool, name)
			if _, err := sqlEnqueue(ctx, pool, c.sqlOver.args, c.sqlOver.vals...); err == nil || !strings.Contains(err.Error(), c.sqlLimit) {
				t.Fatalf("crdbwork_enqueue one past the bound: %v; want %q", err, c.sqlLimit)
			}
			if after := rowsOf(t, pool, name); after != before {
				t.Fatalf("crdbwork_enqueue one past the bound wrote rows: %d before, %d after", before, after)
			}
		})
	}

	// Not enqueue paths, with bounds of their own.
	t.Run("checkpoint", func(t *testing.T) {
		t.Parallel()
		_, q, s := setupBounds(t)
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("cp"), Priority: -10}); err != nil {
			t.Fatal(err)
		}
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil || len(items) != 1 {
			t.Fatalf("claim: %d, %v", len(items), err)
		}
		if err := q.SaveCheckpoint(ctx, items[0], make([]byte, claim.MaxCheckpointSize)); err != nil {
			t.Fatalf("a checkpoint at the bound: %v", err)
		}
		if err := q.SaveCheckpoint(ctx, items[0], make([]byte, claim.MaxCheckpointSize+1)); !errors.Is(err, claim.ErrCheckpointTooLarge) {
			t.Fatalf("a checkpoint one past the bound: %v; want ErrCheckpointTooLarge", err)
		}
		if err := q.Ack(ctx, items[0], nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("tenant limit", func(t *testing.T) {
		t.Parallel()
		pool, q, _ := setupBounds(t)
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{tenant: &claim.Limit{MaxInFlight: 1}}}); err != nil {
			t.Fatalf("a tenant limit at the bound: %v", err)
		}
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{tenant + "t": &claim.Limit{MaxInFlight: 1}}}); err == nil || !strings.Contains(err.Error(), "MaxKeyLength") {
			t.Fatalf("a tenant limit one past the bound: %v; want an error naming MaxKeyLength", err)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_tenant_limits WHERE queue = $1`, name); n != 1 {
			t.Fatalf("%d tenant limits stored, want 1", n)
		}
	})
}

// rowsOf counts queue's rows in the items, waiting and dead-items tables.
func rowsOf(t *testing.T, pool *pgxpool.Pool, queue string) int {
	t.Helper()
	return countRows(t, pool, `SELECT (SELECT count(*) FROM crdbwork_items WHERE queue = $1) + (SELECT count(*) FROM crdbwork_waiting WHERE queue = $1)
		+ (SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1)`, queue)
}

// moveEverywhere enqueues a copy of it that waits for a new prerequisite,
// and moves it through every table: released into the items table by the
// prerequisite's ack, dead by a permanent failure, requeued into the items
// table, acked. None of the moves may be refused.
func moveEverywhere(t *testing.T, q *claim.Queue, session uuid.UUID, it claim.NewItem) {
	t.Helper()
	ctx := context.Background()
	prereq, id := uuid.New(), uuid.New()
	it.ID, it.Priority, it.After = id, -100, []uuid.UUID{prereq}
	res, err := q.Enqueue(ctx, claim.NewItem{ID: prereq, Payload: []byte("p"), Priority: -200}, it)
	if err != nil || !res.Waiting[1] {
		t.Fatalf("enqueue as a waiting item: %+v, %v", res, err)
	}
	// next claims want. The queue is sequenced: a keyed item released or
	// requeued keeps its place in its key's order, behind the items of its
	// key enqueued before it (the item at the bound), which are acked
	// first.
	next := func(want uuid.UUID) claim.Item {
		t.Helper()
		for range 10 {
			items, err := q.Claimer(session).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil || len(items) != 1 {
				t.Fatalf("claim: %d items, %v; want %s", len(items), err, want)
			}
			if items[0].ID == want {
				return items[0]
			}
			if items[0].Key != it.Key || items[0].Tenant != it.Tenant {
				t.Fatalf("claimed %s, not an item of the bound's key, before %s", items[0].ID, want)
			}
			if err := q.Ack(ctx, items[0], nil); err != nil {
				t.Fatal(err)
			}
		}
		t.Fatalf("%s was not claimed (its move was refused?)", want)
		return claim.Item{}
	}
	if p := next(prereq); p.ID != prereq {
		t.Fatalf("claimed %s, want the prerequisite", p.ID)
	} else if err := q.Ack(ctx, p, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := queuemaint.For(q).Reap(ctx); err != nil || st.Refused != 0 || st.Stuck != 0 {
		t.Fatalf("Reap after the release: %+v, %v", st, err)
	}
	got := next(id)
	if _, err := q.Nack(ctx, got, claim.Permanent(errors.New("to the dead items"))); err != nil {
		t.Fatalf("nack to the dead items: %v", err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: id})); err != nil || !ok {
		t.Fatalf("requeue: %v, %v", ok, err)
	}
	got = next(id)
	if got.ID != id || got.Key != it.Key || got.Tenant != it.Tenant {
		t.Fatalf("claimed %s (key %d bytes, tenant %d bytes) after the requeue, want %s as enqueued", got.ID, len(got.Key), len(got.Tenant), id)
	}
	if err := q.Ack(ctx, got, nil); err != nil {
		t.Fatal(err)
	}
}
