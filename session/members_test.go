package session_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestQueueMembers checks who a queue's members are: the live sessions
// that joined it (once each, however often they join) or that own one of
// its parts; not sessions of other queues, not expired sessions, not a
// session that left; and that a session whose row is gone cannot join.
func TestQueueMembers(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	start := func(opts session.Options) *session.Session {
		s, err := session.Start(ctx, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	members := func(queue string) []uuid.UUID {
		t.Helper()
		ids, err := session.Members(ctx, pool, crsql.Tables{}, queue)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	sorted := func(ids ...uuid.UUID) []uuid.UUID {
		slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
		return ids
	}
	// c, which the test expires by hand, never heartbeats meanwhile: a
	// heartbeat between the test's UPDATE and its read would make c live
	// again (it did, under load and in the fault mode).
	slow := session.Options{Tuning: session.Tuning{Heartbeat: time.Hour, Expiry: 6 * time.Hour}}
	a, b, c, v3 := start(fast), start(fast), start(slow), start(fast)
	for _, j := range []struct {
		s     *session.Session
		queue string
	}{{a, "alpha"}, {a, "alpha"}, {b, "alpha"}, {b, "beta"}, {c, "beta"}} {
		if err := j.s.Join(ctx, j.queue); err != nil {
			t.Fatal(err)
		}
	}
	// v3 never joins (as a version-3 session) but owns part 3 of alpha.
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'alpha', 3)`, v3.ID()); err != nil {
		t.Fatal(err)
	}
	if got, want := members("alpha"), sorted(a.ID(), b.ID(), v3.ID()); !slices.Equal(got, want) {
		t.Errorf("members of alpha: %v, want %v", got, want)
	}
	if got, want := members("beta"), sorted(b.ID(), c.ID()); !slices.Equal(got, want) {
		t.Errorf("members of beta: %v, want %v", got, want)
	}
	if got := members("gamma"); len(got) != 0 {
		t.Errorf("members of gamma, which nobody joined: %v", got)
	}
	all, err := session.Memberships(ctx, pool, crsql.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 || all[0].Queue != "alpha" || all[3].Queue != "beta" || all[0].JoinedAt.IsZero() {
		t.Errorf("memberships: %+v, want 4 (2 of alpha, 2 of beta, in order)", all)
	}

	if err := b.Leave(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	if got, want := members("alpha"), sorted(a.ID(), v3.ID()); !slices.Equal(got, want) {
		t.Errorf("members of alpha after b left: %v, want %v", got, want)
	}
	// An expired session (no heartbeat since long before its expiry) is
	// not a member, though its rows are still there.
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_sessions SET heartbeat_at = now() - expiry - INTERVAL '1 hour' WHERE id = $1`, c.ID()); err != nil {
		t.Fatal(err)
	}
	if got, want := members("beta"), sorted(b.ID()); !slices.Equal(got, want) {
		t.Errorf("members of beta with c expired: %v, want %v", got, want)
	}
	// A session whose row is gone cannot join.
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Join(ctx, "beta"); !errors.Is(err, session.ErrLost) {
		t.Errorf("Join of a closed session: %v, want ErrLost", err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_session_queues WHERE session_id = $1`, c.ID()); n != 0 {
		t.Errorf("%d memberships left of a closed session", n)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
