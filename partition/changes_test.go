package partition_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// watched is a member whose heartbeats the test counts, with a rebalancer
// that reads members and owners only when its session's change marker
// moves (ReadEvery an hour: no safety read within the test).
type watched struct {
	*member
	beats *await.Rounds
}

func joinWatched(t *testing.T, pool *pgxpool.Pool, sopts session.Options) *watched {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	beats := await.NewRounds("heartbeats")
	sopts.Testing.AfterHeartbeat = func(bool, error) { beats.Tick() }
	s, err := session.Start(ctx, pool, sopts)
	if err != nil {
		t.Fatal(err)
	}
	polls := await.NewRounds("rebalances of " + s.ID().String())
	r, err := partition.New(pool, s, partition.Options{Tuning: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: time.Second,
		ReadEvery: time.Hour},
		Testing: partition.TestingOptions{AfterRebalance: func([]int, error) { polls.Tick() }}})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{sess: s, reb: r, stop: cancel, done: make(chan struct{}), polls: polls}
	go func() { defer close(m.done); r.Run(ctx) }()
	t.Cleanup(func() { m.leave() })
	return &watched{member: m, beats: beats}
}

// reads returns the rebalancer's reads of members and owners.
func (w *watched) reads() int64 { return w.reb.Stats().Reads }

// quiet asserts that w's rebalancer reads nothing through n heartbeats of
// its session (and the polls between them).
func quiet(t *testing.T, w *watched, n int, what string) {
	t.Helper()
	before := w.reads()
	await.Never(t, fmt.Sprintf("a read of members and owners %s (%d before)", what, before), w.beats, n, func() bool {
		return w.reads() != before
	})
}

// TestReadsOnlyOnChanges: settled rebalancers read the queue's members and
// owners only after a change that the queue's change marker records — a
// session joins, one leaves (closed), one expires and is reaped — and not
// through heartbeats in between; the parts follow each change (an expired
// session's parts are taken once a peer reaps it, with no read in between
// but the one the reap's marker caused).
func TestReadsOnlyOnChanges(t *testing.T) {
	t.Parallel()
	const parts = 8
	pool := setup(t, parts)
	a := joinWatched(t, pool, fastSession())
	b := joinWatched(t, pool, fastSession())
	await.Until(t, "two sessions share the parts", func() bool { return balanced(t, pool, parts, a.member, b.member) })
	// Settled: the last acquisitions' markers may still be on their way.
	a.beats.Wait(t, 3)
	quiet(t, a, 5, "while nothing changes")
	quiet(t, b, 2, "while nothing changes")

	// A join: both read, and give the newcomer its share.
	before := a.reads()
	c := joinWatched(t, pool, fastSession())
	await.Until(t, "a read after a session joined", func() (bool, string) {
		return a.reads() > before, fmt.Sprintf("%d reads", a.reads())
	})
	await.Until(t, "three sessions share the parts", func() bool { return balanced(t, pool, parts, a.member, b.member, c.member) })
	a.beats.Wait(t, 3)
	quiet(t, a, 3, "after the join settled")

	// A graceful leave: the parts come back at once.
	before = a.reads()
	c.leave()
	await.Until(t, "a read after a session left", func() bool { return a.reads() > before })
	await.Until(t, "two sessions share the parts again", func() bool { return balanced(t, pool, parts, a.member, b.member) })
	a.beats.Wait(t, 3)
	quiet(t, a, 3, "after the leave settled")

	// An expiry: d stops heartbeating (its context ends, as if its process
	// died) with its parts, its row is made to look expired (rather than
	// waiting out a short expiry, which a loaded machine's slow heartbeats
	// may reach early), a reap deletes it and records the change, and a
	// takes every part.
	d := joinWatched(t, pool, fastSession())
	await.Until(t, "a and d share the parts", func() bool {
		got, total := owners(t, pool)
		return total == parts && got[d.sess.ID().String()] > 0 && got[b.sess.ID().String()] > 0
	})
	b.leave()
	await.Until(t, "a and d share the parts", func() bool { return balanced(t, pool, parts, a.member, d.member) })
	a.beats.Wait(t, 3)
	quiet(t, a, 3, "before the expiry")
	before = a.reads()
	d.stop() // d's process dies: no heartbeat, no close
	<-d.done
	if _, err := pool.Exec(context.Background(), `UPDATE crdbwork_sessions SET heartbeat_at = now() - INTERVAL '1 hour' WHERE id = $1`, d.sess.ID()); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "d's row expired and reaped", func() (bool, string) {
		// Any session's reaper may delete it (the sessions' own do).
		if _, err := session.Reap(context.Background(), pool, crsql.Tables{}); err != nil {
			return false, err.Error()
		}
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, d.sess.ID()).Scan(&n); err != nil {
			return false, err.Error()
		}
		return n == 0, fmt.Sprintf("%d rows of d", n)
	})
	await.Until(t, "a owns every part after d's expiry", func() bool {
		got, total := owners(t, pool)
		return total == parts && got[a.sess.ID().String()] == parts
	})
	if a.reads() == before {
		t.Error("a took d's parts without reading the owners")
	}
}

// TestSetPartsIsAChange: a settled rebalancer reads the new number of
// parts at its first poll after the heartbeat that follows SetParts, not
// at its safety interval.
func TestSetPartsIsAChange(t *testing.T) {
	t.Parallel()
	pool := setup(t, 4)
	a := joinWatched(t, pool, fastSession())
	await.Until(t, "a owns the 4 parts", func() bool { return balanced(t, pool, 4, a.member) })
	a.beats.Wait(t, 3)
	quiet(t, a, 3, "while nothing changes")
	if err := partition.SetParts(context.Background(), pool, crsql.Tables{}, "default", 6); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "a owns the 6 parts", func() (bool, string) {
		return balanced(t, pool, 6, a.member) && a.reb.NumParts() == 6, fmt.Sprintf("parts read: %d", a.reb.NumParts())
	})
}
