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
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Defaults for Options.
const (
	DefaultHeartbeat = time.Second
	DefaultExpiry    = 5 * time.Second
)

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

// Options configure a session. The zero value is valid: 1 s heartbeat,
// 5 s expiry, default table names, no logging.
type Options struct {
	// Heartbeat is the interval between heartbeats. Default 1 s.
	Heartbeat time.Duration
	// Expiry is how long after its last heartbeat a session may be deleted
	// by a peer. It must be at least MinExpiryFactor heartbeats. Default 5 s.
	Expiry time.Duration
	// ReapEvery is the interval between deletions of expired sessions.
	// Default: two heartbeats.
	ReapEvery time.Duration
	// Name is stored in the session row for operators (for example "demo-worker-3").
	Name string
	// Tables names the crdbwork tables.
	Tables crsql.Tables
	// Logger receives the session's logs. Default: none.
	Logger *zap.Logger
}

// withDefaults returns o with zero fields set to their defaults, or an error
// for values that cannot work.
func (o Options) withDefaults() (Options, error) {
	if o.Heartbeat == 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.Expiry == 0 {
		o.Expiry = max(DefaultExpiry, MinExpiryFactor*o.Heartbeat)
	}
	if o.ReapEvery == 0 {
		o.ReapEvery = 2 * o.Heartbeat
	}
	switch {
	case o.Heartbeat < time.Millisecond:
		return o, fmt.Errorf("session: heartbeat %v is too short (minimum 1ms)", o.Heartbeat)
	case o.Expiry < MinExpiryFactor*o.Heartbeat:
		return o, fmt.Errorf("session: expiry %v must be at least %d heartbeats (%v); raise the expiry or shorten the heartbeat",
			o.Expiry, MinExpiryFactor, MinExpiryFactor*o.Heartbeat)
	case o.ReapEvery < 0:
		return o, fmt.Errorf("session: reap interval %v is negative", o.ReapEvery)
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
	st     *crsql.Statements
	opts   Options
	log    *zap.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc
	loops  sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Start creates a session row and starts its heartbeat and reaper loops.
//
// The loops run until Close, until the session is lost, or until ctx is
// cancelled. Cancelling ctx loses the session: it stops heartbeating without
// deleting the row, exactly as if the process had died, and peers delete the
// row after the expiry. Call Close for a graceful stop that releases
// everything at once.
func Start(ctx context.Context, db crsql.DB, opts Options) (*Session, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	st := crsql.NewStatements(opts.Tables)
	host, _ := os.Hostname()
	var id uuid.UUID
	err = retry.Do(ctx, nil, func(ctx context.Context) error {
		return db.QueryRow(ctx, st.CreateSession, opts.Expiry.Microseconds(), host, os.Getpid(), opts.Name).Scan(&id)
	})
	if err != nil {
		return nil, fmt.Errorf("session: creating session row: %w", crsql.Classify(err))
	}
	s := &Session{id: id, db: db, st: st, opts: opts, log: opts.Logger.With(zap.Stringer("session", id))}
	s.ctx, s.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	context.AfterFunc(ctx, func() { s.lose(fmt.Errorf("the context given to Start ended: %w", ctx.Err())) })
	// The loops run on the session's own context: a lost or closed session
	// stops heartbeating and reaping.
	s.loops.Add(2)
	go s.heartbeatLoop(s.ctx)
	go s.reapLoop(s.ctx)
	s.log.Debug("session started", zap.Duration("heartbeat", opts.Heartbeat), zap.Duration("expiry", opts.Expiry))
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

func (s *Session) heartbeatLoop(ctx context.Context) {
	defer s.loops.Done()
	// lastSent is when the last successful heartbeat was sent, by this
	// process's monotonic clock. The database stamped the row with its own
	// now(), no earlier than that, so the row cannot expire before
	// lastSent + expiry: declaring the session lost then is on the safe side.
	lastSent := time.Now()
	tick := time.NewTicker(s.opts.Heartbeat)
	defer tick.Stop()
	deadline := time.NewTimer(s.opts.Expiry)
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			s.lose(fmt.Errorf("no heartbeat succeeded for %v (the expiry)", s.opts.Expiry))
			return
		case <-tick.C:
		}
		sent := time.Now()
		hbCtx, cancel := context.WithTimeout(ctx, s.opts.Heartbeat)
		var rows int64
		err := retry.Do(hbCtx, nil, func(ctx context.Context) error {
			tag, err := s.db.Exec(ctx, s.st.Heartbeat, s.id)
			rows = tag.RowsAffected()
			return err
		})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.log.Warn("heartbeat failed", zap.Error(err), zap.Duration("since_last_success", time.Since(lastSent)))
			if time.Since(lastSent) >= s.opts.Expiry {
				s.lose(fmt.Errorf("no heartbeat succeeded for %v: %w", s.opts.Expiry, err))
				return
			}
		case rows == 0:
			s.lose(errors.New("the session row was deleted (expired and reaped by a peer, or removed by hand)"))
			return
		default:
			lastSent = sent
			deadline.Reset(s.opts.Expiry - time.Since(sent))
		}
	}
}

func (s *Session) reapLoop(ctx context.Context) {
	defer s.loops.Done()
	if s.opts.ReapEvery == 0 {
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
		n, err := Reap(ctx, s.db, s.opts.Tables)
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
		s.loops.Wait()
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			_, err := s.db.Exec(ctx, s.st.DeleteSession, s.id)
			return err
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
	st := crsql.NewStatements(t)
	var n int64
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		tag, err := db.Exec(ctx, st.ReapSessions)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("session: reaping expired sessions: %w", crsql.Classify(err))
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
}

// List returns the live sessions (heartbeat within their expiry, by the
// database clock), ordered by id.
func List(ctx context.Context, db crsql.DB, t crsql.Tables) ([]Info, error) {
	st := crsql.NewStatements(t)
	rows, err := db.Query(ctx, st.LiveSessions)
	if err != nil {
		return nil, fmt.Errorf("session: listing sessions: %w", crsql.Classify(err))
	}
	defer rows.Close()
	var out []Info
	for rows.Next() {
		var in Info
		var exp, age, since int64
		if err := rows.Scan(&in.ID, &in.Name, &in.Host, &in.PID, &in.CreatedAt, &in.HeartbeatAt, &exp, &age, &since); err != nil {
			return nil, fmt.Errorf("session: reading sessions: %w", err)
		}
		in.Expiry, in.Age, in.SinceHeartbeat = time.Duration(exp)*time.Microsecond, time.Duration(age)*time.Microsecond, time.Duration(since)*time.Microsecond
		out = append(out, in)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("session: reading sessions: %w", err)
	}
	return out, nil
}

// LiveIDs returns the ids of the live sessions, ordered, by the database clock.
func LiveIDs(ctx context.Context, db crsql.DB, t crsql.Tables) ([]uuid.UUID, error) {
	st := crsql.NewStatements(t)
	rows, err := db.Query(ctx, st.LiveSessionIDs)
	if err != nil {
		return nil, fmt.Errorf("session: listing live sessions: %w", crsql.Classify(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("session: reading live sessions: %w", err)
	}
	return ids, nil
}
