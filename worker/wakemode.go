package worker

import (
	"math/rand/v2"
	"time"

	"github.com/crdbwork/crdbwork/internal/wake"
)

// Defaults of Options.ProbeEvery and Options.ProbePoll (see WakeProbe).
const (
	DefaultProbeEvery = 30 * time.Millisecond
	DefaultProbePoll  = 2 * time.Second
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
// Poll, or ProbePoll while the idle probe of its queue answers (drawn
// between half and one and a half of either); and, while the probe runs
// for its queue, marks the worker idle (call done when the wait ends) so
// that the probe probes the queue.
func (w *Worker) idleWait() (d time.Duration, done func()) {
	done = func() {}
	poll := w.opts.Poll
	if w.probing {
		done = wake.Idle(w.channel)
		if wake.Probing(w.channel) {
			poll = w.opts.ProbePoll
		}
	}
	return poll/2 + rand.N(poll+1), done
}
