package wake

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testhook"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Timings of the listener.
const (
	// connectTimeout bounds one connection attempt and its set-up.
	connectTimeout = 10 * time.Second
	// checkEvery is how often an idle listener checks its connection (a
	// LISTEN again, one round trip), so that a connection that died
	// silently (a network cut without a reset) is replaced within
	// checkEvery + checkTimeout rather than when TCP gives up.
	checkEvery = 10 * time.Second
	// checkTimeout bounds a check, or a change of the channels listened on.
	checkTimeout = 5 * time.Second
	// minBackoff and maxBackoff bound the wait before reconnecting; it
	// doubles after each failure in a row, with jitter.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// errNoListen is returned by a listener's session on CockroachDB, which has
// no LISTEN: the listener stops for good.
var errNoListen = errors.New("the server is CockroachDB, which has no LISTEN")

// listeners are the process's listeners, one per database (by connection
// settings).
var listeners struct {
	mu sync.Mutex
	m  map[string]*listener
}

// listening counts, per channel, the listeners whose connection is up and
// listens on it (Listening).
var listening struct {
	mu sync.Mutex
	n  map[string]int
}

// Listening reports whether a listener of this process listens on channel
// now: its connection is up, and its LISTEN on channel succeeded. A
// notification that an enqueue sends on channel then reaches this
// process, so its idle workers need not poll for enqueued items (package
// worker's Options.ListenPoll). When that stops (the connection failed or
// was found silent, or the channel is no longer listened on), the channel
// is signalled once, so that workers waiting on the listener claim at once
// and go back to their poll; a silent connection is found within the
// listener's check (every 10 s, at most 5 s each).
func Listening(channel string) bool {
	listening.mu.Lock()
	defer listening.mu.Unlock()
	return listening.n[channel] > 0
}

// setListening records that a listener starts (on) or stops listening on
// channel; a stop signals the channel (see Listening).
func setListening(channel string, on bool) {
	listening.mu.Lock()
	if listening.n == nil {
		listening.n = make(map[string]int)
	}
	if on {
		listening.n[channel]++
	} else if listening.n[channel]--; listening.n[channel] <= 0 {
		delete(listening.n, channel)
	}
	listening.mu.Unlock()
	if !on {
		Signal(channel)
	}
}

// listener listens, on one connection of its own, on the channels its
// users asked for, and signals the hub of each notification.
type listener struct {
	key   string
	cfg   *pgx.ConnConfig
	store *store.Store
	log   *zap.Logger

	mu       sync.Mutex
	channels map[string]int // channel → users
	users    int
	changed  chan struct{} // signalled (without blocking) when channels change
	cancel   context.CancelFunc
}

// Listen makes the process's listener of the database db connects to
// listen on channel (see store.Store.NotifyChannel), starting the listener on
// a connection of its own if it is not running, until stop is called; the
// last stop of a database's listener closes its connection. Notifications
// on channel then Signal it. db must give its connection settings (a
// *pgxpool.Pool or a *pgx.Conn); for any other, Listen does nothing and
// ok is false. On CockroachDB the listener finds that the server has no
// LISTEN, logs it once at Info level and stops: only in-process signals
// wake.
//
// The listener never stalls its users: when its connection fails or stops
// answering (a check every 10 s), it reconnects with backoff (100 ms
// doubling to 10 s, with jitter), meanwhile nothing signals, and workers
// claim at their poll interval. After each (re)connection it signals every
// channel once, for the notifications sent while none was listening.
func Listen(db any, channel string, log *zap.Logger) (stop func(), ok bool) {
	cfg := connConfig(db)
	if cfg == nil {
		return func() {}, false
	}
	if log == nil {
		log = zap.NewNop()
	}
	key := dbKey(cfg)
	listeners.mu.Lock()
	if listeners.m == nil {
		listeners.m = make(map[string]*listener)
	}
	l := listeners.m[key]
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &listener{key: key, cfg: cfg, store: store.New(crsql.Tables{}), log: log.Named("wake"),
			channels: make(map[string]int), changed: make(chan struct{}, 1), cancel: cancel}
		listeners.m[key] = l
		go l.run(ctx)
	}
	l.mu.Lock()
	l.users++
	l.channels[channel]++
	l.mu.Unlock()
	l.signalChanged()
	listeners.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { l.release(channel) }) }, true
}

// connConfig returns the connection settings of db, or nil.
func connConfig(db any) *pgx.ConnConfig {
	switch d := db.(type) {
	case interface{ Config() *pgxpool.Config }:
		return d.Config().ConnConfig // a copy
	case interface{ Config() *pgx.ConnConfig }:
		return d.Config().Copy()
	}
	return nil
}

// release drops one user of channel; the last user stops the listener.
func (l *listener) release(channel string) {
	listeners.mu.Lock()
	defer listeners.mu.Unlock()
	l.mu.Lock()
	l.users--
	if l.channels[channel]--; l.channels[channel] <= 0 {
		delete(l.channels, channel)
	}
	last := l.users == 0
	l.mu.Unlock()
	if last {
		delete(listeners.m, l.key)
		l.cancel()
		return
	}
	l.signalChanged()
}

func (l *listener) signalChanged() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// wanted returns the channels to listen on.
func (l *listener) wanted() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := make(map[string]bool, len(l.channels))
	for ch := range l.channels {
		w[ch] = true
	}
	return w
}

// run listens until ctx ends, reconnecting with backoff.
func (l *listener) run(ctx context.Context) {
	backoff := minBackoff
	for {
		connected, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoListen) {
			l.log.Info("no wake-up notifications on CockroachDB: the idle probe (unless turned off) and enqueues in this process wake idle workers, and they poll")
			return
		}
		if connected {
			backoff = minBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		l.log.Warn("the wake-up listener's connection failed: idle workers poll until it is back", zap.Duration("reconnect_in", wait), zap.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session runs one connection until it fails or ctx ends; connected
// reports whether it got as far as listening.
func (l *listener) session(ctx context.Context) (connected bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, dialect, closeConn, err := connectDetect(cctx, l.cfg, "the listener")
	if err != nil {
		return false, err
	}
	defer closeConn()
	if _, known := dialects.Swap(l.key, dialect); !known && dialect == store.Cockroach {
		kickProbers() // they may probe now (see Probe)
	}
	if dialect == store.Cockroach {
		return false, errNoListen
	}
	listening := make(map[string]bool)
	// Whatever ends this connection, its channels are no longer listened
	// on: their workers go back to their poll (see Listening).
	defer func() {
		for ch := range listening {
			setListening(ch, false)
		}
	}()
	// Every channel is new on a new connection: sync signals each once,
	// for what was committed while none listened.
	if err := l.sync(cctx, conn, listening, false); err != nil {
		return false, err
	}
	cancel()
	for {
		wctx, cancelWait := context.WithTimeout(ctx, checkEvery)
		stopWatch, changed := make(chan struct{}), make(chan bool, 1)
		go func() {
			select {
			case <-l.changed:
				cancelWait()
				changed <- true
			case <-stopWatch:
				changed <- false
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		close(stopWatch)
		change := <-changed
		cancelWait()
		switch {
		case err == nil:
			SignalHashes(n.Channel, ParsePayload(n.Payload))
			if !change {
				continue
			}
		case ctx.Err() != nil:
			return true, ctx.Err()
		case conn.IsClosed():
			return true, fmt.Errorf("wake: listener: %w", err)
		}
		// The channels changed, or it is time to check the connection.
		sctx, cancelSync := context.WithTimeout(ctx, checkTimeout)
		err = l.sync(sctx, conn, listening, !change)
		cancelSync()
		if err != nil {
			return true, err
		}
	}
}

// sync makes conn listen on the wanted channels and on no other, and
// signals each channel it starts listening on (an enqueue may have
// committed before). With check and no change, it runs one LISTEN again
// (or a ping, without channels) to check that the connection answers.
func (l *listener) sync(ctx context.Context, conn *pgx.Conn, listening map[string]bool, check bool) error {
	want := l.wanted()
	sent := false
	for ch := range want {
		if listening[ch] {
			continue
		}
		if err := l.store.NotifyListen(ctx, conn, ch); err != nil {
			return fmt.Errorf("wake: listening on %s: %w", ch, err)
		}
		listening[ch], sent = true, true
		setListening(ch, true)
		Signal(ch)
	}
	for ch := range listening {
		if want[ch] {
			continue
		}
		if err := l.store.NotifyUnlisten(ctx, conn, ch); err != nil {
			return fmt.Errorf("wake: unlistening %s: %w", ch, err)
		}
		delete(listening, ch)
		setListening(ch, false)
		sent = true
	}
	if !check || sent {
		return nil
	}
	for ch := range listening {
		if err := l.store.NotifyListen(ctx, conn, ch); err != nil {
			return fmt.Errorf("wake: checking the listener's connection: %w", err)
		}
		return nil
	}
	if err := conn.Ping(ctx); err != nil {
		return fmt.Errorf("wake: checking the listener's connection: %w", err)
	}
	return nil
}

// connectDetect opens a connection of its own for what (the listener, the
// idle probe) and finds its server's engine; closeConn closes it.
func connectDetect(ctx context.Context, cfg *pgx.ConnConfig, what string) (conn *pgx.Conn, dialect store.Dialect, closeConn func(), err error) {
	conn, err = pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, 0, nil, fmt.Errorf("wake: connecting %s: %w", what, err)
	}
	closeConn = func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
	}
	if dialect, err = store.DetectDialect(ctx, conn); err != nil {
		closeConn()
		return nil, 0, nil, fmt.Errorf("wake: %s: %w", what, err)
	}
	if testhook.NoListen() {
		// The test harness's CockroachDB fault mode: no LISTEN, the idle
		// probe instead (its statement is the same on both engines).
		dialect = store.Cockroach
	}
	return conn, dialect, closeConn, nil
}
