package partition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
)

// aliveSession is a partition.Session that never loses itself: no heartbeat
// loop runs. Its row in crdbwork_sessions is inserted by the test with an
// expiry of an hour, so the database counts it live for the whole test (the
// parts and membership rows reference it by foreign key). It ends only when
// the test calls end.
type aliveSession struct {
	id    uuid.UUID
	pool  *pgxpool.Pool
	ctx   context.Context
	end   context.CancelCauseFunc
	joins atomic.Int64
}

var _ partition.Session = (*aliveSession)(nil)

// newAliveSession inserts a live session row and returns its fake session.
func newAliveSession(t *testing.T, pool *pgxpool.Pool) *aliveSession {
	t.Helper()
	s := &aliveSession{pool: pool}
	if err := pool.QueryRow(context.Background(),
		`INSERT INTO crdbwork_sessions (expiry, name) VALUES (INTERVAL '1 hour', 'always-alive fake') RETURNING id`,
	).Scan(&s.id); err != nil {
		t.Fatal(err)
	}
	s.ctx, s.end = context.WithCancelCause(context.Background())
	t.Cleanup(func() { s.end(session.ErrClosed) })
	return s
}

func (s *aliveSession) ID() uuid.UUID            { return s.id }
func (s *aliveSession) Context() context.Context { return s.ctx }

func (s *aliveSession) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

func (s *aliveSession) Join(ctx context.Context, queue string) error {
	s.joins.Add(1)
	_, err := s.pool.Exec(ctx,
		`INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, queue, s.id)
	if err != nil {
		return fmt.Errorf("fake session: joining %q: %w", queue, err)
	}
	return nil
}

// ownersByID returns how many parts of the default queue each session id owns.
func ownersByID(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID]int {
	t.Helper()
	got, _ := owners(t, pool)
	out := map[uuid.UUID]int{}
	for s, n := range got {
		out[uuid.MustParse(s)] = n
	}
	return out
}

// TestRebalancerWithAlwaysAliveSession drives two rebalancers by hand, with
// fake sessions and no heartbeat loop, poll by poll: the first takes every
// part and joins the queue once; after the second joins, the first gives up
// half of the parts and the second takes them.
func TestRebalancerWithAlwaysAliveSession(t *testing.T) {
	t.Parallel()
	const parts = 4
	pool := setup(t, parts)
	ctx := context.Background()
	a, b := newAliveSession(t, pool), newAliveSession(t, pool)
	ra, err := partition.New(pool, a, partition.Options{Tuning: partition.Tuning{Strategy: partition.Contiguous, DrainTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := partition.New(pool, b, partition.Options{Tuning: partition.Tuning{Strategy: partition.Contiguous, DrainTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}

	if err := ra.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ra.Owned(); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("after the first poll, a owns %v; want every part", got)
	}
	if got := ownersByID(t, pool); len(got) != 1 || got[a.id] != parts {
		t.Fatalf("owners after the first poll = %v; want %d parts of %s", got, parts, a.id)
	}
	if err := ra.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.joins.Load(); n != 1 {
		t.Fatalf("a joined %d times in two polls; want 1 (it is a member after the first)", n)
	}
	if st := ra.Stats(); st.Acquired != parts || st.Rebalances != 2 {
		t.Fatalf("a's stats = %+v; want %d acquired in 2 rebalances", st, parts)
	}

	// b joins: nothing is free yet, so it takes nothing.
	if err := rb.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rb.Owned(); len(got) != 0 {
		t.Fatalf("b owns %v while a holds every part; want none", got)
	}
	// a sees b, drains the parts it must lose (none is busy) and gives
	// them up.
	if err := ra.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "a to give up two parts", func() (bool, string) {
		st := ra.Stats()
		return st.Released == 2, fmt.Sprintf("%+v", st)
	})
	if err := rb.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	got := ownersByID(t, pool)
	if len(got) != 2 || got[a.id] != 2 || got[b.id] != 2 {
		t.Fatalf("owners after b's second poll = %v; want 2 parts each for %s and %s", got, a.id, b.id)
	}
	if oa, ob := ra.Owned(), rb.Owned(); len(oa) != 2 || len(ob) != 2 || slices.ContainsFunc(oa, func(p int) bool { return slices.Contains(ob, p) }) {
		t.Fatalf("a owns %v and b owns %v; want two parts each, disjoint", oa, ob)
	}

	// No heartbeat ran: the rows' heartbeats are still those of their insert.
	var beats int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_sessions WHERE heartbeat_at <> created_at`).Scan(&beats); err != nil {
		t.Fatal(err)
	}
	if beats != 0 {
		t.Fatalf("%d session rows had a heartbeat; the fakes have no heartbeat loop", beats)
	}
}

// TestRunReturnsWhenSessionEnds runs a rebalancer with a fake session and
// ends the session while Run polls: Run must return, with the session's
// error when it was lost and nil when it was closed, although its own
// context is never cancelled.
func TestRunReturnsWhenSessionEnds(t *testing.T) {
	t.Parallel()
	errGone := fmt.Errorf("%w: the fake's row was deleted", session.ErrLost)
	for _, tc := range []struct {
		name  string
		cause error
		want  error
	}{
		{"lost", errGone, session.ErrLost},
		{"closed", session.ErrClosed, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t, 2)
			s := newAliveSession(t, pool)
			r, err := partition.New(pool, s, partition.Options{Tuning: partition.Tuning{Poll: 20 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()
			await.Until(t, "the rebalancer to own both parts", func() (bool, string) {
				owned := r.Owned()
				return len(owned) == 2, fmt.Sprint("owns ", owned)
			})

			s.end(tc.cause)
			err = await.Recv(t, "Run to return once its session ended", done)
			if tc.want == nil && err != nil {
				t.Fatalf("Run after the session closed = %v; want nil", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Run after the session was lost = %v; want an error wrapping %v", err, tc.want)
			}
			if got := r.Owned(); len(got) != 0 {
				t.Fatalf("after Run returned, Owned = %v; want none", got)
			}
		})
	}
}

// TestNewRejectsNilSession: a nil *session.Session inside the Session
// interface is refused like a nil interface, not dereferenced.
func TestNewRejectsNilSession(t *testing.T) {
	t.Parallel()
	pool := setup(t, 1)
	for name, s := range map[string]partition.Session{"nil interface": nil, "nil *session.Session": (*session.Session)(nil)} {
		if r, err := partition.New(pool, s, partition.Options{}); err == nil || r != nil {
			t.Errorf("New with a %s = %v, %v; want an error", name, r, err)
		}
	}
}
