package await

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a wait's failure: Fatalf ends the goroutine like the real
// one.
type fakeT struct {
	testing.TB // nil: only Helper, Fatalf and Deadline are called
	mu         sync.Mutex
	msg        string
	failed     bool
	deadline   time.Time
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg, f.failed = fmt.Sprintf(format, args...), true
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeT) Deadline() (time.Time, bool) { return f.deadline, !f.deadline.IsZero() }

// run runs fn with a fakeT on a goroutine of its own and returns whether it
// failed and with what message.
func run(f *fakeT, fn func(t testing.TB)) (bool, string) {
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed, f.msg
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int64
	go func() {
		for range 5 {
			time.Sleep(time.Millisecond)
			n.Add(1)
		}
	}()
	took := Until(t, "five increments", func() bool { return n.Load() >= 5 })
	if n.Load() < 5 || took <= 0 {
		t.Fatalf("returned after %v with n = %d", took, n.Load())
	}
	// The other forms of condition.
	Until(t, "a state", func() (bool, string) { return true, "" })
	Until(t, "no error", func() error { return nil })
}

// A wait that times out says what it waited for, the last state seen, the
// budget and scale, and the extra diagnostics.
func TestUntilFailsWithWhatAndTheLastState(t *testing.T) {
	for name, wait := range map[string]func(t testing.TB){
		"state": func(t testing.TB) {
			Until(t, "the answer", func() (bool, string) { return false, "41 so far" }, Within(20*time.Millisecond), Show(func() string { return "process output" }))
		},
		"error": func(t testing.TB) {
			Until(t, "the answer", func() error { return errors.New("41 so far") }, Within(20*time.Millisecond), Show(func() string { return "process output" }))
		},
	} {
		failed, msg := run(&fakeT{}, wait)
		if !failed {
			t.Fatalf("%s: the wait did not fail", name)
		}
		for _, want := range []string{"waiting for the answer", "last seen: 41 so far", "budget 20ms × scale", ScaleEnv, "process output"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message %q lacks %q", name, msg, want)
			}
		}
	}
}

// The budget is multiplied by the scale: a wait of 20 ms with the scale at
// 1 or more lasts at least 20 ms, and a condition that holds after the
// unscaled budget but within the scaled one passes.
func TestBudgetIsScaled(t *testing.T) {
	start := time.Now()
	failed, _ := run(&fakeT{}, func(t testing.TB) { Until(t, "never", func() bool { return false }, Within(20*time.Millisecond)) })
	if !failed {
		t.Fatal("the wait did not fail")
	}
	if took, want := time.Since(start), time.Duration(float64(20*time.Millisecond)*Scale()); took < want*9/10 {
		t.Fatalf("the wait gave up after %v, before its scaled budget %v", took, want)
	}
}

// A wait never outlasts the test binary's deadline: it fails with its
// message deadlineMargin before.
func TestDeadlineOfTheBinaryCutsTheWaitShort(t *testing.T) {
	f := &fakeT{deadline: time.Now().Add(deadlineMargin + 50*time.Millisecond)}
	start := time.Now()
	failed, msg := run(f, func(t testing.TB) { Until(t, "never", func() bool { return false }, Within(time.Hour)) })
	if !failed || !strings.Contains(msg, "cut short by the test binary's -timeout") {
		t.Fatalf("failed %v with %q; want a failure naming the -timeout", failed, msg)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the wait took %v, past the binary's deadline", took)
	}
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	go func() { ch <- 7 }()
	if got := Recv(t, "seven", ch); got != 7 {
		t.Fatalf("Recv = %d, want 7", got)
	}
	failed, msg := run(&fakeT{}, func(t testing.TB) { Recv(t, "a value that never comes", make(chan int), Within(10*time.Millisecond)) })
	if !failed || !strings.Contains(msg, "waiting for a value that never comes") {
		t.Fatalf("failed %v with %q", failed, msg)
	}
}

func TestRoundsWait(t *testing.T) {
	r := NewRounds("test rounds")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				r.Tick()
			}
		}
	}()
	before := r.Count()
	r.Wait(t, 3)
	if got := r.Count() - before; got < 3 {
		t.Fatalf("Wait(3) returned after %d rounds", got)
	}
	idle := NewRounds("rounds that never come")
	failed, msg := run(&fakeT{}, func(t testing.TB) { idle.Wait(t, 1, Within(10*time.Millisecond)) })
	if !failed || !strings.Contains(msg, "rounds that never come") || !strings.Contains(msg, "counted 0") {
		t.Fatalf("failed %v with %q", failed, msg)
	}
}

// Never passes once the rounds came and the thing did not happen, and
// polls it after the last round; it fails at once when the thing happens,
// and when the rounds do not come.
func TestNever(t *testing.T) {
	r := NewRounds("loop rounds")
	var happened atomic.Bool
	var polls atomic.Int64
	tick := func(n int, then func()) {
		go func() {
			for range n {
				time.Sleep(time.Millisecond)
				r.Tick()
			}
			if then != nil {
				then()
			}
		}()
	}
	tick(3, nil)
	Never(t, "the thing", r, 3, func() bool { polls.Add(1); return happened.Load() })
	if polls.Load() < 2 {
		t.Fatalf("polled %d times", polls.Load())
	}

	// It happens during the second round: Never fails, saying so.
	r2 := NewRounds("loop rounds")
	go func() {
		time.Sleep(time.Millisecond)
		r2.Tick()
		happened.Store(true)
		r2.Tick()
	}()
	failed, msg := run(&fakeT{}, func(t testing.TB) {
		Never(t, "the thing", r2, 5, func() (bool, string) { return happened.Load(), "seen it" })
	})
	if !failed || !strings.Contains(msg, "the thing happened (seen it)") {
		t.Fatalf("failed %v with %q; want the thing reported as happened", failed, msg)
	}

	// The thing happens in the last round: the poll after it sees it.
	happened.Store(false)
	r3 := NewRounds("loop rounds")
	go func() {
		time.Sleep(time.Millisecond)
		r3.Tick()
		happened.Store(true)
		r3.Tick()
	}()
	failed, _ = run(&fakeT{}, func(t testing.TB) { Never(t, "the thing", r3, 2, happened.Load) })
	if !failed {
		t.Fatal("Never missed what happened during the last round")
	}

	// No rounds: it fails when the deadline passes.
	failed, msg = run(&fakeT{}, func(t testing.TB) {
		Never(t, "the thing", NewRounds("loop rounds"), 1, func() bool { return false }, Within(10*time.Millisecond))
	})
	if !failed || !strings.Contains(msg, "0 rounds of 1 came") {
		t.Fatalf("failed %v with %q", failed, msg)
	}
}

func TestParseScale(t *testing.T) {
	for raw, want := range map[string]float64{"": 1, " 2 ": 2, "0.5": 0.5, "1000": 1000} {
		if got, err := parseScale(raw); err != nil || got != want {
			t.Errorf("parseScale(%q) = %v, %v; want %v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"x", "0", "-1", "NaN", "1001", "Inf"} {
		if _, err := parseScale(raw); err == nil || !strings.Contains(err.Error(), ScaleEnv) {
			t.Errorf("parseScale(%q) = %v; want an error naming %s", raw, err, ScaleEnv)
		}
	}
}

func TestStretch(t *testing.T) {
	if got := Stretch(time.Second); got < time.Second {
		t.Fatalf("Stretch(1s) = %v: it never shortens", got)
	}
	// Stretched, a duration is whole milliseconds (it survives a round
	// trip through an INTERVAL); unstretched, it is d itself.
	d := 1700*time.Millisecond + 7
	if got := Stretch(d); got < d || (got != d && got%time.Millisecond != 0) {
		t.Fatalf("Stretch(%v) = %v: want %v itself or whole milliseconds above it", d, got, d)
	}
}
