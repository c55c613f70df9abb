package fleet_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// seed fills a database with four queues, each known by one source of the
// queue list: "a" a stored part count only, "b" five unclaimed items, "c"
// a dead item only, "d" one claimed item; and three live sessions (one
// that missed its heartbeats, stale) and an expired one. It returns the
// live sessions' ids, ordered.
func seed(t *testing.T, pool *pgxpool.Pool) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "a", 2); err != nil {
		t.Fatal(err)
	}
	b, err := claim.New(pool, claim.Options{Queue: "b"})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := b.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, last_error, enqueued_at, died_at)
		VALUES ($1, 'c', 0, 0, 3, 3, '\x00'::BYTEA, 'e', now(), now())`, uuid.New())
	var live []uuid.UUID
	for _, age := range []string{"0 seconds", "0 seconds", "50 minutes", "2 hours"} {
		var id uuid.UUID
		if err := pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, heartbeat_at, name)
			VALUES (INTERVAL '1 hour', now() - $1::INTERVAL, 'w') RETURNING id`, age).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if age != "2 hours" {
			live = append(live, id)
		}
	}
	d, err := claim.New(pool, claim.Options{Queue: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Claimer(live[0]).Claim(ctx, claim.ClaimRequest{Max: 1}); err != nil || len(got) != 1 {
		t.Fatalf("claim: %v, %d items", err, len(got))
	}
	slices.SortFunc(live, func(x, y uuid.UUID) int { return slices.Compare(x[:], y[:]) })
	return live
}

func names(s *fleet.Snapshot) []string {
	var out []string
	for _, q := range s.Queues {
		out = append(out, q.Name)
	}
	return out
}

// Snapshot lists the queues of every source and the live sessions, within
// its bounds: the first MaxQueues queues by name and MaxSessions sessions
// by id, saying when there are more; counts stop at CountCap.
func TestSnapshotBounds(t *testing.T) {
	t.Parallel()
	pool := testschema.New(t)
	live := seed(t, pool)
	ctx := context.Background()
	r, err := fleet.New(pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := r.Snapshot(ctx, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(snap); !slices.Equal(got, []string{"a", "b", "c", "d"}) || snap.MoreQueues {
		t.Errorf("queues %v (more: %v), want a b c d", got, snap.MoreQueues)
	}
	var ids []uuid.UUID
	stale := 0
	for _, s := range snap.Sessions {
		ids = append(ids, s.ID)
		if s.Stale {
			stale++
		}
	}
	if !slices.Equal(ids, live) || snap.LiveSessions != 3 || snap.ExpiredSessions != 1 || snap.MoreSessions() || stale != 1 {
		t.Errorf("sessions %v (%d live, %d expired, %d stale), want %v, 3 live, 1 expired, 1 stale", ids, snap.LiveSessions,
			snap.ExpiredSessions, stale, live)
	}
	byName := map[string]fleet.Queue{}
	for _, q := range snap.Queues {
		byName[q.Name] = q
	}
	if a := byName["a"]; !a.Stored || a.NumParts != 2 || a.HasItems() || !a.Known() {
		t.Errorf("queue a: %+v", a)
	}
	if b := byName["b"]; b.Unclaimed != 5 || b.Due != 5 || b.Stored || b.OldestDue() < 0 || b.Parts != nil {
		t.Errorf("queue b: %+v", b)
	}
	if c, d := byName["c"], byName["d"]; c.Dead != 1 || c.HasItems() || d.Claimed != 1 || d.Unclaimed != 0 {
		t.Errorf("queues c, d: %+v, %+v", c, d)
	}

	for _, c := range []struct {
		max  int
		want []string
		more bool
	}{{1, []string{"a"}, true}, {2, []string{"a", "b"}, true}, {3, []string{"a", "b", "c"}, true}, {4, []string{"a", "b", "c", "d"}, false}} {
		snap, err := r.Snapshot(ctx, fleet.Options{MaxQueues: c.max, QueuesOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := names(snap); !slices.Equal(got, c.want) || snap.MoreQueues != c.more || len(snap.Sessions) != 0 {
			t.Errorf("MaxQueues %d: %v (more: %v, %d sessions), want %v (more: %v), no sessions", c.max, got, snap.MoreQueues,
				len(snap.Sessions), c.want, c.more)
		}
	}
	snap, err = r.Snapshot(ctx, fleet.Options{MaxSessions: 2, Queue: "b", CountCap: 3, Parts: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Sessions) != 2 || snap.Sessions[0].ID != live[0] || snap.Sessions[1].ID != live[1] || snap.LiveSessions != 3 || !snap.MoreSessions() {
		t.Errorf("MaxSessions 2: %d sessions of %d (more: %v)", len(snap.Sessions), snap.LiveSessions, snap.MoreSessions())
	}
	if got := names(snap); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("Queue b: %v", got)
	}
	// The cap stops the counts; the parts are read exactly.
	if b := snap.Queues[0]; b.Unclaimed != 3 || b.Due != 3 || len(b.Parts) != 1 || b.Parts[0] != (fleet.Part{Part: 0, Unclaimed: 5, Due: 5}) {
		t.Errorf("queue b with a cap of 3: %+v", b)
	}
	// A queue nobody used is read too, as unknown.
	snap, err = r.Snapshot(ctx, fleet.Options{Queue: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Queues) != 1 || snap.Queues[0].Known() || snap.Queues[0].NumParts != 1 {
		t.Errorf("queue nobody: %+v", snap.Queues)
	}
	if _, err := r.Snapshot(ctx, fleet.Options{CountCap: -1}); err == nil {
		t.Error("a negative cap was taken")
	}
}

// A database without the schema is refused with the schema's error.
func TestSnapshotWithoutSchema(t *testing.T) {
	t.Parallel()
	r, err := fleet.New(testdb.New(t), crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Snapshot(context.Background(), fleet.Options{Timeout: time.Minute}); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Errorf("Snapshot without the schema: %v, want ErrSchemaMissing", err)
	}
	if _, err := fleet.New(nil, crsql.Tables{}); err == nil {
		t.Error("New took a nil database")
	}
}
