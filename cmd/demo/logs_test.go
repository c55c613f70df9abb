package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/cli"
)

// TestProgressRate: the rate is over the last few seconds, so a stall shows
// as a stall (the issue: 1795 items/s shown during a 2 s stall).
func TestProgressRate(t *testing.T) {
	t.Parallel()
	r := &demoRun{}
	t0 := time.Unix(0, 0)
	for s := 1; s <= 10; s++ {
		r.rate(t0.Add(time.Duration(s)*time.Second), int64(s*1000), t0)
	}
	if got := r.rate(t0.Add(11*time.Second), 11000, t0); got < 999 || got > 1001 {
		t.Errorf("steady 1000 items/s: rate %v", got)
	}
	for s := 12; s <= 16; s++ {
		r.rate(t0.Add(time.Duration(s)*time.Second), 11000, t0)
	}
	if got := r.rate(t0.Add(17*time.Second), 11000, t0); got != 0 {
		t.Errorf("after a 6 s stall: rate %v, want 0", got)
	}
}

// TestLogErrorsCut: a log line's error text is cut to maxErrorText runes.
func TestLogErrorsCut(t *testing.T) {
	t.Parallel()
	var errb bytes.Buffer
	c := cli.NewConsole(&bytes.Buffer{}, &errb)
	log, _, err := newLogger("warn", c)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("failed to connect to `user=crdbwork database=x`: ", 10)
	log.Warn("claim failed", zap.Error(errors.New(long)), zap.String("queue", "demo"))
	log.Warn("short", zap.Error(errors.New("conn closed")))
	out := errb.String()
	if strings.Contains(out, long) || !strings.Contains(out, "…") || !strings.Contains(out, `"queue": "demo"`) {
		t.Errorf("the long error is not cut, or a field is lost:\n%s", out)
	}
	if !strings.Contains(out, `"error": "conn closed"`) {
		t.Errorf("a short error is changed:\n%s", out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if n := utf8.RuneCountInString(l); n > maxErrorText+120 {
			t.Errorf("a log line of %d runes: %s", n, l)
		}
	}
	// And they are still sampled: the first samplerFirst of a message.
	for range 10 {
		log.With(zap.String("worker", "w")).Warn("repeated", zap.Error(errors.New(long)))
	}
	if n := strings.Count(errb.String(), "repeated"); n != samplerFirst {
		t.Errorf("%d of 10 repeated warnings logged, want %d", n, samplerFirst)
	}
}
