package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/wake"
)

// Defaults of Options.ProbeEvery and Options.ProbePoll (see WakeProbe),
// and of Options.ListenPoll.
const (
	DefaultProbeEvery = 30 * time.Millisecond
	DefaultProbePoll  = 2 * time.Second
	DefaultListenPoll = 10 * time.Second
)

// WakeMode selects how an idle worker learns of items that other processes
// enqueued (Options.Wake). Enqueues through a claim.Queue in the worker's
// own process wake it directly in every mode, and its poll stays the
// fallback in every mode: no wake-up is needed for correctness.
type WakeMode int

const (
	// WakeAuto, the default: LISTEN on PostgreSQL (WakeListen), the idle
	// probe on CockroachDB (WakeProbe). The worker starts the listener,
	// whose first connection finds the engine; on CockroachDB it stops and
	// the probe starts.
	WakeAuto WakeMode = iota
	// WakeListen: on PostgreSQL the notifications enqueues send, received
	// on one connection per process and database (see Options.NoWake); on
	// CockroachDB nothing but in-process wake-ups (crdbwork before 0.5).
	WakeListen
	// WakeProbe: the idle probe, on either engine, without LISTEN. While
	// a worker of the queue idles, its process runs one read-only,
	// index-backed statement per queue every ProbeEvery (30 ms by
	// default, jittered by a fifth) on one connection of its own per
	// database (the claim's read of up to 8 items, without locks or
	// writes), and wakes its idle workers of the queue when it finds items
	// it has not announced yet, naming their parts as hints (in parts
	// mode a worker claims only in those it owns). While the probe
	// answers, idle workers claim every ProbePoll (2 s) instead of every
	// Poll; when it stops answering (an error, a statement that takes
	// over 2 s, a lost connection) they are woken and go back to Poll, and
	// the probe reconnects with backoff (100 ms to 10 s). Cost: per
	// process, at most one such read per queue per ProbeEvery while some
	// worker of the queue idles, none while all are busy; see
	// docs/operations.md, "Wake-ups". Without the listener, cancel
	// requests of running items (claim.Queue.CancelItem) are found at the
	// session's next heartbeat, as on CockroachDB.
	WakeProbe
)

// String returns "auto", "listen" or "probe".
func (m WakeMode) String() string {
	switch m {
	case WakeAuto:
		return "auto"
	case WakeListen:
		return "listen"
	case WakeProbe:
		return "probe"
	}
	return "WakeMode(?)"
}

// idleWait returns how long an idle worker waits before it claims again:
// Poll, or ProbePoll while the idle probe of its queue answers, or
// ListenPoll while the process's listener listens on its queue's channel
// and look (the last idle look, see idleLook) says nothing vests sooner
// (drawn between half and one and a half of either, but never past the
// first vesting look knows of); and, while the probe runs for its queue,
// marks the worker idle (call done when the wait ends) so that the probe
// probes the queue.
func (w *Worker) idleWait(look *idleLook) (d time.Duration, done func()) {
	done = func() {}
	poll := w.opts.Poll
	if w.probing {
		done = wake.Idle(w.channel)
		if wake.Probing(w.channel) {
			poll = w.opts.ProbePoll
		}
	}
	if w.listenLong && look != nil && wake.Listening(w.channel) {
		if until, ok := look.wait(w.opts.ListenPoll); ok {
			d = w.opts.ListenPoll/2 + rand.N(w.opts.ListenPoll+1)
			return min(d, until), done
		}
	}
	return poll/2 + rand.N(poll+1), done
}

// idleLook is a claim loop's knowledge of when the first unclaimed item
// of its parts vests, while its listener listens (see
// Options.ListenPoll): the last look (store.Store.ItemsIdleLook), taken
// after a claim that found nothing, once something happened since the
// look before (stale).
type idleLook struct {
	stale bool
	at    time.Time // when the last look was read
	res   store.IdleLook
	ok    bool // the last look succeeded
}

// wait returns how long from now nothing can become claimable that a
// notification does not announce, by the last look (at most long), and
// ok false when the worker must poll at Poll: no look yet, a failed one,
// or one that could not tell (see store.IdleLook.Exact). An exact look
// stays good until something happens (stale): items that later become
// claimable without a notification (another process's nack, a lease
// reap) are claimed by the next claim every long.
func (l *idleLook) wait(long time.Duration) (time.Duration, bool) {
	if !l.ok || !l.res.Exact() {
		return 0, false
	}
	if l.res.Read == 0 {
		return long, true
	}
	// A few milliseconds late: the item vests by the database's clock.
	return max(0, l.res.Until-time.Since(l.at)) + idleLookSlack, true
}

// idleLookSlack is how long after the time a look gave for the first
// vesting the worker claims.
const idleLookSlack = 5 * time.Millisecond

// needed reports whether the claim loop should look again after a claim
// that found nothing: something happened since the last look, it failed,
// or it could not tell and is older than long.
func (l *idleLook) needed(long time.Duration) bool {
	return l.stale || !l.ok || (!l.res.Exact() && time.Since(l.at) > long)
}

// readIdleLook takes a look at the unclaimed items of parts (nil: the
// queue's) into l.
func (w *Worker) readIdleLook(ctx context.Context, l *idleLook, parts []int) {
	l.stale = false
	l.at = time.Now()
	d, err := w.engine(ctx)
	if err == nil {
		l.res, err = w.store.ItemsIdleLook(ctx, w.db, d, w.name, parts)
	}
	l.ok = err == nil
	if h := w.opts.Testing.AfterIdleLook; h != nil && ctx.Err() == nil {
		h(l.ok && l.res.Exact(), err)
	}
}
