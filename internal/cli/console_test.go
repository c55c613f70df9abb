package cli

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestProgressFitsWidth: on a terminal the progress line is rewritten in
// place and never longer than the width less one column (a full line wraps
// on some terminals and leaves a row behind at each redraw).
func TestProgressFitsWidth(t *testing.T) {
	t.Setenv("COLUMNS", "40")
	var errb bytes.Buffer
	c := &Console{stdout: &bytes.Buffer{}, stderr: &errb, tty: true}
	long := "demo: 123456/10000000 done, 1795 items/s over 5s, 12 live sessions, 3 killed, 1m2s"
	c.Progress(long, false)
	c.Progress("short", false)
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
	c := &Console{stdout: &out, stderr: &bytes.Buffer{}}
	c.Redraw("first line that is much too long\nsecond\n")
	c.Redraw("again\n")
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
