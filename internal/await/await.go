// Package await is the test suite's one way to wait. A test waits for a
// condition to hold (Until), for a channel (Recv), for a loop of the code
// under test to have run a number of rounds (Rounds, fed by a test hook),
// and shows that something does not happen by watching it through rounds
// of the loop that could have done it (Never) — never by sleeping.
//
// # Deadlines stretch with the machine
//
// A wait's deadline only decides how long a failing test takes to say so:
// a test that passes never reaches it. So deadlines are generous, and they
// stretch: a wait's budget (DefaultWithin, or Within) is multiplied by
// Scale, which is
//
//	CRDBWORK_TEST_SCALE (default 1) × max(1, 1-minute load average / CPUs)
//
// read when the wait starts and again whenever the deadline is reached: a
// wait whose machine got busier meanwhile goes on to the longer deadline.
// The load average counts the runnable processes of the whole machine (other
// test binaries, the database servers, anything else), so a 2-core machine
// with eight CPU-burning processes beside the suite (a load of about 10)
// waits five times longer before failing. CRDBWORK_TEST_SCALE multiplies
// that for machines whose slowness the load does not show (a slow disk, a
// throttled container): CRDBWORK_TEST_SCALE=3 go test ./... . Where the
// load average cannot be read (not Linux), only the variable counts. The
// load is read at each deadline rather than measured once by a calibration
// loop at start: the load of a shared machine moves during a run, and a
// calibration needs a reference speed that differs from machine to
// machine. A wait
// never outlasts the test binary's own deadline (go test -timeout): it fails
// with its message a little before, rather than leaving the binary to panic
// without one.
//
// Durations a test configures for the code under test and that must hold
// on a busy machine — a session expiry its heartbeats must beat, a schedule
// period its runners must not all miss — are stretched the same way with
// Stretch.
//
// # Failing
//
// A wait that times out fails the test (t.Fatalf) with what was awaited,
// how long it waited and why that long (the budget, the scale, the load),
// and the last state the condition reported: a condition may return a
// bool, a bool and a string describing what it saw, or an error (nil when
// it holds, otherwise what it saw).
package await

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DefaultWithin is a wait's budget before it is multiplied by Scale.
const DefaultWithin = 30 * time.Second

// ScaleEnv names the environment variable whose value (a positive number,
// default 1) multiplies every deadline and every Stretch.
const ScaleEnv = "CRDBWORK_TEST_SCALE"

// Default polling: the first poll comes after minEvery, each later one
// after half as long again as the one before, up to maxEvery. A condition
// that holds at once costs one call; one that runs a statement is not run
// more than ten times a second for long.
const (
	minEvery = 5 * time.Millisecond
	maxEvery = 100 * time.Millisecond
)

// deadlineMargin is how long before the test binary's deadline a wait gives
// up, so that its message is printed and the cleanups run.
const deadlineMargin = 10 * time.Second

// Cond is a condition to wait for: a func() bool; a func() (bool, string)
// whose string says what it saw (shown if the wait times out); or a
// func() error, nil when the condition holds, otherwise an error saying
// what it saw.
type Cond interface {
	func() bool | func() (bool, string) | func() error
}

// Event is what Never watches for: a func() bool, true when the thing
// happened, or a func() (bool, string) whose string says what was seen.
type Event interface {
	func() bool | func() (bool, string)
}

// Option changes one wait.
type Option func(*config)

type config struct {
	within time.Duration
	every  time.Duration // 0: the default back-off
	show   func() string
}

// Within sets the wait's budget before scaling (default DefaultWithin).
// Give the time the awaited thing may take on a quiet machine, generously:
// the budget is not a test of speed (benchmarks measure speed).
func Within(d time.Duration) Option { return func(c *config) { c.within = d } }

// Every polls the condition every d instead of the default back-off from
// 5 ms to 100 ms.
func Every(d time.Duration) Option { return func(c *config) { c.every = d } }

// Show adds what f returns to the failure message of a wait that times
// out: the output of a process under test, the rows of a table.
func Show(f func() string) Option { return func(c *config) { c.show = f } }

// Until polls cond until it holds and returns how long that took. If it
// does not hold within the wait's deadline, it fails the test with what
// (what was awaited: "every item acked"), the wait's budget and scale and
// the last state cond reported. cond runs on the test's goroutine and may
// call t.Fatal.
func Until[C Cond](t testing.TB, what string, cond C, opts ...Option) time.Duration {
	t.Helper()
	c := newConfig(opts)
	check := asCheck(cond)
	start := time.Now()
	d := newDeadline(t, start, c.within)
	every := c.every
	if every == 0 {
		every = minEvery
	}
	for {
		ok, state := check()
		if ok {
			return time.Since(start)
		}
		if d.passed(time.Now()) {
			t.Fatalf("%s", d.failure("waiting for "+what, state, c.show))
			return time.Since(start)
		}
		time.Sleep(every)
		if c.every == 0 {
			every = min(every*3/2, maxEvery)
		}
	}
}

// Recv waits for a value from ch and returns it (the zero value if ch is
// closed). If none comes within the wait's deadline, it fails the test
// saying what was awaited.
func Recv[T any](t testing.TB, what string, ch <-chan T, opts ...Option) T {
	t.Helper()
	c := newConfig(opts)
	start := time.Now()
	d := newDeadline(t, start, c.within)
	for {
		timer := time.NewTimer(max(time.Millisecond, d.remaining(time.Now())))
		select {
		case v := <-ch:
			timer.Stop()
			return v
		case <-timer.C:
		}
		if d.passed(time.Now()) {
			t.Fatalf("%s", d.failure("waiting for "+what, "", c.show))
			var zero T
			return zero
		}
	}
}

// Never shows that something does not happen: it polls happened (true
// means it happened; a string says what was seen) until rounds has counted
// n more rounds than when Never was called, and fails the test at once if
// it happened. Choose rounds so that each one is a chance for the thing to
// happen — the rounds of the loop that would do it, counted by a test hook
// — and n so that the chances are enough: then no sleep is needed, and a
// slow machine only makes the wait longer. what names the thing that must
// not happen ("the delayed item is claimed"). The last poll comes after the
// n-th round. It fails too if the rounds do not come within the wait's
// deadline.
func Never[E Event](t testing.TB, what string, rounds *Rounds, n int, happened E, opts ...Option) {
	t.Helper()
	c := newConfig(opts)
	check := asCheck(happened)
	from := rounds.Count()
	target := from + int64(n)
	start := time.Now()
	d := newDeadline(t, start, c.within)
	every := c.every
	if every == 0 {
		every = minEvery
	}
	for {
		// Read the rounds before the poll: the last poll then comes after
		// the n-th round ended.
		wake := rounds.next()
		seen := rounds.Count() - from
		if ok, state := check(); ok {
			if state != "" {
				state = " (" + state + ")"
			}
			t.Fatalf("%s happened%s, after %d of %d rounds of %s", what, state, min(seen, int64(n)), n, rounds.name)
			return
		}
		if seen >= int64(n) {
			return
		}
		if d.passed(time.Now()) {
			t.Fatalf("%s", d.failure(fmt.Sprintf("waiting for %d rounds of %s (to show that %s does not happen)", n, rounds.name, what),
				fmt.Sprintf("%d rounds of %d came", rounds.Count()-from, target-from), c.show))
			return
		}
		timer := time.NewTimer(every)
		select {
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
		if c.every == 0 {
			every = min(every*3/2, maxEvery)
		}
	}
}

// Rounds counts the rounds of a loop of the code under test: give its Tick
// (or a function that calls it) to a test hook that runs after each round,
// such as worker.TestingOptions.AfterIdleClaim. Wait waits for rounds to
// come; Never watches something through rounds. The zero value is not
// usable: make one with NewRounds. Its methods are safe for concurrent use.
type Rounds struct {
	name string
	mu   sync.Mutex
	n    int64
	ch   chan struct{} // closed and replaced at each Tick
}

// NewRounds returns a counter of rounds of what the name says ("idle claim
// rounds"), used in failure messages.
func NewRounds(name string) *Rounds { return &Rounds{name: name, ch: make(chan struct{})} }

// Tick counts one round. Call it from the hook, after the round's work.
func (r *Rounds) Tick() {
	r.mu.Lock()
	r.n++
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}

// Count returns how many rounds were counted so far.
func (r *Rounds) Count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// next returns a channel closed at the next Tick.
func (r *Rounds) next() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ch
}

// Wait waits until n more rounds than now have been counted, and fails the
// test if they do not come within the wait's deadline. A round that was
// under way when Wait was called counts: to be sure that n whole rounds
// ran after some change, wait for n+1.
func (r *Rounds) Wait(t testing.TB, n int, opts ...Option) {
	t.Helper()
	r.WaitFor(t, r.Count()+int64(n), opts...)
}

// WaitFor waits until the count reaches total (Count reads it: note it
// before a change, and wait for it plus n after).
func (r *Rounds) WaitFor(t testing.TB, total int64, opts ...Option) {
	t.Helper()
	c := newConfig(opts)
	start := time.Now()
	d := newDeadline(t, start, c.within)
	for {
		ch := r.next()
		got := r.Count()
		if got >= total {
			return
		}
		timer := time.NewTimer(max(time.Millisecond, d.remaining(time.Now())))
		select {
		case <-ch:
			timer.Stop()
			continue
		case <-timer.C:
		}
		if d.passed(time.Now()) {
			t.Fatalf("%s", d.failure(fmt.Sprintf("waiting for %s (count %d)", r.name, total),
				fmt.Sprintf("counted %d", r.Count()), c.show))
			return
		}
	}
}

// Stretch returns d multiplied by Scale, or d if Scale is below 1 (a
// CRDBWORK_TEST_SCALE below 1 shortens the waits, to see a failure sooner,
// never the durations given to the code under test): for durations a test
// gives the code under test that must hold on a busy machine (a session
// expiry that its heartbeats must beat while the machine is loaded), not
// for a wait. A stretched duration is a whole number of milliseconds (never
// below d), so that it survives a round trip through the database (an
// INTERVAL keeps microseconds) and compares equal to what is read back.
func Stretch(d time.Duration) time.Duration {
	s := time.Duration(float64(d) * max(1, Scale()))
	if s <= d {
		return d
	}
	return max(d, s.Truncate(time.Millisecond))
}

// Scale returns the factor deadlines are multiplied by now: the
// CRDBWORK_TEST_SCALE variable times the load factor (see the package
// documentation). It panics if the variable is set to anything but a
// positive number.
func Scale() float64 {
	return envScale() * loadFactor()
}

var (
	envOnce  sync.Once
	envValue float64
)

func envScale() float64 {
	envOnce.Do(func() {
		v, err := parseScale(os.Getenv(ScaleEnv))
		if err != nil {
			panic("await: " + err.Error())
		}
		envValue = v
	})
	return envValue
}

// parseScale reads the value of ScaleEnv: empty is 1.
func parseScale(raw string) (float64, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return 1, nil
	}
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil || !(v > 0) || v > 1000 {
		return 0, fmt.Errorf("%s=%q is not a number above 0 and at most 1000 (the factor by which tests' deadlines stretch)", ScaleEnv, raw)
	}
	return v, nil
}

// loadFactor is the 1-minute load average per CPU, at least 1; 1 where it
// cannot be read.
func loadFactor() float64 {
	l, ok := loadAvg()
	if !ok {
		return 1
	}
	return max(1, l/float64(runtime.NumCPU()))
}

// loadAvg reads the 1-minute load average (Linux).
func loadAvg() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

func newConfig(opts []Option) config {
	c := config{within: DefaultWithin}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// deadline is one wait's stretching deadline.
type deadline struct {
	start  time.Time
	within time.Duration
	scale  float64   // the largest scale seen so far
	hard   time.Time // the test binary's deadline less the margin; zero: none
}

func newDeadline(t testing.TB, start time.Time, within time.Duration) *deadline {
	d := &deadline{start: start, within: within, scale: Scale()}
	if td, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := td.Deadline(); ok {
			d.hard = end.Add(-deadlineMargin)
		}
	}
	return d
}

func (d *deadline) end() time.Time {
	end := d.start.Add(time.Duration(float64(d.within) * d.scale))
	if !d.hard.IsZero() && d.hard.Before(end) {
		return d.hard
	}
	return end
}

func (d *deadline) remaining(now time.Time) time.Duration { return d.end().Sub(now) }

// passed reports whether the deadline has passed, after stretching it to
// the scale of now.
func (d *deadline) passed(now time.Time) bool {
	if now.Before(d.end()) {
		return false
	}
	d.scale = max(d.scale, Scale())
	return !now.Before(d.end())
}

func (d *deadline) failure(what, state string, show func() string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "timed out after %v %s", time.Since(d.start).Round(time.Millisecond), what)
	load := "load average unknown"
	if l, ok := loadAvg(); ok {
		load = fmt.Sprintf("load %.1f on %d CPUs", l, runtime.NumCPU())
	}
	fmt.Fprintf(&b, " (budget %v × scale %.2f: %s %g, %s", d.within, d.scale, ScaleEnv, envScale(), load)
	if !d.hard.IsZero() && !d.hard.After(d.start.Add(time.Duration(float64(d.within)*d.scale))) {
		b.WriteString("; cut short by the test binary's -timeout")
	}
	b.WriteString(")")
	if state != "" {
		fmt.Fprintf(&b, "; last seen: %s", state)
	}
	if show != nil {
		fmt.Fprintf(&b, "\n%s", show())
	}
	return b.String()
}

// asCheck turns a Cond into a function returning whether it holds and the
// state it reported.
func asCheck[C Cond | Event](cond C) func() (bool, string) {
	switch f := any(cond).(type) {
	case func() bool:
		return func() (bool, string) { return f(), "" }
	case func() (bool, string):
		return f
	case func() error:
		return func() (bool, string) {
			if err := f(); err != nil {
				return false, err.Error()
			}
			return true, ""
		}
	}
	panic("unreachable: Cond has three types")
}
