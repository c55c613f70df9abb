package worker

import (
	"context"
	"sync"
	"testing"
	"time"
)

// abandonLog records what a supervisor abandoned, and when.
type abandonLog struct {
	mu  sync.Mutex
	at  map[*job]time.Time
	got chan *job
}

func newAbandonLog() *abandonLog {
	return &abandonLog{at: map[*job]time.Time{}, got: make(chan *job, 16)}
}

func (l *abandonLog) abandon(j *job) {
	l.mu.Lock()
	l.at[j] = time.Now()
	l.mu.Unlock()
	l.got <- j
}

func (l *abandonLog) when(j *job) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[j]
	return t, ok
}

// waitAbandoned waits (at most a minute) until n jobs were abandoned.
func (l *abandonLog) waitAbandoned(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(time.Minute)
	for range n {
		select {
		case <-l.got:
		case <-deadline:
			t.Fatalf("fewer than %d jobs abandoned within a minute", n)
		}
	}
}

func testJob(deadline time.Time) *job {
	return &job{bucket: &deadlineBucket{deadline: deadline}}
}

// The supervisor abandons a handler HangGrace after its deadline, or after
// its context ended early, never before; never one that returned; and all
// of them HangGrace after the session's handler context ended. It ends once
// stopped with nothing left.
func TestSupervisorAbandonsAfterTheGrace(t *testing.T) {
	t.Parallel()
	const grace = 150 * time.Millisecond
	log := newAbandonLog()
	handlers, cancelHandlers := context.WithCancel(context.Background())
	defer cancelHandlers()
	s := newSupervisor(grace, log.abandon)
	ran := make(chan struct{})
	go func() { defer close(ran); s.run(handlers) }()

	start := time.Now()
	late := testJob(start.Add(100 * time.Millisecond)) // abandoned at its deadline + grace
	back := testJob(start.Add(time.Hour))              // returns in time (however late: the machine may be busy)
	early := testJob(start.Add(time.Hour))             // its context ends early
	s.add([]*job{late, back, early})
	if !s.returned(back) {
		t.Fatal("a handler that returned before any deadline was abandoned")
	}
	endedAt := time.Now()
	s.ended(early, endedAt)
	log.waitAbandoned(t, 2)
	if at, ok := log.when(late); !ok || at.Before(late.bucket.deadline.Add(grace)) {
		t.Errorf("job past its deadline abandoned at %v (ok %v); not before its deadline + grace, %v", at.Sub(start), ok, late.bucket.deadline.Add(grace).Sub(start))
	}
	if at, ok := log.when(early); !ok || at.Before(endedAt.Add(grace)) {
		t.Errorf("job whose context ended early abandoned at %v (ok %v); not before its end + grace, %v", at.Sub(start), ok, endedAt.Add(grace).Sub(start))
	}
	if _, ok := log.when(back); ok {
		t.Error("the job that returned was abandoned")
	}
	if late.state.Load() != jobAbandoned || early.state.Load() != jobAbandoned || back.state.Load() != jobReturned {
		t.Errorf("states %d %d %d; want abandoned, abandoned, returned", late.state.Load(), early.state.Load(), back.state.Load())
	}
	if s.returned(late) {
		t.Error("an abandoned handler's return was taken as in time")
	}

	// The session's handler context ends: every running handler is
	// abandoned a grace later, however far its deadline.
	a, b := testJob(time.Now().Add(time.Hour)), testJob(time.Now().Add(time.Hour))
	s.add([]*job{a, b})
	s.stop() // nothing more is added; it ends once the handler context ended and none is left
	cancelled := time.Now()
	cancelHandlers()
	log.waitAbandoned(t, 2)
	for _, j := range []*job{a, b} {
		if at, _ := log.when(j); at.Before(cancelled.Add(grace)) {
			t.Errorf("job abandoned %v after the handler context ended; not before the grace, %v", at.Sub(cancelled), grace)
		}
	}
	select {
	case <-ran:
	case <-time.After(time.Minute):
		t.Fatal("the supervisor did not end once stopped, its handler context ended and no handler left")
	}
}

// Items that start within a bucket's window share it; its deadline is
// never before any of their own deadlines, and at most the window after.
func TestDeadlineBucketsShareWithinTheWindow(t *testing.T) {
	t.Parallel()
	handlers, cancel := context.WithCancel(context.Background())
	defer cancel()
	const timeout = time.Second
	r := &sessionRun{w: &Worker{opts: Options{ItemTimeout: timeout}}, handlerCtx: handlers}
	now := time.Now()
	b1 := r.bucketFor(now)
	b2 := r.bucketFor(now.Add(bucketWindow(timeout) / 2))
	b3 := r.bucketFor(now.Add(2 * bucketWindow(timeout)))
	if b1 != b2 || b2 == b3 {
		t.Fatalf("buckets %p %p %p: want the first two shared, the third new", b1, b2, b3)
	}
	for i, c := range []struct {
		b     *deadlineBucket
		start time.Time
	}{{b1, now}, {b2, now.Add(bucketWindow(timeout) / 2)}, {b3, now.Add(2 * bucketWindow(timeout))}} {
		own := c.start.Add(timeout)
		if c.b.deadline.Before(own) || c.b.deadline.After(own.Add(bucketWindow(timeout))) {
			t.Errorf("item %d: bucket deadline %v after its start; want within [%v, %v]", i, c.b.deadline.Sub(c.start), timeout, timeout+bucketWindow(timeout))
		}
		if d, ok := c.b.ctx.Deadline(); !ok || !d.Equal(c.b.deadline) {
			t.Errorf("item %d: context deadline %v, %v; want %v", i, d, ok, c.b.deadline)
		}
	}
	// b1 (= b2) is no longer current: its two items' ends cancel it.
	b1.release()
	if b1.ctx.Err() != nil {
		t.Fatal("bucket cancelled while an item still uses it")
	}
	b2.release()
	if b1.ctx.Err() == nil {
		t.Fatal("bucket not cancelled after its last item ended")
	}
	if b3.ctx.Err() != nil {
		t.Fatal("the current bucket was cancelled")
	}
}

// Items with timeouts of their own (claim.Item.Timeout) join the
// supervisor's list in the order of their deadlines, wherever they come in
// the claim's batch: a handler with a short deadline, added behind one with
// a long one, is abandoned at its own deadline + grace, not behind it.
func TestSupervisorKeepsOwnTimeoutsInOrder(t *testing.T) {
	t.Parallel()
	const grace = 50 * time.Millisecond
	log := newAbandonLog()
	handlers, cancelHandlers := context.WithCancel(context.Background())
	defer cancelHandlers()
	s := newSupervisor(grace, log.abandon)
	go s.run(handlers)

	start := time.Now()
	long := testJob(start.Add(time.Hour))
	mid := testJob(start.Add(30 * time.Minute))
	short := testJob(start.Add(50 * time.Millisecond))
	s.add([]*job{long})
	s.add([]*job{mid, short})
	s.mu.Lock()
	var order []*job
	for j := s.head; j != nil; j = j.next {
		order = append(order, j)
	}
	tail := s.tail
	s.mu.Unlock()
	if len(order) != 3 || order[0] != short || order[1] != mid || order[2] != long || tail != long {
		t.Fatalf("the list is not in the order of the deadlines: %d jobs, short first %v, long last %v", len(order), order[0] == short, tail == long)
	}
	log.waitAbandoned(t, 1)
	if at, ok := log.when(short); !ok || at.Before(short.bucket.deadline.Add(grace)) {
		t.Errorf("the short job abandoned at %v (ok %v); not before its deadline + grace", at.Sub(start), ok)
	}
	if !s.returned(mid) || !s.returned(long) {
		t.Fatal("a job with a far deadline was abandoned")
	}
}
