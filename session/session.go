// Package session gives a worker process its session: one row in the
// sessions table that the process heartbeats, and that any peer deletes once
// its heartbeat is older than its expiry. Everything a process holds (claimed
// items, owned parts) hangs off that row through foreign keys, so deleting
// the row releases all of it, in the database.
//
// A session also watches itself: when a heartbeat finds the row gone, or no
// heartbeat has succeeded for the expiry, the session is lost. Its Context
// is cancelled and Err says why, so that in-flight work stops and the process
// can start a new session.
//
// Every time that decides liveness comes from the database clock (now()).
package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults for Options.
const (
	DefaultHeartbeat = time.Second
	DefaultExpiry    = 5 * time.Second
	// DefaultClockMargin is the ClockMargin of a session whose Options leave
	// it zero, unless a quarter of the expiry is less: then a quarter of the
	// expiry. It is CockroachDB's default maximum clock offset between nodes.
	DefaultClockMargin = 500 * time.Millisecond
)

// Bounds of Options, far above any useful value: they keep the arithmetic
// on durations from overflowing.
const (
	MaxHeartbeat = time.Hour
	MaxExpiry    = 24 * time.Hour
)

// startConnectTimeout is how long Start waits at least for the heartbeat's
// connection to open (longer if the expiry is): a connect given up on has
// cost a saturated server as much as one that succeeds, and the next
// attempt starts from scratch.
const startConnectTimeout = 30 * time.Second

// MinExpiryFactor is how many heartbeat intervals the expiry must span at
// least, so that one slow heartbeat does not lose the session.
const MinExpiryFactor = 3

var (
	// ErrLost is wrapped by Err when the session was lost: its row was
	// deleted (by a peer's reaper or by hand), or it could not heartbeat for
	// longer than its expiry.
	ErrLost = errors.New("session lost")
	// ErrClosed is wrapped by Err after Close.
	ErrClosed = errors.New("session closed")
)

// Tuning holds a session's timing: its heartbeat, its expiry, and how often
// and how long it reaps. It is the part of a session's options a worker takes
// (worker.Options.Session); Options embeds it. The zero value is valid: 1 s
// heartbeat, 5 s expiry, 500 ms clock margin, reaping every two heartbeats.
type Tuning struct {
	// Heartbeat is the interval between heartbeats. Default 1 s, at most
	// MaxHeartbeat.
	Heartbeat time.Duration
	// Expiry is how long after its last heartbeat a session may be deleted
	// by a peer. It must be at least MinExpiryFactor heartbeats, and at most
	// MaxExpiry. Default 5 s (or MinExpiryFactor heartbeats, if more).
	//
	// A process frozen while one of its transactions is open keeps that
	// transaction's locks until the server ends it, and its peers cannot
	// delete its session meanwhile: configure the pool with ConfigurePool
	// (idle_in_transaction_session_timeout = Expiry) so that the server
	// ends it after the expiry; the session is then reaped within twice
	// the expiry and a reap interval of the freeze.
	Expiry time.Duration
	// ClockMargin is how much earlier than its expiry the process considers
	// its session lost when heartbeats fail: lost at lastSent + Expiry -
	// ClockMargin, where lastSent is when the last successful heartbeat was
	// sent. Peers compare the heartbeat with their own node's now(), which
	// on a CockroachDB cluster may lead this node's by up to the cluster's
	// maximum clock offset (500 ms by default); the margin keeps the
	// process from working on while a peer already counts it expired.
	// PostgreSQL has one clock and would need none, but the margin only
	// shortens the time a process keeps working through failed heartbeats,
	// so the same default applies everywhere. Default DefaultClockMargin or
	// a quarter of the expiry, whichever is less; negative: none. At least
	// two heartbeats must fit in Expiry - ClockMargin.
	ClockMargin time.Duration
	// ReapEvery is the interval between deletions of expired sessions.
	// Default: two heartbeats. Negative: the session never reaps (its
	// owner calls Reap itself, as package worker does: its workers reap
	// by turns, about once per ReapEvery for the whole fleet; see
	// ReapTurns).
	ReapEvery time.Duration
	// ReapTimeout bounds each deletion of expired sessions by the session's
	// reaper (and by package worker's): one that has not finished by then
	// gives up, logs a warning and is tried again at the next turn (see
	// ReapWithin and ErrReapTimeout). Default: the heartbeat interval, at
	// least MinReapTimeout.
	ReapTimeout time.Duration
}

// Options configure a session. The zero value is valid: 1 s heartbeat,
// 5 s expiry, 500 ms clock margin, default table names, no logging.
type Options struct {
	// Tuning is the session's timing (Heartbeat, Expiry, ClockMargin,
	// ReapEvery, ReapTimeout), promoted: o.Heartbeat is o.Tuning.Heartbeat.
	Tuning
	// Name is stored in the session row for operators (for example "demo-worker-3").
	Name string
	// Tables names the crdbwork tables.
	Tables crsql.Tables
	// Logger receives the session's logs. Default: none.
	Logger *zap.Logger
	// Connect opens the connection the heartbeat uses (see Start). Default:
	// when the database given to Start is a *pgxpool.Pool, a connection
	// with the pool's connection config; otherwise none, and heartbeats go
	// through that database.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Report, if not nil, is called before each heartbeat, and the counters
	// it returns are written into the session row with the heartbeat (one
	// statement, so reporting costs nothing extra): operators read them
	// (crdbwork status --watch derives throughput from them). It must be quick
	// and safe to call from the heartbeat goroutine.
	Report func() Counters
	// Testing holds hooks for tests; not for production.
	Testing TestingOptions
}

// TestingOptions are hooks into a session's loops, for tests that wait for
// a loop's rounds instead of sleeping (package internal/await's Rounds);
// not for production: they may change in any release. The zero value sets
// none, and a hook left nil costs nothing. Hooks run on the loop's
// goroutine, which waits for them: keep them quick.
type TestingOptions struct {
	// AfterHeartbeat, if not nil, is called after each heartbeat: with
	// alive true when it updated the session's row, alive false and a nil
	// error when it found the row gone (the session is then lost), or the
	// heartbeat's error. It is not called once the session ended.
	AfterHeartbeat func(alive bool, err error)
	// BeforeHeartbeat, if not nil, is called before each heartbeat (and
	// before the connection it needs, if it must open one): with
	// AfterHeartbeat, it times the heartbeats' round trips.
	BeforeHeartbeat func()
	// AfterReap, if not nil, is called after each deletion of expired
	// sessions by the session's own reaper (not with ReapEvery negative),
	// with how many it deleted and its error.
	AfterReap func(n int64, err error)
}

// Counters are what a session's process reports with its heartbeats: the
// items it claimed, acked and failed (nacked, dead-lettered or given up)
// since the session started, and the handlers running now.
type Counters struct {
	Claimed, Acked, Failed, InFlight int64
}

// withDefaults returns o with zero fields set to their defaults, or an error
// for values that cannot work.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Heartbeat < 0 || o.Expiry < 0:
		return o, fmt.Errorf("session: negative heartbeat %v or expiry %v", o.Heartbeat, o.Expiry)
	case o.Heartbeat > MaxHeartbeat:
		return o, fmt.Errorf("session: heartbeat %v is too long (maximum %v)", o.Heartbeat, MaxHeartbeat)
	case o.Expiry > MaxExpiry:
		return o, fmt.Errorf("session: expiry %v is too long (maximum %v)", o.Expiry, MaxExpiry)
	case o.ClockMargin > MaxExpiry:
		return o, fmt.Errorf("session: clock margin %v is too long (maximum %v)", o.ClockMargin, MaxExpiry)
	case o.ReapEvery > MaxExpiry:
		return o, fmt.Errorf("session: reap interval %v is too long (maximum %v)", o.ReapEvery, MaxExpiry)
	case o.ReapTimeout < 0 || o.ReapTimeout > MaxExpiry:
		return o, fmt.Errorf("session: reap timeout %v is negative or too long (maximum %v)", o.ReapTimeout, MaxExpiry)
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.Expiry == 0 {
		o.Expiry = max(DefaultExpiry, MinExpiryFactor*o.Heartbeat)
	}
	if o.ReapEvery == 0 {
		o.ReapEvery = 2 * o.Heartbeat
	}
	if o.ReapTimeout == 0 {
		o.ReapTimeout = max(o.Heartbeat, MinReapTimeout)
	}
	switch {
	case o.ClockMargin == 0:
		o.ClockMargin = min(DefaultClockMargin, o.Expiry/4)
	case o.ClockMargin < 0:
		o.ClockMargin = 0
	}
	switch {
	case o.Heartbeat < time.Millisecond:
		return o, fmt.Errorf("session: heartbeat %v is too short (minimum 1ms)", o.Heartbeat)
	case o.Expiry < MinExpiryFactor*o.Heartbeat:
		return o, fmt.Errorf("session: expiry %v must be at least %d heartbeats (%v); raise the expiry or shorten the heartbeat",
			o.Expiry, MinExpiryFactor, MinExpiryFactor*o.Heartbeat)
	case o.Expiry-o.ClockMargin < 2*o.Heartbeat:
		return o, fmt.Errorf("session: clock margin %v leaves less than two heartbeats (%v) of the expiry %v; lower the margin or raise the expiry",
			o.ClockMargin, 2*o.Heartbeat, o.Expiry)
	}
	if err := o.Tables.Validate(); err != nil {
		return o, fmt.Errorf("session: %w", err)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o, nil
}

// Session is one live worker process's row in the sessions table.
type Session struct {
	id     uuid.UUID
	db     crsql.DB
	store  *store.Store
	opts   Options
	log    *zap.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc
	// unregister removes the session's hold on the context given to
	// Start (idempotent); Close calls it at once, a lost session through
	// an AfterFunc of its own context.
	unregister func() bool
	loops      sync.WaitGroup
	// connect opens the heartbeat's own connection; nil: heartbeat through db.
	connect func(ctx context.Context) (*pgx.Conn, error)

	closeOnce sync.Once
	closeErr  error

	// changes are the channels of Changes; mark is the change marker of
	// the last heartbeat (marked: one was read).
	changesMu sync.Mutex
	changes   []chan struct{}
	mark      int64
	marked    bool
	// reapTurns are the channels of ReapTurns, each with its interval.
	reapTurns []reapTurn
	// beatSent is when the last successful heartbeat was sent (zero:
	// none yet).
	beatSent time.Time
}

// LastBeat returns when the session's last successful heartbeat was sent,
// by this process's clock (false: none succeeded yet). What that heartbeat
// read (the change marker of Changes) is at least that recent.
func (s *Session) LastBeat() (time.Time, bool) {
	s.changesMu.Lock()
	defer s.changesMu.Unlock()
	return s.beatSent, !s.beatSent.IsZero()
}

// reapTurn is one channel of ReapTurns.
type reapTurn struct {
	every time.Duration
	c     chan struct{}
}

// Changes returns a new channel that receives a value (without blocking:
// one is kept while pending) after each heartbeat that found the change
// marker of the session's queues moved: a queue the session joined (Join)
// recorded a change of its members, part owners or number of parts since
// the heartbeat before (a session joined, left, was closed or reaped, a
// part was acquired or released, or partition.SetParts ran). Package
// partition's rebalancer reads a queue's members and owners only then
// (and on a slow safety interval); package worker's claim loop claims
// then (a deleted session's claims were released). Code of schema
// versions 3 to 5 records no changes.
func (s *Session) Changes() <-chan struct{} {
	c := make(chan struct{}, 1)
	s.changesMu.Lock()
	s.changes = append(s.changes, c)
	s.changesMu.Unlock()
	return c
}

// ReapTurns returns a new channel that receives a value (without blocking:
// one is kept while pending) after each heartbeat that found the last reap
// of expired sessions at least every old, by the database clock, or none
// recorded: the reaps of version-6 code record themselves (the turn called
// "" in the reaps table, which package worker takes before it reaps), so
// that a fleet reaps expired sessions about once per interval rather than
// once per session and interval, and any session reaps when the reaper
// before it died. A session whose heartbeats fail receives nothing, nor
// does one whose heartbeat found no other session in the database: no
// session can be expired then. A session alone in its database thus runs
// no reap at all; one that starts later is seen at the next heartbeat,
// and the turns go on as before, within the same bound.
func (s *Session) ReapTurns(every time.Duration) <-chan struct{} {
	c := make(chan struct{}, 1)
	s.changesMu.Lock()
	s.reapTurns = append(s.reapTurns, reapTurn{every: every, c: c})
	s.changesMu.Unlock()
	return c
}

// noteBeat records what a heartbeat read. It signals Changes when the
// change marker moved, and at the first heartbeat that read one: what
// changed between the session's start and that heartbeat (a peer that
// joined after this session's rebalancer first read the members, say) is
// in the first marker, and would otherwise never count as a move. It
// signals each channel of ReapTurns whose interval the last reap of
// expired sessions is as old as, unless the session was alone.
func (s *Session) noteBeat(sent time.Time, beat store.Beat) {
	s.changesMu.Lock()
	s.beatSent = sent
	moved := !s.marked || beat.Mark != s.mark
	s.mark, s.marked = beat.Mark, true
	var cs []chan struct{}
	if moved {
		cs = append(cs, s.changes...)
	}
	for _, t := range s.reapTurns {
		if beat.Alone {
			break // no other session: none to reap
		}
		if !beat.SessionsReaped || beat.SessionsReapAge >= t.every {
			cs = append(cs, t.c)
		}
	}
	s.changesMu.Unlock()
	for _, c := range cs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Start creates a session row and starts its heartbeat and reaper loops.
// It first checks the schema version (one query): an error wrapping
// crsql.ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaNewer means the
// database's schema is not this code's.
//
// The loops run until Close, until the session is lost, or until ctx is
// cancelled. Cancelling ctx loses the session: it stops heartbeating without
// deleting the row, exactly as if the process had died, and peers delete the
// row after the expiry. Call Close for a graceful stop that releases
// everything at once. Nothing of the session stays registered on ctx once
// the session is lost or closed, so a long-lived ctx may serve any number of
// sessions.
//
// The heartbeat has a connection of its own (see Options.Connect), opened
// by Start before it creates the row (within 30 s or the expiry, whichever
// is longer, and ctx), and opened again
// after any failure with whatever is left of the expiry. Heartbeats
// therefore never queue behind the work of a busy pool — a pool whose
// connections are all busy acking would otherwise delay the heartbeat past
// the expiry and lose a session that is working fine — and a pool sized for
// the process's own work needs no slot for them; nor does the time a
// connection takes to open count against the session: on a server whose
// CPU is saturated that takes seconds (each new backend is a process that
// waits in a long run queue), and a session that opened it on its first
// heartbeat was lost before its first heartbeat. The row is created, the
// reaper runs and Close deletes the row through db.
func Start(ctx context.Context, db crsql.DB, opts Options) (*Session, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	st := store.New(opts.Tables)
	if err := crsql.Check(ctx, db, opts.Tables); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	connect := opts.Connect
	if connect == nil {
		if pool, ok := db.(*pgxpool.Pool); ok {
			cfg := pool.Config().ConnConfig
			connect = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg.Copy()) }
		}
	}
	// The heartbeat's connection is opened before the row exists, so that
	// the time a connection takes to open — seconds on a server whose CPU
	// is saturated, which forks each new backend behind a long run queue —
	// is not taken from the session's expiry: the first heartbeat then
	// only has its statement to run.
	var conn *pgx.Conn
	if connect != nil {
		cctx, cancel := context.WithTimeout(ctx, max(opts.Expiry, startConnectTimeout))
		conn, err = connect(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("session: opening the heartbeat's connection: %w", store.Classify(err))
		}
	}
	host, _ := os.Hostname()
	var id uuid.UUID
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		id, err = st.SessionsCreate(ctx, db, opts.Expiry, host, os.Getpid(), opts.Name)
		return err
	})
	if err != nil {
		if conn != nil {
			closeConn(conn, opts.Heartbeat)
		}
		return nil, fmt.Errorf("session: creating session row: %w", store.Classify(err))
	}
	s := &Session{id: id, db: db, store: st, opts: opts, log: opts.Logger.With(zap.Stringer("session", id)), connect: connect}
	s.ctx, s.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	s.unregister = context.AfterFunc(ctx, func() { s.lose(fmt.Errorf("the context given to Start ended: %w", ctx.Err())) })
	// Once the session ends, for whatever reason, ctx need not hold on to it.
	context.AfterFunc(s.ctx, func() { s.unregister() })
	// The loops run on the session's own context: a lost or closed session
	// stops heartbeating and reaping.
	s.loops.Add(2)
	go s.heartbeatLoop(s.ctx, conn)
	go s.reapLoop(s.ctx)
	s.log.Debug("session started", zap.Duration("heartbeat", opts.Heartbeat), zap.Duration("expiry", opts.Expiry),
		zap.Duration("clock_margin", opts.ClockMargin))
	return s, nil
}

// ID returns the session's id, the value written into claims.
func (s *Session) ID() uuid.UUID { return s.id }

// Context returns a context that is cancelled when the session is lost or
// closed. Work done on behalf of the session should use it.
func (s *Session) Context() context.Context { return s.ctx }

// Done returns a channel closed when the session is lost or closed.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the session is live, an error wrapping ErrLost when
// it was lost, or one wrapping ErrClosed after Close.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Options returns the options in force, defaults filled in.
func (s *Session) Options() Options { return s.opts }

func (s *Session) lose(reason error) {
	if s.ctx.Err() != nil {
		return
	}
	s.log.Warn("session lost", zap.Error(reason))
	s.cancel(fmt.Errorf("%w: %w", ErrLost, reason))
}

// closeConn closes a heartbeat connection, waiting at most d for the
// server to hear of it.
func closeConn(conn *pgx.Conn, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	conn.Close(ctx)
	cancel()
}

// heartbeatLoop heartbeats on conn, the connection Start opened (nil: none,
// heartbeats go through s.db), until the session ends.
func (s *Session) heartbeatLoop(ctx context.Context, conn *pgx.Conn) {
	defer s.loops.Done()
	defer func() {
		if conn != nil {
			closeConn(conn, s.opts.Heartbeat)
		}
	}()
	// lastSent is when the last successful heartbeat was sent, by this
	// process's monotonic clock. The database stamped the row with its own
	// now(), no earlier than that, so the row cannot expire before
	// lastSent + expiry by that node's clock; other nodes' clocks may lead
	// by the clock margin, so the session counts itself lost that much
	// earlier.
	lastSent := time.Now()
	budget := s.opts.Expiry - s.opts.ClockMargin
	tick := time.NewTicker(s.opts.Heartbeat)
	defer tick.Stop()
	deadline := time.NewTimer(budget)
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			s.lose(fmt.Errorf("no heartbeat succeeded for %v (the expiry %v less the clock margin %v)", budget, s.opts.Expiry, s.opts.ClockMargin))
			return
		case <-tick.C:
		}
		if h := s.opts.Testing.BeforeHeartbeat; h != nil {
			h()
		}
		sent := time.Now()
		var alive bool
		var err error
		if s.connect != nil && conn == nil {
			// A connection that failed is opened again with the rest of
			// the budget: on a saturated server opening one takes long,
			// and one given up on has cost the server as much as one
			// that succeeds.
			cctx, cancel := context.WithTimeout(ctx, max(time.Millisecond, budget-time.Since(lastSent)))
			if conn, err = s.connect(cctx); err != nil {
				conn = nil
				err = fmt.Errorf("connecting: %w", err)
			}
			cancel()
		}
		// One heartbeat's statement may take up to two intervals, but never
		// past the deadline; one that times out is tried again on a fresh
		// connection.
		hbCtx, cancel := context.WithTimeout(ctx, max(time.Millisecond, min(2*s.opts.Heartbeat, budget-time.Since(lastSent))))
		if err == nil {
			var db crsql.DB = s.db
			if conn != nil {
				db = conn
			}
			var read store.Beat
			beat := func(ctx context.Context) (bool, error) {
				var alive bool
				var err error
				alive, read, err = s.store.SessionsHeartbeat(ctx, db, s.id)
				return alive, err
			}
			if s.opts.Report != nil {
				c := s.opts.Report()
				counters := store.SessionCounters{Claimed: c.Claimed, Acked: c.Acked, Failed: c.Failed, InFlight: c.InFlight}
				beat = func(ctx context.Context) (bool, error) {
					var alive bool
					var err error
					alive, read, err = s.store.SessionsHeartbeatReport(ctx, db, s.id, counters)
					return alive, err
				}
			}
			err = retry.Do(hbCtx, nil, func(ctx context.Context) error {
				var err error
				alive, err = beat(ctx)
				return err
			})
			if err == nil && alive {
				s.noteBeat(sent, read)
			}
			if err != nil && conn != nil {
				// Whatever failed, the next heartbeat starts on a fresh
				// connection rather than one in an unknown state.
				closeConn(conn, s.opts.Heartbeat)
				conn = nil
			}
		}
		cancel()
		if h := s.opts.Testing.AfterHeartbeat; h != nil && ctx.Err() == nil {
			h(alive, err)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.log.Warn("heartbeat failed", zap.Error(err), zap.Duration("since_last_success", time.Since(lastSent)))
			if time.Since(lastSent) >= budget {
				s.lose(fmt.Errorf("no heartbeat succeeded for %v (the expiry %v less the clock margin %v): %w",
					budget, s.opts.Expiry, s.opts.ClockMargin, err))
				return
			}
		case !alive:
			s.lose(errors.New("the session row was deleted (expired and reaped by a peer, or removed by hand)"))
			return
		default:
			lastSent = sent
			deadline.Reset(budget - time.Since(sent))
		}
	}
}

func (s *Session) reapLoop(ctx context.Context) {
	defer s.loops.Done()
	if s.opts.ReapEvery <= 0 {
		return
	}
	tick := time.NewTicker(s.opts.ReapEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := ReapWithin(ctx, s.db, s.opts.Tables, s.opts.ReapTimeout)
		if h := s.opts.Testing.AfterReap; h != nil && ctx.Err() == nil {
			h(n, err)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.log.Warn("reaping expired sessions failed", zap.Error(err))
		case n > 0:
			s.log.Info("reaped expired sessions", zap.Int64("count", n))
		}
	}
}

// Close stops the session's loops and deletes its row, which releases its
// claims and parts at once. It is safe to call more than once; later calls
// return the first call's result. After Close, Err wraps ErrClosed (unless
// the session had already been lost).
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.cancel(ErrClosed)
		s.unregister() // at once: the AfterFunc above runs on a goroutine of its own
		s.loops.Wait()
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			return s.store.SessionsDelete(ctx, s.db, s.id)
		})
		if err != nil {
			s.closeErr = fmt.Errorf("session: deleting session %s: %w", s.id, err)
			return
		}
		s.log.Debug("session closed")
	})
	return s.closeErr
}

// Reap deletes every session whose last heartbeat is older than its expiry,
// by the database clock, and returns how many it deleted. Any process may
// call it at any time; it is idempotent.
func Reap(ctx context.Context, db crsql.DB, t crsql.Tables) (int64, error) {
	st := store.New(t)
	var n int64
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		n, err = st.SessionsReap(ctx, db)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("session: reaping expired sessions: %w", store.Classify(err))
	}
	return n, nil
}

// Info describes one live session.
type Info struct {
	ID             uuid.UUID
	Name, Host     string
	PID            int64
	CreatedAt      time.Time
	HeartbeatAt    time.Time
	Expiry         time.Duration
	Age            time.Duration // since creation, by the database clock
	SinceHeartbeat time.Duration // since the last heartbeat, by the database clock
	// Reported are the counters the session reported with its last
	// heartbeat (Options.Report); zero if it reports none.
	Reported Counters
}

// List returns the live sessions (heartbeat within their expiry, by the
// database clock), ordered by id.
func List(ctx context.Context, db crsql.DB, t crsql.Tables) ([]Info, error) {
	rows, err := store.New(t).SessionsLive(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("session: listing sessions: %w", store.Classify(err))
	}
	var out []Info
	for _, r := range rows {
		out = append(out, Info{
			ID: r.ID, Name: r.Name, Host: r.Host, PID: r.PID, CreatedAt: r.CreatedAt, HeartbeatAt: r.HeartbeatAt,
			Expiry: r.Expiry, Age: r.Age, SinceHeartbeat: r.SinceHeartbeat,
			Reported: Counters{Claimed: r.Reported.Claimed, Acked: r.Reported.Acked, Failed: r.Reported.Failed, InFlight: r.Reported.InFlight},
		})
	}
	return out, nil
}

// LiveIDs returns the ids of the live sessions, ordered, by the database
// clock: every queue's. To divide a queue's work, use Members: the
// sessions that work that queue.
func LiveIDs(ctx context.Context, db crsql.DB, t crsql.Tables) ([]uuid.UUID, error) {
	ids, err := store.New(t).SessionsLiveIDs(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("session: listing live sessions: %w", store.Classify(err))
	}
	return ids, nil
}

// Join makes the session a member of queue: from then on, as long as the
// session is live, it counts in the division of the queue's parts (package
// partition) and of its fleet-wide limit shares (package worker), and
// sessions that have not joined a queue do not (unless they own one of its
// parts: see Members). A session may join any number of queues. Joining
// again is harmless. Membership ends with the session (its row's deletion
// deletes the membership) or with Leave.
//
// It fails with an error wrapping ErrLost when the session's row is gone.
func (s *Session) Join(ctx context.Context, queue string) error {
	if _, err := s.join(ctx, queue); err != nil {
		return err
	}
	return nil
}

// join makes the session a member of queue and reports whether it was
// not one before.
func (s *Session) join(ctx context.Context, queue string) (bool, error) {
	var joined bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		joined, err = s.store.SessionsJoinQueue(ctx, s.db, queue, s.id)
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23503":
		return false, fmt.Errorf("session: joining queue %q: the row of session %s is gone: %w", queue, s.id, ErrLost)
	case err != nil:
		return false, fmt.Errorf("session: joining queue %q: %w", queue, store.Classify(err))
	}
	return joined, nil
}

// Leave ends the session's membership of queue (see Join). Parts of the
// queue that the session still owns keep it counted until they are
// released. Leaving a queue the session is not a member of does nothing.
func (s *Session) Leave(ctx context.Context, queue string) error {
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		return s.store.SessionsLeaveQueue(ctx, s.db, queue, s.id)
	})
	if err != nil {
		return fmt.Errorf("session: leaving queue %q: %w", queue, store.Classify(err))
	}
	return nil
}

// Members returns the ids of queue's live members, ordered, by the
// database clock: the live sessions that joined the queue (Join) or that
// own one of its parts. The latter keeps the sessions of code older than
// queue membership (schema version 3, which never joins) counted during a
// rolling upgrade, once they hold parts. Packages partition and worker
// divide a queue's parts and limit shares among these sessions only, so
// sessions of other queues in the same database never take a share.
func Members(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) ([]uuid.UUID, error) {
	return readIDs(ctx, db, store.New(t).SessionsQueueMembers, "the members of queue "+strconv.Quote(queue), queue)
}

// JoinedMembers returns the ids of the live sessions that joined queue,
// ordered: Members less the sessions that only own parts of it (those of
// code older than queue membership). The partition rebalancer leaves such
// sessions exactly the parts they hold, since they divide parts by rules
// of their own.
func JoinedMembers(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) ([]uuid.UUID, error) {
	return readIDs(ctx, db, store.New(t).SessionsJoined, "the joined members of queue "+strconv.Quote(queue), queue)
}

// LimitSharers returns the ids of the live sessions among which a queue
// worked without parts divides its fleet-wide limits, ordered: its Members
// and every live session that joined no queue at all. Code older than
// queue membership divides a limit among every live session of the
// database; counting its sessions here too keeps the sum of all shares
// within the limit while old and new workers share a queue.
func LimitSharers(ctx context.Context, db crsql.DB, t crsql.Tables, queue string) ([]uuid.UUID, error) {
	return readIDs(ctx, db, store.New(t).SessionsLimitSharers, "the sessions sharing the limits of queue "+strconv.Quote(queue), queue)
}

// readIDs reads session ids of queue with read (a Store method).
func readIDs(ctx context.Context, db crsql.DB, read func(context.Context, crsql.DB, string) ([]uuid.UUID, error), what, queue string) ([]uuid.UUID, error) {
	ids, err := read(ctx, db, queue)
	if err != nil {
		return nil, fmt.Errorf("session: listing %s: %w", what, store.Classify(err))
	}
	return ids, nil
}

// Membership is one session's membership of one queue (see Join).
type Membership struct {
	Queue    string
	Session  uuid.UUID
	JoinedAt time.Time
}

// Memberships returns every queue membership in the database, live
// sessions or not (an expired session's memberships go when a peer reaps
// it), ordered by queue and session: for operators. It reads the whole
// membership table.
func Memberships(ctx context.Context, db crsql.DB, t crsql.Tables) ([]Membership, error) {
	rows, err := store.New(t).SessionsMemberships(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("session: listing queue memberships: %w", store.Classify(err))
	}
	out := make([]Membership, 0, len(rows))
	for _, r := range rows {
		out = append(out, Membership{Queue: r.Queue, Session: r.Session, JoinedAt: r.JoinedAt})
	}
	return out, nil
}
