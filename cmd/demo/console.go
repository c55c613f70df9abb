package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// console serializes writes to stdout and stderr and keeps the live
// progress line: rewritten in place with \r on a terminal, printed as plain
// lines (at most once a second) otherwise.
type console struct {
	mu        sync.Mutex
	stdout    io.Writer
	stderr    io.Writer
	tty       bool
	statusLen int // length of the progress line now on screen (tty only)
	lastPlain time.Time
	drawn     bool // redraw has cleared the screen once
}

func newConsole(stdout, stderr io.Writer) *console {
	return &console{stdout: stdout, stderr: stderr, tty: isTerminal(stderr)}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// clearLocked removes the progress line from a terminal.
func (c *console) clearLocked() {
	if c.tty && c.statusLen > 0 {
		fmt.Fprint(c.stderr, "\r\x1b[K")
		c.statusLen = 0
	}
}

// errorLine prints one line on stderr.
func (c *console) errorLine(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintln(c.stderr, line)
}

// errorf prints a formatted line on stderr.
func (c *console) errorf(format string, args ...any) {
	c.errorLine(fmt.Sprintf(format, args...))
}

// printf writes to stdout.
func (c *console) printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintf(c.stdout, format, args...)
}

// writeStdout writes raw bytes to stdout.
func (c *console) writeStdout(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	c.stdout.Write(p)
}

// progress shows line as the live progress line. force prints it even if a
// plain line was printed less than a second ago.
func (c *console) progress(line string, force bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tty {
		// One column short of the width: a line that fills the last column
		// wraps on some terminals, and each redraw would leave a row behind.
		line = fit(line, width(c.stderr)-1)
		fmt.Fprintf(c.stderr, "\r%s\x1b[K", line)
		c.statusLen = utf8.RuneCountInString(line)
		return
	}
	if !force && time.Since(c.lastPlain) < time.Second {
		return
	}
	c.lastPlain = time.Now()
	fmt.Fprintln(c.stderr, line)
}

// endProgress leaves the last progress line on screen and moves on.
func (c *console) endProgress() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tty && c.statusLen > 0 {
		fmt.Fprintln(c.stderr)
		c.statusLen = 0
	}
}

// stderrWriter returns a writer of whole lines to stderr that keeps the
// progress line intact; prefix is put before each line.
func (c *console) stderrWriter(prefix string) io.Writer {
	return &lineWriter{c: c, prefix: prefix}
}

type lineWriter struct {
	mu     sync.Mutex
	c      *console
	prefix string
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.c.errorLine(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// width is the terminal's width in columns for w: its size, else $COLUMNS,
// else 80.
func width(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if n := terminalWidth(f); n > 0 {
			return n
		}
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 80
}

// fit cuts line to n columns (runes), marking the cut with "…".
func fit(line string, n int) string {
	if n <= 1 || utf8.RuneCountInString(line) <= n {
		return line
	}
	return string([]rune(line)[:n-1]) + "…"
}

// redraw replaces the screen of a terminal stdout with text: the cursor
// goes home, each line is rewritten in place (cut to the terminal's width,
// so that nothing wraps) and cleared to its end, and what is left below
// the last line is cleared. No flicker, no scrolling.
func (c *console) redraw(text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	if !c.drawn {
		b.WriteString("\x1b[H\x1b[2J")
		c.drawn = true
	} else {
		b.WriteString("\x1b[H")
	}
	w := width(c.stdout)
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		b.WriteString(fit(l, w))
		b.WriteString("\x1b[K\r\n")
	}
	b.WriteString("\x1b[J")
	io.WriteString(c.stdout, b.String())
}
