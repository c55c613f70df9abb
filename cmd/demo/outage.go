package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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
func newLogger(level string, out *console) (*zap.Logger, *outageWatch, error) {
	lvl, err := zapcore.ParseLevel(strings.ToLower(level))
	if err != nil {
		return nil, nil, failf(2, "invalid --log-level %q: use debug, info, warn or error", level)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeLevel = zapcore.CapitalLevelEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(out.stderrWriter("")), lvl)
	w := &outageWatch{warned: make(chan time.Time, 1), out: out}
	sampled := zapcore.NewSamplerWithOptions(core, samplerTick, samplerFirst, samplerThereafter,
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
	out      *console
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
		if ping(ctx, db) == nil {
			continue // a warning, but the database answers
		}
		warningsBefore, droppedBefore := w.warnings.Load(), w.dropped.Load()
		w.out.errorf("demo: the database is not answering; warnings about it are rate-limited until it does")
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
		w.out.errorf("demo: database reachable again after %s (%d warnings meanwhile, %d of them not shown)",
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
