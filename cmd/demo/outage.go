package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/crdbwork/crdbwork/internal/cli"
)

// Log sampling: per message and level, the first samplerFirst entries of
// each samplerTick are logged, then one in samplerThereafter. An outage
// makes every handler and loop warn about the same thing at once.
const (
	samplerTick       = 10 * time.Second
	samplerFirst      = 3
	samplerThereafter = 100
)

// newLogger returns a console logger on stderr at level, sampled (see
// samplerTick) and watched by the returned outageWatch.
func newLogger(level string, out *cli.Console) (*zap.Logger, *outageWatch, error) {
	lvl, err := zapcore.ParseLevel(strings.ToLower(level))
	if err != nil {
		return nil, nil, cli.Failf(2, "invalid --log-level %q: use debug, info, warn or error", level)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeLevel = zapcore.CapitalLevelEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(out.StderrWriter("")), lvl)
	w := &outageWatch{warned: make(chan time.Time, 1), out: out}
	// The sampler decides in Check, so it is the outer core; it writes
	// through shortErrors.
	sampled := zapcore.NewSamplerWithOptions(shortErrors{core}, samplerTick, samplerFirst, samplerThereafter,
		zapcore.SamplerHook(func(e zapcore.Entry, d zapcore.SamplingDecision) {
			if e.Level < zapcore.WarnLevel {
				return
			}
			w.warnings.Add(1)
			if d&zapcore.LogDropped != 0 {
				w.dropped.Add(1)
			}
			select {
			case w.warned <- e.Time:
			default:
			}
		}))
	log := zap.New(sampled)
	w.log = log
	return log, w, nil
}

// pinger is a pool.
type pinger interface {
	Ping(ctx context.Context) error
}

// outageWatch turns a burst of warnings into two lines a person can read:
// after a warning it pings the database; if the ping fails, it pings until
// one succeeds and then logs once that the database is reachable again,
// how long it was not, and how many warnings were not shown meanwhile.
type outageWatch struct {
	log      *zap.Logger
	out      *cli.Console
	warned   chan time.Time
	warnings atomic.Int64
	dropped  atomic.Int64
}

// run watches until ctx ends.
func (w *outageWatch) run(ctx context.Context, db pinger) {
	for {
		var first time.Time
		select {
		case <-ctx.Done():
			return
		case first = <-w.warned:
		}
		err := ping(ctx, db)
		if err == nil {
			continue // a warning, but the database answers
		}
		warningsBefore, droppedBefore := w.warnings.Load(), w.dropped.Load()
		w.out.Errorf("demo: the database is not answering (%s); warnings are rate-limited until it does", cli.OneLine(err.Error()))
		t := time.NewTicker(500 * time.Millisecond)
		for ping(ctx, db) != nil {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		t.Stop()
		// Drain a warning that came in while we waited.
		select {
		case <-w.warned:
		default:
		}
		w.out.Errorf("demo: database reachable again after %s (%d warnings meanwhile, %d of them not shown)",
			round(time.Since(first)).Round(100*time.Millisecond), w.warnings.Load()-warningsBefore+1, w.dropped.Load()-droppedBefore)
	}
}

func ping(ctx context.Context, db pinger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := db.Ping(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// maxErrorText bounds the error text of one log line: a connection error
// from pgx repeats the user, database, address and cause, and at 300
// characters a line of each kind fills two rows of a terminal.
const maxErrorText = 160

// shortErrors is a zapcore.Core that cuts the text of error fields to
// maxErrorText runes: the start says what failed, and during an outage the
// demo's own line gives the ping's whole error once.
type shortErrors struct{ zapcore.Core }

func (c shortErrors) With(fields []zapcore.Field) zapcore.Core {
	return shortErrors{c.Core.With(shortenErrors(fields))}
}

func (c shortErrors) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c shortErrors) Write(e zapcore.Entry, fields []zapcore.Field) error {
	return c.Core.Write(e, shortenErrors(fields))
}

// shortenErrors returns fields with long error texts cut.
func shortenErrors(fields []zapcore.Field) []zapcore.Field {
	var out []zapcore.Field
	for i, f := range fields {
		err, ok := f.Interface.(error)
		if f.Type != zapcore.ErrorType || !ok || err == nil || utf8.RuneCountInString(err.Error()) <= maxErrorText {
			continue
		}
		if out == nil {
			out = append([]zapcore.Field(nil), fields...)
		}
		out[i] = zap.String(f.Key, string([]rune(err.Error())[:maxErrorText-1])+"…")
	}
	if out == nil {
		return fields
	}
	return out
}
