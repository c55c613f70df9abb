package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// statementCounter is a pgx tracer that counts the statements its
// connections send, by kind.
type statementCounter struct {
	mu    sync.Mutex
	kinds map[string]int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	kind := "other"
	switch s := d.SQL; {
	case strings.Contains(s, "SET heartbeat_at = now()"):
		kind = "heartbeat"
	case strings.Contains(s, "crdbwork_reaps") && strings.Contains(s, "VALUES ('', now())"):
		kind = "sessions reap turn"
	case strings.Contains(s, "crdbwork_reaps"):
		kind = "reap turn"
	case strings.Contains(s, "ORDER BY dependent LIMIT 1) IS NOT NULL"):
		kind = "prunes due"
	case strings.Contains(s, "pg_stat_user_tables"):
		kind = "statistics check"
	default:
		kind = strings.Join(strings.Fields(s), " ")
		if len(kind) > 60 {
			kind = kind[:60]
		}
	}
	c.mu.Lock()
	c.kinds[kind]++
	c.mu.Unlock()
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// snapshot returns the counts so far.
func (c *statementCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.kinds))
	for k, v := range c.kinds {
		out[k] = v
	}
	return out
}

// countedPool returns a pool on pool's database whose connections (and the
// sessions' heartbeat connections, made with its config) count their
// statements.
func countedPool(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *statementCounter) {
	t.Helper()
	c := &statementCounter{kinds: map[string]int{}}
	cfg := pool.Config()
	cfg.ConnConfig.Tracer = c
	cfg.MaxConns = 32
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, c
}

// An idle fleet runs at most 2 statements per session and heartbeat
// (issue 32: at most 2 a second with the default 1 s heartbeat), counted
// by the client over 60 heartbeats of 4 workers on one queue of 8 parts
// once they settled: the heartbeat, and for the fleet one reap of expired
// sessions per Session.ReapEvery, one queue reap turn per session every
// few heartbeats, and a queue reap only when it has something to do (or
// once a minute, for its prunes).
// Before the reap turns each session reaped the expired sessions every two
// heartbeats and the queue every five (6 transactions, 14 statements), and
// read the limits every Limits.Refresh: 4 to 5 statements per heartbeat.
func TestIdleFleetRunsFewStatements(t *testing.T) {
	t.Parallel()
	const workers, nparts, beats = 4, 8, 60
	pool, stmts := countedPool(t, setup(t))
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	if err := partition.SetParts(ctx, pool, q.Options().Tables, q.Name(), nparts); err != nil {
		t.Fatal(err)
	}
	var heartbeats, sessionReaps, queueReaps, turns atomic.Int64
	first := await.NewRounds("heartbeats of the first worker")
	// Limits.Refresh stays at its default (1 s) and the heartbeat is fast:
	// the limit reads of the old code would count for 1 in 10 heartbeats
	// here, not 1 in 1; the reaps, which count in heartbeats, are what the
	// bound is about.
	hb := await.Stretch(100 * time.Millisecond)
	var rs []*running
	for i := range workers {
		// The claim loop is out of the picture (NoWake, a long Poll): its
		// idle claims while the listener listens are
		// TestNoClaimPollWhileListening's; here a listener of the test
		// binary that reconnects (other tests share it) would make the
		// workers poll.
		opts := worker.Options{Parts: nparts, Concurrency: 2, NoWake: true, Poll: 100 * hb,
			Session:   session.Tuning{Heartbeat: hb, Expiry: 50 * hb},
			Partition: partition.Tuning{Poll: hb},
			Testing: worker.TestingOptions{
				AfterSessionReap: func(int64, error) { sessionReaps.Add(1) },
				AfterQueueReap:   func(claim.ReapStats, error) { queueReaps.Add(1) },
				AfterReapTurn:    func(string, bool, error) { turns.Add(1) },
				Session: session.TestingOptions{AfterHeartbeat: func(bool, error) {
					heartbeats.Add(1)
					if i == 0 {
						first.Tick()
					}
				}},
			}}
		rs = append(rs, startOn(t, q, recordHandler(0), opts))
	}
	// Settled: every part owned, and no part moved for 10 heartbeats (a
	// move changes the queue's marker: the sessions read members, owners
	// and limits again, and claim).
	parts := func() (held, moves int64) {
		for _, r := range rs {
			p := r.w.Stats().Parts
			held += p.Acquired - p.Released
			moves += p.Acquired + p.Released
		}
		return held, moves
	}
	await.Until(t, "every part owned", func() (bool, string) {
		held, _ := parts()
		return held == nparts, fmt.Sprintf("%d of %d parts owned", held, nparts)
	})
	for settled := false; !settled; {
		_, before := parts()
		first.Wait(t, 10)
		held, after := parts()
		settled = held == nparts && after == before
	}
	s0, h0 := stmts.snapshot(), heartbeats.Load()
	sr0, qr0, tu0 := sessionReaps.Load(), queueReaps.Load(), turns.Load()
	first.Wait(t, beats)
	s1, h1 := stmts.snapshot(), heartbeats.Load()
	total, n := 0, h1-h0
	window := map[string]int{}
	for k, v := range s1 {
		total += v - s0[k]
		if v > s0[k] {
			window[k] = v - s0[k]
		}
	}
	if got := s1["heartbeat"] - s0["heartbeat"]; got == 0 {
		t.Fatalf("the counter saw no heartbeat (%v): the heartbeats' connections do not count", s1)
	}
	detail := fmt.Sprintf("%d statements in %d heartbeats (%.2f per heartbeat): by kind %v; session reaps %d, queue reaps %d, turns %d",
		total, n, float64(total)/float64(n), window, sessionReaps.Load()-sr0, queueReaps.Load()-qr0, turns.Load()-tu0)
	t.Log(detail)
	if float64(total) > 2*float64(n) {
		t.Errorf("idle fleet: %s; want at most 2 statements per heartbeat", detail)
	}
	// The fleet reaps the expired sessions about once per ReapEvery (two
	// heartbeats of any session), not once per session.
	if got, most := sessionReaps.Load()-sr0, int64(beats/2+2); got > most {
		t.Errorf("%d reaps of expired sessions in %d heartbeats of one session; want at most %d (one per ReapEvery for the fleet)", got, beats, most)
	}
	// Nothing to reap: the fleet reaps the idle queue for its prunes, once
	// a minute (twice if the window straddles one).
	if got := queueReaps.Load() - qr0; got > 2 {
		t.Errorf("%d queue reaps in %d heartbeats of an idle queue; want at most 2 (the prunes, once a minute)", got, beats)
	}
}

// A session alone in its database (issue 32: at most 2 statements a second
// per idle session, even without a fleet to share the reaps) runs no reap
// of expired sessions at all (its heartbeat finds no other session's row:
// none can be expired), and at its queue's prune turn, when nothing is
// left to prune, one test of the prunes instead of the whole reap. Counted
// exactly, by the client, over heartbeats of one worker: before, the
// session took the turn of expired sessions every ReapEvery (one
// statement per two or three heartbeats) and ran the whole reap (28
// statements) at each prune turn. A control shows that the test of the
// prunes still finds work: an exhausted item is moved to the dead items at
// the next prune turn.
func TestLoneIdleSessionRunsFewStatements(t *testing.T) {
	t.Parallel()
	const beats = 30
	pool, stmts := countedPool(t, setup(t))
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{})
	var sessionTurns, sessionReaps, queueTurns atomic.Int64
	var queueReaps atomic.Int64
	var dead atomic.Int64
	heartbeats := await.NewRounds("heartbeats")
	prunes := await.NewRounds("tests of the prunes at the queue's prune turns")
	var prunesMu sync.Mutex
	var prunesSeen []string
	hb := await.Stretch(100 * time.Millisecond)
	// The claim loop is out of the picture (NoWake, a long Poll: its idle
	// claims while listening are TestNoClaimPollWhileListening's), and so
	// are the limits (read on the change marker, and every 30 s).
	opts := worker.Options{Concurrency: 2, NoWake: true, Poll: 1000 * hb,
		Session: session.Tuning{Heartbeat: hb, Expiry: 50 * hb},
		Testing: worker.TestingOptions{
			AfterSessionReap: func(int64, error) { sessionReaps.Add(1) },
			AfterQueueReap: func(st claim.ReapStats, err error) {
				queueReaps.Add(1)
				dead.Add(int64(st.Dead))
			},
			AfterReapTurn: func(name string, _ bool, _ error) {
				if name == "" {
					sessionTurns.Add(1)
				} else {
					queueTurns.Add(1)
				}
			},
			AfterPrunesDue: func(due bool, err error) {
				prunesMu.Lock()
				prunesSeen = append(prunesSeen, fmt.Sprintf("due %v, error %v", due, err))
				prunesMu.Unlock()
				prunes.Tick()
			},
			Session: session.TestingOptions{AfterHeartbeat: func(bool, error) { heartbeats.Tick() }},
		}}
	startOn(t, q, recordHandler(0), opts)
	// Settled: the first queue turn taken (its first, whole, reap done).
	await.Until(t, "the queue's first reap turn", func() bool { return queueTurns.Load() > 0 })
	heartbeats.Wait(t, 3)

	// 1. beats heartbeats (ReapEvery is two): no reap of expired sessions.
	s0, st0, sr0 := stmts.snapshot(), sessionTurns.Load(), sessionReaps.Load()
	heartbeats.Wait(t, beats)
	s1 := stmts.snapshot()
	window := func(a, b map[string]int) map[string]int {
		w := map[string]int{}
		for k, v := range b {
			if v > a[k] {
				w[k] = v - a[k]
			}
		}
		return w
	}
	w := window(s0, s1)
	if w["heartbeat"] < beats {
		t.Fatalf("the counter saw %d heartbeats in %d rounds (%v): the heartbeats' connections do not count", w["heartbeat"], beats, w)
	}
	if n, turns, reaps := w["sessions reap turn"], sessionTurns.Load()-st0, sessionReaps.Load()-sr0; n != 0 || turns != 0 || reaps != 0 {
		t.Errorf("a session alone ran %d statements of the reap of expired sessions (%d turns, %d reaps) in %d heartbeats; want none: by kind %v", n, turns, reaps, w["heartbeat"], w)
	}

	// 2. The queue's prune turn with nothing to prune: one test, no reap.
	setPruneDue := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE crdbwork_reaps SET pruned_at = NULL WHERE name = $1`, q.Name()); err != nil {
			t.Fatal(err)
		}
	}
	s0, qr0, p0 := stmts.snapshot(), queueReaps.Load(), prunes.Count()
	setPruneDue()
	prunes.WaitFor(t, p0+1)
	// The maintenance loop does one thing at a time: once it tried the
	// next turn, a reap after the test (if any) is over.
	qt := queueTurns.Load()
	await.Until(t, "the queue's next reap turn", func() bool { return queueTurns.Load() > qt })
	s1 = stmts.snapshot()
	w = window(s0, s1)
	prunesMu.Lock()
	seen := append([]string(nil), prunesSeen...)
	prunesMu.Unlock()
	var other []string
	for k, n := range w {
		switch k {
		case "heartbeat", "reap turn", "prunes due", "statistics check":
			// The check of the tables' statistics goes with a prune turn.
		default:
			// The limits (a quiet refresh, every 30 s): not the reap's.
			// The keys are the statements' first 60 characters: the
			// limits' reads name their columns there.
			if !strings.Contains(k, "max_in_flight") && !strings.Contains(k, "rate_limit") {
				other = append(other, fmt.Sprintf("%q: %d", k, n))
			}
		}
	}
	if last := seen[len(seen)-1]; last != "due false, error <nil>" || queueReaps.Load() != qr0 || w["prunes due"] != 1 || len(other) > 0 {
		t.Errorf("the prune turn of an idle queue: test of the prunes %q (want due false), %d tests run, %d reaps (want none), other statements %v; by kind %v",
			last, w["prunes due"], queueReaps.Load()-qr0, other, w)
	}

	// 3. The control: an exhausted item (unclaimed, attempts used up),
	// which only the prunes' reap moves, is moved at the next prune turn.
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("exhausted"), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE crdbwork_items SET attempts = max_attempts WHERE id = $1`, res.IDs[0]); err != nil {
		t.Fatal(err)
	}
	setPruneDue()
	await.Until(t, "the exhausted item moved to the dead items by the prunes' reap", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, res.IDs[0])
		prunesMu.Lock()
		defer prunesMu.Unlock()
		return n == 1 && dead.Load() == 1, fmt.Sprintf("%d dead rows, %d counted dead by the reaps; tests of the prunes: %v", n, dead.Load(), prunesSeen)
	})
}

// A reap turn passes on when the session that took it stops: the next
// worker reaps the session of a process that died (a session lost without
// its row deleted, as after a SIGKILL) and releases an item whose lease
// expired, which it then runs.
func TestReapTurnsPassOnWhenTheReaperStops(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	hb := await.Stretch(100 * time.Millisecond)
	tuning := session.Tuning{Heartbeat: hb, Expiry: 20 * hb}
	q := newQueue(t, pool, claim.Options{})
	type reaper struct{ sessions, queue atomic.Int64 }
	var a, b reaper
	var released atomic.Int64
	opts := func(r *reaper) worker.Options {
		return worker.Options{Session: tuning, Testing: worker.TestingOptions{
			AfterReapTurn: func(name string, took bool, err error) {
				if took && name == "" {
					r.sessions.Add(1)
				} else if took {
					r.queue.Add(1)
				}
			},
			AfterQueueReap: func(st claim.ReapStats, err error) {
				if r == &b {
					released.Add(int64(st.Released))
				}
			},
		}}
	}
	// A peer session, so that the first worker is not alone in its
	// database: a session alone takes no turn of expired sessions (there
	// can be none).
	peer, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: time.Minute, Expiry: time.Hour, ReapEvery: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(context.Background()) })
	ra := startOn(t, q, recordHandler(0), opts(&a))
	await.Until(t, "the first worker to take both reap turns", func() (bool, string) {
		return a.sessions.Load() > 0 && a.queue.Load() > 0, fmt.Sprintf("sessions %d, queue %d", a.sessions.Load(), a.queue.Load())
	})
	ra.Stop(t)

	// A process that dies: its session stops heartbeating, its row stays.
	dctx, die := context.WithCancel(ctx)
	dead, err := session.Start(dctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 3 * hb, ReapEvery: -1}})
	if err != nil {
		t.Fatal(err)
	}
	// A live session's item whose lease expires: only a queue reap frees it.
	holder, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: hb, Expiry: 50 * hb, ReapEvery: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("leased")})
	if err != nil {
		t.Fatal(err)
	}
	items, err := q.Claimer(holder.ID()).Claim(ctx, claim.ClaimRequest{Max: 1, Lease: time.Millisecond})
	if err != nil || len(items) != 1 {
		t.Fatalf("claimed %d items: %v", len(items), err)
	}
	die()
	// The worker left starts once the first stopped: it must take the
	// turns the first took last.
	startOn(t, q, recordHandler(0), opts(&b))

	await.Until(t, "the dead process's session reaped", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_sessions WHERE id = $1`, dead.ID())
		return n == 0, fmt.Sprintf("%d rows; the second worker took the sessions' turn %d times", n, b.sessions.Load())
	})
	await.Until(t, "the item whose lease expired released and run", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1`, res.IDs[0])
		return n == 1, fmt.Sprintf("%d results; the second worker took the queue's turn %d times and released %d items", n, b.queue.Load(), released.Load())
	})
	// The second worker is the only reaper left (the other sessions reap
	// nothing): it took both turns, and its queue reap released the item.
	// The release is reported when the whole reap returns, after its
	// later steps (the crash loops, the expired items, the prunes, the
	// dependency sweep): by then the worker may have claimed, run and
	// acked the released item, so the count is awaited, not read.
	await.Until(t, "the second worker's queue reap to report the item released", func() (bool, string) {
		return released.Load() > 0, fmt.Sprintf("released %d items in %d queue turns", released.Load(), b.queue.Load())
	})
	if n := released.Load(); n != 1 {
		t.Errorf("the second worker's queue reaps released %d items; want 1 (the item whose lease expired)", n)
	}
	if b.sessions.Load() == 0 || b.queue.Load() == 0 {
		t.Errorf("the second worker took the sessions' turn %d times and the queue's %d times: want both taken by it", b.sessions.Load(), b.queue.Load())
	}
	// Released by the lease reaper, from the holder's claim, once: its
	// history says so (an attempt that ended as AttemptLease, of the
	// holder's session).
	info, err := q.Item(ctx, res.IDs[0])
	if err != nil {
		t.Fatal(err)
	}
	var leased []claim.Attempt
	for _, a := range info.History {
		if a.Outcome == claim.AttemptLease {
			leased = append(leased, a)
		}
	}
	if info.State != claim.StateAcked || len(leased) != 1 || leased[0].Session != holder.ID() {
		t.Errorf("the item is %s with history %+v; want it acked, one attempt whose lease ran out, of the holder's session %s", info.State, info.History, holder.ID())
	}
}

// An operator's change of the limits takes effect while the fleet reads
// limits that limit nothing only when the queue's change marker moves: the
// write raises it, the next heartbeat sees it, and the worker reads the
// new limit of 1 at once, well before its quiet refresh (30 s). With the
// limit in force the worker never runs two items at once.
func TestLimitWrittenWhileQuietTakesEffect(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	hb := await.Stretch(100 * time.Millisecond)
	refreshes := await.NewRounds("limit refreshes")
	var mu sync.Mutex
	cur, most := 0, 0
	h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		mu.Lock()
		cur++
		most = max(most, cur)
		mu.Unlock()
		defer func() { mu.Lock(); cur--; mu.Unlock() }()
		time.Sleep(5 * time.Millisecond) // the handler's work: items overlap if the limit does not hold
		return recordHandler(0)(ctx, it)
	}
	beats := await.NewRounds("heartbeats")
	// Each claim, for a failure's message: its size, its session and the
	// limits the worker had then (seen once: 8 items at once under a
	// limit of 1, cause not found).
	var claims []string
	var r *running
	onClaim := func(_ context.Context, items []claim.Item) {
		mu.Lock()
		rr := r
		mu.Unlock()
		var st worker.LimitStats
		if rr != nil {
			st = rr.w.Stats().Limits
		}
		mu.Lock()
		claims = append(claims, fmt.Sprintf("%s %d items of session %s, running %d, limits %+v",
			time.Now().Format("15:04:05.000"), len(items), items[0].Session, cur, st))
		mu.Unlock()
	}
	opts := worker.Options{Concurrency: 8, Session: session.Tuning{Heartbeat: hb, Expiry: 50 * hb},
		Testing: worker.TestingOptions{AfterLimitRefresh: refreshes.Tick, OnClaim: onClaim,
			Session: session.TestingOptions{AfterHeartbeat: func(bool, error) { beats.Tick() }}}}
	// The queue has its row before the worker starts (settings that limit
	// nothing): the write below changes the row, and only its raising of
	// the change counter moves the marker (a row created moves it too).
	setLimits(t, pool, "default", worker.Limits{})
	mu.Lock()
	r = start(t, pool, h, opts)
	mu.Unlock()
	refreshes.Wait(t, 1)
	await.Until(t, "the worker's limits read, limiting nothing", func() (bool, string) {
		st := r.w.Stats().Limits
		return !st.Stale && st.Limits.Queue.MaxInFlight == 0, fmt.Sprintf("%+v", st)
	})
	// The session's start has moved the marker (its join, its first
	// heartbeat's marker): a few heartbeats for the reads those moves
	// cause, so that none of them reads the limit written below.
	beats.Wait(t, 5)
	before, beat := refreshes.Count(), beats.Count()
	setLimits(t, pool, "default", worker.Limits{Queue: claim.Limit{MaxInFlight: 1}})
	await.Until(t, "the new limit read", func() (bool, string) {
		st := r.w.Stats().Limits
		return st.Limits.Queue.MaxInFlight == 1, fmt.Sprintf("%+v after %d refreshes", st, refreshes.Count()-before)
	})
	// Read at the heartbeat that saw the marker move (a heartbeat or two
	// after the write), not by the quiet refresh (30 s: 300 heartbeats of
	// 100 ms, 30 of a heartbeat stretched tenfold on a loaded machine).
	if n := beats.Count() - beat; n > 10 {
		t.Errorf("the new limit was read %d heartbeats after the write; want at most 10 (the heartbeat that sees the queue's change marker move)", n)
	}
	const n = 40
	enqueue(t, pool, "default", n, false)
	await.Until(t, "every item acked", func() (bool, string) {
		got := count(t, pool, `SELECT count(*) FROM results`)
		return got == n, fmt.Sprintf("%d of %d", got, n)
	})
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Errorf("%d items ran at once under a limit of 1; the claims:\n%s", most, strings.Join(claims, "\n"))
	}
}
