package worker

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Fair pacing keeps the parts-mode sessions of a fair queue within a few
// claims of each other in turn order, so that the queue is fair across the
// fleet and not only within each session (docs/fairness.md).
//
// In a fair queue enqueue stamps each tenant's items with turns 1 µs apart
// from the queue's head and spreads a tenant's items without a key over the
// parts by turn (claim's fairspread.go): every part holds its share of every
// backlogged tenant's items, in turn order, and each session claims its own
// parts in turn order. A session that drifts far ahead of the others reaches
// turns where only the big tenants have items left, while the small tenants'
// last items wait in the parts of the sessions behind; left alone, the drift
// grows without bound (sessions never claim at exactly the same pace).
//
// The pacing bounds the drift without shrinking claims and without reading
// anything while a session is not ahead:
//
//   - A claim is always as large as the free slots allow: the bound is on
//     when a session claims, not on how much.
//   - A session may claim while the turn its claim would reach (its last
//     claim's front plus the free slots' worth of its parts' items, by the
//     density of its last claim) is at most paceClaims such claims past the
//     queue's head: a session may lead the slowest by paceClaims-1 claims.
//     The head moves in steps (a claim of the slowest session), so with a
//     tight bound sessions wait on one another at every step, and their
//     slots run dry while they wait. A lead of one claim kept Jain's index
//     at 0.92–0.93 in the fairness bench at 200 tenants and 0.95–0.96 at
//     1,000 (16 parts, 4 sessions) and drains at 0.93× plain; a lead of two
//     or three claims drained at 0.98× but kept 0.90–0.92 and 0.89–0.91 at
//     200 tenants (docs/fairness.md). A lead of three claims was chosen
//     before, while the bench's claims ran on a table PostgreSQL had never
//     analyzed and walked the whole queue's index (now analyzed at once:
//     queuemaint.Queue.RefreshStatistics); a lead of one claim cost 0.875× then.
//     Sessions that claim any part at once spread over a few claims' worth
//     of turns anyway (each takes a claim's worth of consecutive turns).
//   - The head only moves forward while a backlog drains, so a head read
//     earlier is at or behind the current one: a session that is within the
//     slack of the last head it read (moved on by half its recent pace,
//     for at most paceMaxStep) is within it of the current one, and reads
//     nothing. Only a session that looks ahead reads the head (one index
//     seek past a few stragglers, store.Store.ItemsFairFront).
//   - A session that is ahead waits (its handlers keep working on what it
//     holds) until the head comes within the slack, re-reading it when the
//     head, at half its recent pace, would be there (paceStep to
//     paceMaxStep). It waits only while the head is in a part another session
//     owns, that is, while a session behind it has the items to claim, so
//     the wait hands the database and the machine to the sessions behind
//     rather than idling them. A head that does not move for paceStuck (a
//     part between owners, a tenant held back by its limit, a dead session's
//     part) ends the pacing until it moves, and no wait lasts more than
//     paceMax. A read that fails, or a queue that is not fair, leaves claims
//     unpaced: pacing costs fairness when it does not apply, never an item.
const (
	// paceClaims is how many claims of the size at hand a session's claim
	// may reach past the queue's head.
	paceClaims = 2
	// paceMinSlack is the least slack, in turns (1 µs a round).
	paceMinSlack = 4 * time.Microsecond
	// paceSkip is how many of the earliest unclaimed items the head read
	// steps over: a few stragglers (a newcomer stamped from a head read
	// moments ago, an item just released) do not hold the fleet back.
	paceSkip = 16
	// paceStep is how often a session that is ahead re-reads the head.
	paceStep = 2 * time.Millisecond
	// paceMaxStep bounds how long a session that is ahead waits before it
	// reads the head again, and how far ahead of the last read it
	// predicts the head.
	paceMaxStep = 10 * time.Millisecond
	// paceTrust is the share of the head's recent pace that predictions
	// of it count on.
	paceTrust = 0.5
	// paceStuck is the longest a session waits for a head that does not
	// move.
	paceStuck = 50 * time.Millisecond
	// paceMax bounds a session's wait for a head that moves, but slowly.
	paceMax = 200 * time.Millisecond
	// paceSettings is how long the queue's fair setting, once read, is
	// used.
	paceSettings = time.Second
)

// fairPace paces one session's parts-mode claims (see paceClaims). It is
// used by the session's claim loop only.
type fairPace struct {
	// readFront reads the queue's front at a priority past skip items and
	// its part (store.Store.ItemsFairFront); isFairNow reads the queue's fair
	// setting. Both are set by newFairPace (tests replace them).
	readFront func(ctx context.Context, priority int64, skip int) (time.Time, int, bool, error)
	isFairNow func(ctx context.Context) (bool, error)
	// fair is the queue's setting, read at fairRead.
	fair     bool
	fairRead time.Time
	// known: the last claim gave a front (items with a tenant): front is
	// their latest turn at priority prio, density their number per µs of
	// turns in the session's parts.
	known   bool
	prio    int
	front   time.Time
	density float64
	// head is the last head read, at priority headPrio (headOK: there is
	// one); stuck is a head that did not move for paceStuck (zero: none).
	head     time.Time
	headPrio int
	headOK   bool
	stuck    time.Time
	// headAt is when head was read, and speed how fast the head moved
	// between reads lately, in µs of turns per second (0: not known).
	headAt time.Time
	speed  float64
	// reads and waits count the head reads and the waits (for the tests).
	reads, waits int
}

// newFairPace returns the pacing of a session of w's queue.
func newFairPace(w *Worker) *fairPace {
	return &fairPace{
		readFront: func(ctx context.Context, priority int64, skip int) (time.Time, int, bool, error) {
			d, err := w.engine(ctx)
			if err != nil {
				return time.Time{}, 0, false, err
			}
			return w.store.ItemsFairFront(ctx, w.db, d, w.name, priority, skip)
		},
		isFairNow: func(ctx context.Context) (bool, error) {
			// One read by primary key (not claim.Queue.Settings, which
			// reads all of the queue's settings).
			r, _, err := w.store.QueueSettings(ctx, w.db, w.name)
			return r.Fair, store.Classify(err)
		},
	}
}

// engine returns the dialect of the worker's database, asked of the server
// once (a failed attempt is made again at the next call).
func (w *Worker) engine(ctx context.Context) (store.Dialect, error) {
	if d := w.dialect.Load(); d != nil {
		return *d, nil
	}
	d, err := store.DetectDialect(ctx, w.db)
	if err != nil {
		return d, err
	}
	w.dialect.Store(&d)
	return d, nil
}

// slack returns how far past the head, in turns, a claim of n items may
// reach.
func (p *fairPace) slack(n int) time.Duration {
	span := float64(n) * paceClaims / p.density
	return max(paceMinSlack, time.Duration(math.Ceil(span))*time.Microsecond)
}

// reach returns the turn a claim of n items would reach.
func (p *fairPace) reach(n int) time.Time {
	return p.front.Add(time.Duration(math.Ceil(float64(n)/p.density)) * time.Microsecond)
}

// ahead reports whether a claim of n items would reach past the slack of
// head.
func (p *fairPace) ahead(n int, head time.Time) bool {
	return p.reach(n).Sub(head) > p.slack(n)
}

// wait returns when the session may claim n items: at once unless it is
// ahead of the queue's head (see paceClaims). owned returns the session's
// parts. It never changes how many items the claim takes.
func (p *fairPace) wait(ctx context.Context, n int, owned func() []int) {
	if !p.known || n <= 0 {
		return
	}
	if p.headOK && p.headPrio == p.prio && !p.ahead(n, p.predicted(time.Now())) {
		return // within the slack of a head at or behind the current one
	}
	if !p.isFair(ctx) {
		return
	}
	start := time.Now()
	var last time.Time  // the head last read
	var since time.Time // when it was first read at that value
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		head, part, ok := p.readHead(ctx)
		if !ok || head.Equal(p.stuck) {
			return
		}
		p.stuck = time.Time{}
		if !p.ahead(n, head) || slices.Contains(owned(), part) {
			// Within the slack, or the head is in the session's own
			// parts (an item released, a part just acquired): its claim
			// takes it.
			return
		}
		if time.Since(start) >= paceMax {
			return
		}
		if !head.Equal(last) {
			last, since = head, time.Now()
		} else if time.Since(since) >= paceStuck {
			p.stuck = head // it does not move: stop waiting for it
			return
		}
		// Until the head, at half the pace it moved lately, comes within
		// reach (paceStep to paceMaxStep): each read costs the database
		// an index seek past the entries of items just claimed.
		d := paceStep
		if p.speed > 0 {
			lead := float64(p.reach(n).Sub(head.Add(p.slack(n))).Microseconds())
			d = min(max(time.Duration(lead/(p.speed*paceTrust)*float64(time.Second)), paceStep), paceMaxStep)
		}
		if t == nil {
			p.waits++
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readHead reads the front of the queue at the session's priority, past
// up to paceSkip stragglers, and its part (false: none, or the read
// failed).
func (p *fairPace) readHead(ctx context.Context) (time.Time, int, bool) {
	// At most as many as the session's parts hold in a round: with few
	// backlogged tenants, 16 items are many rounds.
	skip := min(paceSkip, int(p.density))
	p.reads++
	turn, part, ok, err := p.readFront(ctx, int64(p.prio), skip)
	if err != nil || !ok {
		p.headOK = false
		return time.Time{}, 0, false
	}
	now := time.Now()
	if dt := now.Sub(p.headAt); p.headOK && p.headPrio == p.prio && dt >= time.Millisecond && turn.After(p.head) {
		v := float64(turn.Sub(p.head).Microseconds()) / dt.Seconds()
		if p.speed > 0 {
			v = (p.speed + v) / 2
		}
		p.speed = v
	}
	p.head, p.headPrio, p.headOK, p.headAt = turn, p.prio, true, now
	return turn, part, true
}

// predicted returns where the head is at now, by the last read and half
// the pace the head moved at lately: a conservative guess (the head moves
// forward while a backlog drains), so that a session that is not ahead
// need not read it.
func (p *fairPace) predicted(now time.Time) time.Time {
	if p.speed <= 0 {
		return p.head
	}
	moved := p.speed * paceTrust * min(now.Sub(p.headAt), paceMaxStep).Seconds()
	return p.head.Add(time.Duration(moved) * time.Microsecond)
}

// isFair reports the queue's fair setting, read at most every
// paceSettings (a failed read keeps the last value).
func (p *fairPace) isFair(ctx context.Context) bool {
	if !p.fairRead.IsZero() && time.Since(p.fairRead) < paceSettings {
		return p.fair
	}
	p.fairRead = time.Now()
	if fair, err := p.isFairNow(ctx); err == nil {
		p.fair = fair
	}
	return p.fair
}

// claimed notes the front of a claim's items: the latest turn among the
// items with a tenant at the best priority among them, and how many items
// per µs of turns they held.
func (p *fairPace) claimed(items []claim.Item) {
	best, found := 0, false
	for _, it := range items {
		if it.Tenant != "" && (!found || it.Priority < best) {
			best, found = it.Priority, true
		}
	}
	if !found {
		return
	}
	var first, last time.Time
	count := 0
	for _, it := range items {
		if it.Tenant == "" || it.Priority != best {
			continue
		}
		if count == 0 || it.TurnAt.Before(first) {
			first = it.TurnAt
		}
		if count == 0 || it.TurnAt.After(last) {
			last = it.TurnAt
		}
		count++
	}
	est := float64(count) / float64(last.Sub(first).Microseconds()+1)
	if count < 16 && p.known && p.prio == best {
		// Too few items to tell (the last of a backlog, a trickle's
		// item): keep the larger estimate.
		est = max(est, p.density)
	}
	if p.known && p.prio == best && last.Before(p.front) {
		last = p.front // a straggler behind the front does not move it back
	}
	p.known, p.prio, p.front = true, best, last
	p.density = max(0.01, est)
}
