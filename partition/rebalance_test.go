package partition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// setup returns a pool on a fresh database of the test with the schema
// and the default queue in parts.
func setup(t *testing.T, parts int) *pgxpool.Pool {
	t.Helper()
	pool := testschema.New(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", parts); err != nil {
		t.Fatal(err)
	}
	return pool
}

// fastSession returns frequent heartbeats and an expiry that a loaded
// machine's slow heartbeats do not reach: the sessions of these tests must
// not churn, nobody leaves unless the test says so (gracefully, which
// hands the parts over at once), so a long expiry costs nothing. Both are
// stretched with the load (await.Stretch), the heartbeat too: each
// heartbeat gives up after two intervals, and with 8 CPU-burning processes
// beside the suite the unstretched 100 ms heartbeats of two of six sessions
// kept timing out until their sessions were lost.
func fastSession() session.Options {
	hb := await.Stretch(100 * time.Millisecond)
	return session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 50 * hb}}
}

type member struct {
	sess *session.Session
	reb  *partition.Rebalancer
	stop context.CancelFunc
	done chan struct{}
	// polls counts the rebalancer's polls (Options.Testing.AfterRebalance).
	polls *await.Rounds
}

func join(t *testing.T, pool *pgxpool.Pool, sopts session.Options) *member {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := session.Start(ctx, pool, sopts)
	if err != nil {
		t.Fatal(err)
	}
	polls := await.NewRounds("rebalances of " + s.ID().String())
	r, err := partition.New(pool, s, partition.Options{Tuning: partition.Tuning{Poll: 100 * time.Millisecond, DrainTimeout: time.Second},
		Testing: partition.TestingOptions{AfterRebalance: func([]int, error) { polls.Tick() }}})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{sess: s, reb: r, stop: cancel, done: make(chan struct{}), polls: polls}
	go func() { defer close(m.done); r.Run(ctx) }()
	t.Cleanup(func() { m.leave() })
	return m
}

// leave closes the session gracefully, which hands its parts over at once.
func (m *member) leave() {
	m.sess.Close(context.Background())
	<-m.done
	m.stop()
}

// owners returns the number of parts each session owns, from the database.
func owners(t *testing.T, pool *pgxpool.Pool) (map[string]int, int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT session_id::TEXT, count(*) FROM crdbwork_session_parts WHERE queue = 'default' GROUP BY session_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out, total := map[string]int{}, 0
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
		total += n
	}
	return out, total
}

// balanced reports whether the parts are all owned, by exactly the given
// sessions, with sizes differing by at most one.
func balanced(t *testing.T, pool *pgxpool.Pool, parts int, members ...*member) bool {
	got, total := owners(t, pool)
	if total != parts || len(got) != len(members) {
		return false
	}
	lo, hi := parts, 0
	for _, m := range members {
		n := got[m.sess.ID().String()]
		lo, hi = min(lo, n), max(hi, n)
	}
	return hi-lo <= 1
}

// ownership returns the owner of each part of the default queue, from the
// database, as a string for failure messages and comparisons.
func ownership(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT part, session_id::TEXT FROM crdbwork_session_parts WHERE queue = 'default' ORDER BY part`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var p int
		var s string
		if err := rows.Scan(&p, &s); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%d:%s ", p, s[:8])
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// settled is balanced as an await condition that reports the owners, and
// the members whose session ended.
func settled(t *testing.T, pool *pgxpool.Pool, parts int, members ...*member) func() (bool, string) {
	return func() (bool, string) {
		got, total := owners(t, pool)
		state := fmt.Sprintf("%d of %d parts owned: %v", total, parts, got)
		for _, m := range members {
			if err := m.sess.Err(); err != nil {
				state += fmt.Sprintf("; session %s ended: %v", m.sess.ID(), err)
			}
		}
		return balanced(t, pool, parts, members...), state
	}
}

func TestSessionsSettleOn64Parts(t *testing.T) {
	t.Parallel()
	const parts = 64
	pool := setup(t, parts)
	var ms []*member
	for range 5 {
		ms = append(ms, join(t, pool, fastSession()))
	}
	took := await.Until(t, "5 sessions to settle on 64 parts", settled(t, pool, parts, ms...))
	t.Logf("settled in %v", took)
	// Settled means stable: through three more polls of every member, no
	// part changes hands.
	before := ownership(t, pool)
	for _, m := range ms {
		await.Never(t, "a part changes hands once the sessions settled", m.polls, 3, func() (bool, string) {
			now := ownership(t, pool)
			return now != before, now
		})
	}
	var distinct int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT part) FROM crdbwork_session_parts WHERE queue = 'default'`).Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if distinct != parts {
		t.Fatalf("%d distinct parts owned, want %d", distinct, parts)
	}
	// Every rebalancer's own view agrees with the database.
	sum := 0
	for _, m := range ms {
		sum += len(m.reb.Owned())
	}
	if sum != parts {
		t.Fatalf("rebalancers believe they own %d parts in all, want %d", sum, parts)
	}
	// A sixth session joins: the group settles again.
	ms = append(ms, join(t, pool, fastSession()))
	await.Until(t, "6 sessions to settle", settled(t, pool, parts, ms...))
}

func TestGracefulCloseHandsPartsOverAtOnce(t *testing.T) {
	t.Parallel()
	const parts = 64
	pool := setup(t, parts)
	slow := session.Options{Tuning: session.Tuning{Heartbeat: time.Second, Expiry: time.Minute}} // expiry far beyond the test's deadline
	a := join(t, pool, slow)
	b := join(t, pool, slow)
	await.Until(t, "two sessions to settle", settled(t, pool, parts, a, b))
	// What the leaver held, and what the survivor had acquired, when it
	// left: the survivor must take each of those parts itself (counted by
	// its Acquired) long before the leaver's session would expire.
	held := len(a.reb.Owned())
	before := b.reb.Stats().Acquired
	a.leave()
	took := await.Until(t, "the survivor to own every part", settled(t, pool, parts, b))
	t.Logf("survivor owned all %d parts %v after the graceful close (expiry %v)", parts, took, slow.Expiry)
	if got := b.reb.Stats().Acquired - before; held == 0 || got < int64(held) {
		t.Fatalf("survivor acquired %d parts after the close, want the %d the leaver held", got, held)
	}
}

func TestClaimPartsOnlyInOwnedParts(t *testing.T) {
	t.Parallel()
	const parts = 4
	pool := setup(t, parts)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, 40)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte("x"), Key: string(rune('a' + i%26))}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	m := join(t, pool, fastSession())
	await.Until(t, "the session to own all parts", func() (bool, string) {
		owned := m.reb.Owned()
		return len(owned) == parts, fmt.Sprint("owns ", owned)
	})
	got, err := q.Claimer(m.sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 100, Parts: []int{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	var inParts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE part IN (1, 2)`).Scan(&inParts); err != nil {
		t.Fatal(err)
	}
	if len(got) != inParts || inParts == 0 {
		t.Fatalf("claimed %d items, want the %d items of parts 1 and 2", len(got), inParts)
	}
	for _, it := range got {
		if it.Part != 1 && it.Part != 2 || !it.InPart {
			t.Fatalf("claimed item in part %d (InPart %v)", it.Part, it.InPart)
		}
	}
	// Same key, same part.
	var spread int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT item_key FROM crdbwork_items GROUP BY item_key HAVING count(DISTINCT part) > 1) AS s`).Scan(&spread); err != nil {
		t.Fatal(err)
	}
	if spread != 0 {
		t.Fatalf("%d keys spread over several parts", spread)
	}
	// Claiming in a part the session does not own is refused by the database.
	other, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := q.Claimer(other.ID()).Claim(ctx, claim.ClaimRequest{Max: 10, Parts: []int{0}}); !errors.Is(err, claim.ErrNotOwner) {
		t.Fatalf("claim in a part owned by another session = %v, want ErrNotOwner", err)
	}
}

func TestSetParts(t *testing.T) {
	t.Parallel()
	pool := setup(t, 8)
	ctx := context.Background()
	if n, err := partition.Parts(ctx, pool, crsql.Tables{}, "default"); err != nil || n != 8 {
		t.Fatalf("Parts = %d, %v, want 8", n, err)
	}
	if n, err := partition.Parts(ctx, pool, crsql.Tables{}, "never-set"); err != nil || n != 1 {
		t.Fatalf("Parts of an unknown queue = %d, %v, want 1", n, err)
	}
	q, err := claim.New(pool, claim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, 64)
	for i := range items {
		items[i] = claim.NewItem{Payload: []byte("x")}
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	var perPart int
	if err := pool.QueryRow(ctx, `SELECT max(c) FROM (SELECT count(*) AS c FROM crdbwork_items GROUP BY part) AS p`).Scan(&perPart); err != nil {
		t.Fatal(err)
	}
	if perPart != 8 {
		t.Fatalf("unkeyed items: at most %d per part, want an even 8", perPart)
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 3); err != nil {
		t.Fatal(err)
	}
	var above, total int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE part >= 3), count(*) FROM crdbwork_items`).Scan(&above, &total); err != nil {
		t.Fatal(err)
	}
	if above != 0 || total != 64 {
		t.Fatalf("after shrinking to 3 parts: %d items in removed parts (want 0), %d items (want 64)", above, total)
	}
	for _, bad := range []int{0, -1, partition.MaxParts + 1} {
		if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", bad); err == nil {
			t.Errorf("SetParts(%d) accepted", bad)
		}
	}
}

// switchable is a strategy that gives this process's only session every part
// while take is set, and none otherwise.
func switchable(take *atomic.Bool) partition.Strategy {
	return func(_ map[uuid.UUID][]int, live []uuid.UUID, n int) map[uuid.UUID][]int {
		out := map[uuid.UUID][]int{}
		if take.Load() {
			for _, s := range live {
				for p := range n {
					out[s] = append(out[s], p)
				}
			}
		}
		return out
	}
}

func partRows(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT part FROM crdbwork_session_parts WHERE queue = 'default' ORDER BY part`)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = int(p)
	}
	return out
}

// An item claimed in an ownership that ended (here: SetParts removed the
// part, which was then added back and acquired again) must not count
// against the new ownership: its Done must neither end the new ownership's
// drain early nor, as it did, close the drain channel twice (a panic).
func TestStaleDoneDoesNotCountAgainstNewOwnership(t *testing.T) {
	t.Parallel()
	pool := setup(t, 2)
	ctx := context.Background()
	s, err := session.Start(ctx, pool, fastSession())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	var take atomic.Bool
	take.Store(true)
	r, err := partition.New(pool, s, partition.Options{Tuning: partition.Tuning{DrainTimeout: time.Hour, Strategy: switchable(&take)}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rebalance := func() {
		t.Helper()
		if err := r.Rebalance(rctx); err != nil {
			t.Fatal(err)
		}
	}
	rebalance()
	if got := r.Owned(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("owned %v, want [0 1]", got)
	}
	// An item is claimed in part 1.
	_, claimed := r.Lease()
	old := claimed([]int{1})
	// The part disappears under it (its claims are released by the
	// database), comes back and is acquired again.
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 1); err != nil {
		t.Fatal(err)
	}
	rebalance()
	if got := r.Owned(); !slices.Equal(got, []int{0}) {
		t.Fatalf("after shrinking: owned %v, want [0]", got)
	}
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "default", 2); err != nil {
		t.Fatal(err)
	}
	rebalance()
	if got := r.Owned(); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("after growing: owned %v, want [0 1]", got)
	}
	// A claim runs in the new ownership while the session starts giving
	// both parts up; the old item finishes meanwhile.
	_, claimed = r.Lease()
	take.Store(false)
	rebalance()
	r.Done(old[0])
	cur := claimed([]int{1})
	// Part 0 has nothing in flight and is released; part 1 waits for the
	// new item (the drain timeout is an hour).
	await.Until(t, "part 0 to be released", func() (bool, string) {
		owned := r.Owned()
		return slices.Equal(owned, []int{1}), fmt.Sprint("owns ", owned)
	})
	if got := partRows(t, pool); !slices.Equal(got, []int{1}) {
		t.Fatalf("rows of parts %v, want [1]: part 1 must wait for its item in flight", got)
	}
	r.Done(old[0]) // a second stale Done changes nothing either
	if got := partRows(t, pool); !slices.Equal(got, []int{1}) {
		t.Fatalf("rows of parts %v after a stale Done, want [1]", got)
	}
	r.Done(cur[0])
	await.Until(t, "part 1 to be released once its item is done", func() (bool, string) {
		owned, rows := r.Owned(), partRows(t, pool)
		return len(owned) == 0 && len(rows) == 0, fmt.Sprintf("owns %v, rows of parts %v", owned, rows)
	})
	r.Done(cur[0]) // a repeated Done is harmless
}
