package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
)

// TestProgressFitsWidth: on a terminal the progress line is rewritten in
// place and never longer than the width less one column (a full line wraps
// on some terminals and leaves a row behind at each redraw).
func TestProgressFitsWidth(t *testing.T) {
	t.Setenv("COLUMNS", "40")
	var errb bytes.Buffer
	c := &console{stdout: &bytes.Buffer{}, stderr: &errb, tty: true}
	long := "demo: 123456/10000000 done, 1795 items/s over 5s, 12 live sessions, 3 killed, 1m2s"
	c.progress(long, false)
	c.progress("short", false)
	out := errb.String()
	for _, draw := range strings.Split(out, "\r")[1:] {
		line := strings.TrimSuffix(draw, "\x1b[K")
		if n := utf8.RuneCountInString(line); n > 39 {
			t.Errorf("a progress line of %d columns on a 40-column terminal: %q", n, line)
		}
	}
	if !strings.Contains(out, "\rshort\x1b[K") {
		t.Errorf("the short line does not clear what is left of the long one: %q", out)
	}
	if strings.Contains(out, "\n") {
		t.Errorf("progress on a terminal wrote a newline: %q", out)
	}
}

// TestRedrawFits: status --watch's redraw goes home, cuts lines to the
// width, clears each line's end and what is below.
func TestRedrawFits(t *testing.T) {
	t.Setenv("COLUMNS", "20")
	var out bytes.Buffer
	c := &console{stdout: &out, stderr: &bytes.Buffer{}}
	c.redraw("first line that is much too long\nsecond\n")
	c.redraw("again\n")
	s := out.String()
	if !strings.HasPrefix(s, "\x1b[H\x1b[2J") {
		t.Errorf("the first redraw does not clear the screen: %q", s)
	}
	if !strings.Contains(s, "first line that is …\x1b[K\r\n") {
		t.Errorf("a long line is not cut to 20 columns: %q", s)
	}
	if !strings.HasSuffix(s, "\x1b[Hagain\x1b[K\r\n\x1b[J") {
		t.Errorf("the second redraw does not go home and clear below: %q", s)
	}
}

// TestProgressRate: the rate is over the last few seconds, so a stall shows
// as a stall (the issue: 1795 items/s shown during a 2 s stall).
func TestProgressRate(t *testing.T) {
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
	var errb bytes.Buffer
	c := &console{stdout: &bytes.Buffer{}, stderr: &errb}
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
