package claim_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// storedRow describes what the database holds for id: its row in the items
// table or in the waiting items, with every column an enqueue option fills
// (times as offsets from the enqueue, which differs between two enqueues),
// or "absent". The part (and a waiting item's hash, which fixes it) shows
// only with placed: an item without a key is placed round-robin (or, a
// tenant's in a fair queue, by turn), which differs between two enqueues.
func storedRow(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, placed bool) string {
	t.Helper()
	ctx := context.Background()
	var row string
	var (
		part, priority, maxAttempts, attempts int64
		key, tenant, headers                  *string
		timeoutUS                             *int64
		enqueuedAt, vestingAt                 time.Time
		expiresAt                             *time.Time
		amo, sequenced                        bool
		payload, metadata                     []byte
	)
	err := pool.QueryRow(ctx, `SELECT part, item_key, priority, enqueued_at, vesting_at, max_attempts, tenant, expires_at,
		    at_most_once, seq_order IS NOT NULL, headers::TEXT, payload, metadata, attempts, timeout_us
		FROM crdbwork_items WHERE id = $1`, id).Scan(&part, &key, &priority, &enqueuedAt, &vestingAt, &maxAttempts, &tenant,
		&expiresAt, &amo, &sequenced, &headers, &payload, &metadata, &attempts, &timeoutUS)
	switch {
	case err == nil:
		ttl := "-"
		if expiresAt != nil {
			ttl = expiresAt.Sub(enqueuedAt).String()
		}
		row = fmt.Sprintf("item part=%d key=%s priority=%d delay=%v max_attempts=%d tenant=%s ttl=%s at_most_once=%v sequenced=%v headers=%s payload=%q metadata=%q attempts=%d timeout=%s",
			part, orDash(key), priority, vestingAt.Sub(enqueuedAt), maxAttempts, orDash(tenant), ttl, amo, sequenced, orDash(headers),
			payload, metadata, attempts, usOrDash(timeoutUS))
	case errors.Is(err, pgx.ErrNoRows):
		var hash, delayUS, ttlUS, remaining int64
		err = pool.QueryRow(ctx, `SELECT hash, item_key, priority, delay_us, max_attempts, tenant, ttl_us, at_most_once, payload, metadata, remaining, timeout_us
			FROM crdbwork_waiting WHERE id = $1`, id).Scan(&hash, &key, &priority, &delayUS, &maxAttempts, &tenant, &ttlUS, &amo,
			&payload, &metadata, &remaining, &timeoutUS)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return "absent"
		case err != nil:
			t.Fatal(err)
		}
		row = fmt.Sprintf("waiting hash=%d key=%s priority=%d delay=%v max_attempts=%d tenant=%s ttl=%v at_most_once=%v payload=%q metadata=%q remaining=%d timeout=%s",
			hash, orDash(key), priority, time.Duration(delayUS)*time.Microsecond, maxAttempts, orDash(tenant),
			time.Duration(ttlUS)*time.Microsecond, amo, payload, metadata, remaining, usOrDash(timeoutUS))
	default:
		t.Fatal(err)
	}
	if !placed {
		row = partOrHash.ReplaceAllString(row, "$1=?")
	}
	return row
}

func usOrDash(us *int64) string {
	if us == nil {
		return "-"
	}
	return (time.Duration(*us) * time.Microsecond).String()
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// A Buffer honours every option of NewItem exactly as Enqueue does: for
// each option (and each kind of queue an option needs: sequenced for Key's
// order, fair for Tenant's turns), the same item enqueued directly in one
// queue and through a Buffer in a twin queue ends up as the same row
// (items or waiting items, every column the options fill), with the same
// Enqueued answer and the same claimability; prerequisites that are
// refused are refused the same way. Every case's queues share one database
// (about thirty queues), as in a deployment.
//
// Before the fix, the Buffer wrote an item with After as a plain item:
// claimable while its prerequisite was still queued, Enqueued.Waiting
// empty, no error.
func TestBufferHonoursEveryItemOption(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	type env struct {
		q     *claim.Queue
		p     uuid.UUID // a queued prerequisite
		acked uuid.UUID // an acked prerequisite
		dead  uuid.UUID // a dead prerequisite
	}
	for _, c := range []struct {
		name      string
		sequenced bool
		fair      bool
		item      func(e env) claim.NewItem
		// wantErr: the enqueue is refused with this error
		wantErr error
		// waiting: the item waits for e.p (not claimable until its ack)
		waiting bool
		// twice: enqueued a second time through the same path, it is a
		// duplicate (Enqueued.New false)
		twice bool
	}{
		{name: "plain", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("plain")} }},
		{name: "key-priority-attempts-metadata-headers", item: func(env) claim.NewItem {
			return claim.NewItem{Payload: []byte("k"), Key: "order-7", Priority: 3, MaxAttempts: 4, Metadata: []byte("meta"),
				Headers: map[string]string{"traceparent": "00-abc-def-01"}}
		}},
		{name: "urgent-priority", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("u"), Priority: -10} }},
		{name: "delay", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("d"), Delay: time.Hour} }},
		{name: "ttl", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("t"), TTL: 90 * time.Minute} }},
		{name: "timeout", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("t"), Timeout: 42 * time.Second} }},
		{name: "at-most-once", item: func(env) claim.NewItem { return claim.NewItem{Payload: []byte("a"), AtMostOnce: true} }},
		{name: "unique-key", twice: true, item: func(env) claim.NewItem {
			return claim.NewItem{Payload: []byte("once"), UniqueKey: "nightly", UniquePeriod: 24 * time.Hour}
		}},
		{name: "given-id", twice: true, item: func(e env) claim.NewItem { return claim.NewItem{ID: idOf(e.q.Name()), Payload: []byte("g")} }},
		{name: "key-in-sequenced-queue", sequenced: true, item: func(env) claim.NewItem {
			return claim.NewItem{Payload: []byte("s"), Key: "account-1"}
		}},
		{name: "tenant-in-fair-queue", fair: true, item: func(env) claim.NewItem {
			return claim.NewItem{Payload: []byte("f"), Tenant: "acme"}
		}},
		{name: "after", waiting: true, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.p}}
		}},
		{name: "after-every-option", waiting: true, twice: true, item: func(e env) claim.NewItem {
			return claim.NewItem{ID: idOf(e.q.Name()), Payload: []byte("w"), After: []uuid.UUID{e.p, e.acked}, Key: "k", Priority: 2,
				Delay: time.Minute, TTL: 2 * time.Hour, Tenant: "acme", MaxAttempts: 3, Metadata: []byte("m"), Timeout: time.Minute}
		}},
		{name: "after-at-most-once", waiting: true, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.p}, AtMostOnce: true}
		}},
		{name: "after-key-in-sequenced-queue", sequenced: true, waiting: true, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.p}, Key: "account-1"}
		}},
		{name: "after-tenant-in-fair-queue", fair: true, waiting: true, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.p}, Tenant: "acme"}
		}},
		{name: "after-acked", item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.acked}}
		}},
		{name: "after-dead", wantErr: claim.ErrPrerequisiteDied, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.dead}}
		}},
		{name: "unique-states", twice: true, item: func(env) claim.NewItem {
			return claim.NewItem{Payload: []byte("again"), UniqueKey: "refresh", UniqueStates: claim.UniqueLive}
		}},
		{name: "after-run-after", waiting: true, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.p}, RunAfter: claim.PrereqDied | claim.PrereqCancelled}
		}},
		{name: "after-dead-run-after", item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{e.dead}, RunAfter: claim.PrereqDied}
		}},
		{name: "after-unknown", wantErr: claim.ErrPrerequisiteUnknown, item: func(e env) claim.NewItem {
			return claim.NewItem{Payload: []byte("w"), After: []uuid.UUID{uuid.New()}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // queues of their own, in the shared database
			var rows [2]string
			var answers [2]string
			for n, path := range []string{"direct", "buffer"} {
				name := c.name + "-" + path
				if _, err := partition.EnsureParts(ctx, pool, crsql.Tables{}, name, 4); err != nil {
					t.Fatal(err)
				}
				q := newQueue(t, pool, claim.Options{Queue: name})
				if c.sequenced {
					if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
						t.Fatal(err)
					}
				}
				if c.fair {
					if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &claim.Policy{Fair: true}}); err != nil {
						t.Fatal(err)
					}
				}
				// The prerequisites: one acked, one dead (claimed and
				// ended in that order), one left queued.
				e := env{q: q, p: uuid.New(), acked: uuid.New(), dead: uuid.New()}
				for _, id := range []uuid.UUID{e.acked, e.dead} {
					if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("prerequisite")}); err != nil {
						t.Fatal(err)
					}
					it := claimOne(t, q, s.ID())
					if id == e.acked {
						err := q.Ack(ctx, it, nil)
						if err != nil {
							t.Fatal(err)
						}
					} else if out, err := q.Nack(ctx, it, claim.Permanent(errors.New("dies"))); err != nil || out != claim.Dead {
						t.Fatalf("prerequisite's death: %v, %v", out, err)
					}
				}
				if _, err := q.Enqueue(ctx, claim.NewItem{ID: e.p, Payload: []byte("prerequisite")}); err != nil {
					t.Fatal(err)
				}
				enqueue := func(it claim.NewItem) (claim.Enqueued, error) { return q.Enqueue(ctx, it) }
				if path == "buffer" {
					buf := newBuffer(t, q, claim.BufferOptions{})
					enqueue = func(it claim.NewItem) (claim.Enqueued, error) { return buf.Enqueue(ctx, it) }
				}
				item := c.item(e)
				res, err := enqueue(item)
				if c.wantErr != nil {
					if !errors.Is(err, c.wantErr) {
						t.Fatalf("%s: enqueue = %+v, %v; want %v", path, res, err, c.wantErr)
					}
					if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND id <> $2`, name, e.p) +
						countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`, name); n != 0 {
						t.Fatalf("%s: a refused enqueue left %d rows", path, n)
					}
					answers[n] = "refused"
					continue
				}
				if err != nil {
					t.Fatalf("%s: enqueue: %v", path, err)
				}
				id := res.IDs[0]
				if item.UniqueKey != "" && id != claim.UniqueID(name, item.UniqueKey, item.UniquePeriod, time.Now()) {
					t.Fatalf("%s: id %s is not the unique key's", path, id)
				}
				answers[n] = fmt.Sprintf("new=%v done=%v waiting=%v", res.New, res.Done, res.Waiting)
				if c.twice {
					again, err := enqueue(item)
					if err != nil || again.IDs[0] != id || again.New[0] {
						t.Fatalf("%s: the second enqueue = %+v, %v; want a duplicate of %s", path, again, err, id)
					}
					answers[n] += fmt.Sprintf("; again new=%v done=%v waiting=%v", again.New, again.Done, again.Waiting)
				}
				rows[n] = storedRow(t, pool, id, item.Key != "" || item.Tenant != "" && !c.fair)
				// Claimable now only if it does not wait (and is not
				// delayed); the prerequisite is.
				got := idSet(claimEvery(t, q, s.ID()))
				if !got[e.p] {
					t.Fatalf("%s: the queued prerequisite was not claimable", path)
				}
				wantNow := !c.waiting && item.Delay == 0
				if got[id] != wantNow {
					t.Fatalf("%s: the item claimable at once: %v, want %v (row %s)", path, got[id], wantNow, rows[n])
				}
			}
			t.Logf("stored both ways: %s; answered %s", rows[1], answers[1])
			if answers[0] != answers[1] {
				t.Errorf("Enqueue answered %q, the Buffer %q", answers[0], answers[1])
			}
			if rows[0] != rows[1] {
				t.Errorf("rows differ:\n  Enqueue: %s\n  Buffer:  %s", rows[0], rows[1])
			}
			if c.waiting && answers[1] != "" && rows[1][:7] != "waiting" {
				t.Errorf("the item is %s, want a waiting item", rows[1])
			}
		})
	}
}

// partOrHash matches the part of a stored row, or a waiting item's hash.
var partOrHash = regexp.MustCompile(`\b(part|hash)=[0-9]+`)

// idOf returns a fixed id for a name.
func idOf(name string) uuid.UUID { return uuid.NewSHA1(uuid.NameSpaceOID, []byte(name)) }

// Items of many callers that share a flush, some with prerequisites: those
// whose prerequisites are refused (unknown, dead) fail alone, with the same
// error as from Enqueue; the others are added, waiting or not as Enqueue
// would add them, and the dependents run only after their prerequisites'
// acks. (A flush with prerequisites is one transaction; a refused
// prerequisite splits it, as a refused id does.)
func TestBufferPrerequisitesInSharedFlushes(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	s := startSession(t, ctx, pool)
	q := newQueue(t, pool, claim.Options{Queue: "shared-flush"})
	other := newQueue(t, pool, claim.Options{Queue: "neighbour"})
	if _, err := other.Enqueue(ctx, payloads(100)...); err != nil {
		t.Fatal(err)
	}
	roots := make([]uuid.UUID, 4)
	for i := range roots {
		roots[i] = uuid.New()
		if _, err := q.Enqueue(ctx, claim.NewItem{ID: roots[i], Payload: []byte("root")}); err != nil {
			t.Fatal(err)
		}
	}
	dead := uuid.New()
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: dead, Payload: []byte("dies"), Priority: -1}); err != nil {
		t.Fatal(err)
	}
	if out, err := q.Nack(ctx, claimOne(t, q, s.ID()), claim.Permanent(errors.New("dies"))); err != nil || out != claim.Dead {
		t.Fatalf("death: %v, %v", out, err)
	}
	otherID := uuid.New()
	if _, err := other.Enqueue(ctx, claim.NewItem{ID: otherID, Payload: []byte("elsewhere")}); err != nil {
		t.Fatal(err)
	}
	const n = 40
	// Every item waits in the buffer until all n have come: one flush.
	buf := newBuffer(t, q, claim.BufferOptions{MaxItems: n, MaxWait: time.Hour})
	type answer struct {
		res claim.Enqueued
		err error
	}
	answers := make([]answer, n)
	items := make([]claim.NewItem, n)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte(fmt.Sprint(i))}
		switch i % 8 {
		case 1, 2:
			items[i].After = []uuid.UUID{roots[i%len(roots)]}
		case 3:
			items[i].After = []uuid.UUID{uuid.New()} // unknown
		case 5:
			items[i].After = []uuid.UUID{dead}
		case 6:
			items[i].After = []uuid.UUID{otherID} // another queue's
		}
	}
	var wg sync.WaitGroup
	for i := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i].res, answers[i].err = buf.Enqueue(ctx, items[i])
		}()
	}
	wg.Wait()
	if st := buf.Stats(); st.Splits == 0 {
		t.Fatalf("stats %+v: the items did not share a flush that was split", st)
	}
	waiting := map[uuid.UUID]uuid.UUID{} // dependent → its root
	added := 0
	for i, a := range answers {
		var want error
		switch i % 8 {
		case 3:
			want = claim.ErrPrerequisiteUnknown
		case 5:
			want = claim.ErrPrerequisiteDied
		case 6:
			want = claim.ErrPrerequisiteOtherQueue
		}
		switch {
		case want != nil:
			if !errors.Is(a.err, want) {
				t.Fatalf("item %d: %v, want %v", i, a.err, want)
			}
		case a.err != nil:
			t.Fatalf("item %d failed: %v", i, a.err)
		case len(items[i].After) > 0:
			if !a.res.New[0] || len(a.res.Waiting) != 1 || !a.res.Waiting[0] {
				t.Fatalf("item %d: %+v, want new and waiting", i, a.res)
			}
			waiting[a.res.IDs[0]] = items[i].After[0]
			added++
		default:
			if !a.res.New[0] || a.res.Waiting != nil {
				t.Fatalf("item %d: %+v, want new, not waiting", i, a.res)
			}
			added++
		}
	}
	if got := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'shared-flush'`) +
		countRows(t, pool, `SELECT count(*) FROM crdbwork_waiting WHERE queue = 'shared-flush'`); got != added+len(roots) {
		t.Fatalf("%d rows in the queue, want the %d items added and the %d roots", got, added, len(roots))
	}
	// The dependents run after their roots, and only then.
	acked := map[uuid.UUID]bool{}
	for round := 0; len(acked) < added+len(roots); round++ {
		got := claimEvery(t, q, s.ID())
		if len(got) == 0 {
			t.Fatalf("round %d: nothing claimable with %d of %d items acked", round, len(acked), added+len(roots))
		}
		for _, it := range got {
			if root, ok := waiting[it.ID]; ok && !acked[root] {
				t.Fatalf("dependent %s claimed before its root was acked", it.ID)
			}
		}
		for _, it := range got {
			if err := q.Ack(ctx, it, nil); err != nil {
				t.Fatal(err)
			}
			acked[it.ID] = true
		}
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE queue = 'neighbour'`); n != 101 {
		t.Fatalf("the neighbouring queue holds %d items, want its 101", n)
	}
}
