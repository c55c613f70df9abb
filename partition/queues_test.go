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

// rebalance runs a rebalancer of sess for queue until the test ends; polls,
// if not nil, counts its polls.
func rebalance(t *testing.T, pool *pgxpool.Pool, sess *session.Session, queue string, polls *await.Rounds) {
	t.Helper()
	var hooks partition.TestingOptions
	if polls != nil {
		hooks.AfterRebalance = func([]int, error) { polls.Tick() }
	}
	r, err := partition.New(pool, sess, partition.Options{Tuning: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: time.Second}, Queue: queue,
		Testing: hooks})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// ownersOf returns how many parts of queue each session owns.
func ownersOf(t *testing.T, pool *pgxpool.Pool, queue string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT session_id::TEXT, count(*) FROM crdbwork_session_parts WHERE queue = $1 GROUP BY session_id`, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

// TestQueuesDivideTheirOwnParts runs rebalancers for two queues of 8 parts
// in one database: two sessions work alpha, one works beta, and one
// session works both (a rebalancer per queue). Each queue's parts must all
// be owned, balanced, by its own members only; sessions of the other queue
// take none. (When parts were divided among every live session, alpha's
// target gave parts to beta's session, which never took them: they stayed
// owned by nobody.)
func TestQueuesDivideTheirOwnParts(t *testing.T) {
	t.Parallel()
	pool := setup(t, 8)
	ctx := context.Background()
	for _, q := range []string{"alpha", "beta"} {
		if err := partition.SetParts(ctx, pool, crsql.Tables{}, q, 8); err != nil {
			t.Fatal(err)
		}
	}
	opts := fastSession()
	newSession := func() *session.Session {
		s, err := session.Start(ctx, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	a1, a2, b1, both := newSession(), newSession(), newSession(), newSession()
	alphaPolls := await.NewRounds("polls of a rebalancer of alpha")
	rebalance(t, pool, a1, "alpha", alphaPolls)
	rebalance(t, pool, a2, "alpha", nil)
	rebalance(t, pool, b1, "beta", nil)
	rebalance(t, pool, both, "alpha", nil)
	rebalance(t, pool, both, "beta", nil)
	settled := func(queue string, members ...*session.Session) bool {
		got := ownersOf(t, pool, queue)
		total, lo, hi := 0, 8, 0
		for _, n := range got {
			total += n
		}
		for _, m := range members {
			n := got[m.ID().String()]
			lo, hi = min(lo, n), max(hi, n)
		}
		return total == 8 && len(got) == len(members) && hi-lo <= 1 && lo > 0
	}
	await.Until(t, "each queue's parts owned by its own members, balanced", func() (bool, string) {
		return settled("alpha", a1, a2, both) && settled("beta", b1, both),
			fmt.Sprintf("alpha %v, beta %v", ownersOf(t, pool, "alpha"), ownersOf(t, pool, "beta"))
	})
	// Through three more polls of a session of alpha, none takes a part
	// of beta, nor beta's session a part of alpha.
	await.Never(t, "a session owns parts of a queue it does not work", alphaPolls, 3, func() (bool, string) {
		alpha, beta := ownersOf(t, pool, "alpha"), ownersOf(t, pool, "beta")
		return beta[a1.ID().String()]+beta[a2.ID().String()]+alpha[b1.ID().String()] != 0, fmt.Sprintf("alpha %v, beta %v", alpha, beta)
	})
}

// TestRebalancerJoinsAgain: a rebalancer whose session's membership of its
// queue was deleted (by hand) while it owns no part finds itself missing
// from the queue's members and joins again.
func TestRebalancerJoinsAgain(t *testing.T) {
	t.Parallel()
	pool := setup(t, 1)
	ctx := context.Background()
	opts := fastSession()
	var sessions []*session.Session
	for range 2 {
		s, err := session.Start(ctx, pool, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		sessions = append(sessions, s)
		rebalance(t, pool, s, "default", nil)
	}
	memberRows := func(s *session.Session) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_session_queues WHERE queue = 'default' AND session_id = $1`, s.ID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var idle *session.Session
	await.Until(t, "one session to own the part, both to have joined", func() bool {
		got := ownersOf(t, pool, "default")
		if len(got) != 1 || memberRows(sessions[0]) != 1 || memberRows(sessions[1]) != 1 {
			return false
		}
		idle = sessions[0]
		if got[idle.ID().String()] == 1 {
			idle = sessions[1]
		}
		return true
	})
	if _, err := pool.Exec(ctx, `DELETE FROM crdbwork_session_queues WHERE session_id = $1`, idle.ID()); err != nil {
		t.Fatal(err)
	}
	await.Until(t, "the idle session to join again", func() bool { return memberRows(idle) == 1 })
}
