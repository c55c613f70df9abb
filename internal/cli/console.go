package cli

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

// Console serializes writes to stdout and stderr and keeps the live
// progress line: rewritten in place with \r on a terminal, printed as plain
// lines (at most once a second) otherwise.
type Console struct {
	mu        sync.Mutex
	stdout    io.Writer
	stderr    io.Writer
	tty       bool
	statusLen int // length of the progress line now on screen (tty only)
	lastPlain time.Time
	drawn     bool // redraw has cleared the screen once
}

// NewConsole returns a Console writing to stdout and stderr; the progress
// line is drawn in place when stderr is a terminal.
func NewConsole(stdout, stderr io.Writer) *Console {
	return &Console{stdout: stdout, stderr: stderr, tty: IsTerminal(stderr)}
}

// IsTerminal reports whether w is a terminal (a character device).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// clearLocked removes the progress line from a terminal.
func (c *Console) clearLocked() {
	if c.tty && c.statusLen > 0 {
		fmt.Fprint(c.stderr, "\r\x1b[K")
		c.statusLen = 0
	}
}

// ErrorLine prints one line on stderr.
func (c *Console) ErrorLine(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintln(c.stderr, line)
}

// Errorf prints a formatted line on stderr.
func (c *Console) Errorf(format string, args ...any) {
	c.ErrorLine(fmt.Sprintf(format, args...))
}

// Printf writes to stdout.
func (c *Console) Printf(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	fmt.Fprintf(c.stdout, format, args...)
}

// WriteStdout writes raw bytes to stdout.
func (c *Console) WriteStdout(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
	c.stdout.Write(p)
}

// Progress shows line as the live progress line. force prints it even if a
// plain line was printed less than a second ago.
func (c *Console) Progress(line string, force bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tty {
		// One column short of the width: a line that fills the last column
		// wraps on some terminals, and each redraw would leave a row behind.
		line = Fit(line, Width(c.stderr)-1)
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

// EndProgress leaves the last progress line on screen and moves on.
func (c *Console) EndProgress() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tty && c.statusLen > 0 {
		fmt.Fprintln(c.stderr)
		c.statusLen = 0
	}
}

// StderrWriter returns a writer of whole lines to stderr that keeps the
// progress line intact; prefix is put before each line.
func (c *Console) StderrWriter(prefix string) io.Writer {
	return &lineWriter{c: c, prefix: prefix}
}

type lineWriter struct {
	mu     sync.Mutex
	c      *Console
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
		w.c.ErrorLine(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Width is the terminal's width in columns for w: its size, else $COLUMNS,
// else 80.
func Width(w io.Writer) int {
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

// Fit cuts line to n columns (runes), marking the cut with "…".
func Fit(line string, n int) string {
	if n <= 1 || utf8.RuneCountInString(line) <= n {
		return line
	}
	return string([]rune(line)[:n-1]) + "…"
}

// Redraw replaces the screen of a terminal stdout with text: the cursor
// goes home, each line is rewritten in place (cut to the terminal's width,
// so that nothing wraps) and cleared to its end, and what is left below
// the last line is cleared. No flicker, no scrolling.
func (c *Console) Redraw(text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	if !c.drawn {
		b.WriteString("\x1b[H\x1b[2J")
		c.drawn = true
	} else {
		b.WriteString("\x1b[H")
	}
	w := Width(c.stdout)
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		b.WriteString(Fit(l, w))
		b.WriteString("\x1b[K\r\n")
	}
	b.WriteString("\x1b[J")
	io.WriteString(c.stdout, b.String())
}

// Stdout returns the Console's standard output, for writers that print
// whole blocks themselves (usage texts, JSON).
func (c *Console) Stdout() io.Writer { return c.stdout }

// Stderr returns the Console's standard error.
func (c *Console) Stderr() io.Writer { return c.stderr }
