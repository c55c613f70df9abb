package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// QueueConfig is one queue of a Group: the queue, its handler and the
// options of its work (concurrency, parts, limits, wake-ups, ...).
type QueueConfig struct {
	// Queue is the queue to work. With OpenGroup, leave it nil: the group
	// makes it from Claim on the pool it opens (Group.Queue returns it).
	Queue *claim.Queue
	// Claim is the options of the queue OpenGroup makes (its name,
	// tables, retry policy, lease); not read by NewGroup.
	Claim claim.Options
	// Handler handles the queue's items: any Handler (one function, or
	// the queue's Kinds' Handler).
	Handler Handler
	// Options are the queue's work options, as New takes them. What
	// belongs to the group's one session is GroupOptions': leave
	// Options.Session, Name, StartTimeout and RestartDelay zero (or equal
	// to the group's); Options.Testing.Session is not read (set
	// GroupOptions.Testing.Session). ShutdownTimeout bounds the queue's own
	// steps of a graceful stop (its handlers, its settles). The first
	// queue's maintenance loop deletes expired sessions (its
	// Testing.AfterSessionReap sees them); the others' do not.
	Options Options
}

// GroupOptions configure a Group: its one session and how it restarts.
// The zero value is valid: the defaults of Options' fields of the same
// names.
type GroupOptions struct {
	// Name is stored in the row of each of the group's sessions, for
	// operators (session.Options.Name).
	Name string
	// Session tunes the group's sessions (heartbeat, expiry, clock margin,
	// reaps): one session serves all its queues, so one heartbeat tells
	// the fleet the whole process is alive. Also the
	// idle_in_transaction_session_timeout OpenGroup gives its pool (see
	// ConfigurePool).
	Session session.Tuning
	// StartTimeout, RestartDelay and ShutdownTimeout are Options' (the
	// same defaults), for the group's session: how long Run keeps trying
	// to start the first session, the pause before a new session after
	// one was lost, and the bound on closing the session at a graceful
	// stop.
	StartTimeout, RestartDelay, ShutdownTimeout time.Duration
	// Logger receives the group's logs (its session's); each queue logs
	// to its own Options.Logger. Default: the first queue's Options.Logger
	// (none if it has none).
	Logger *zap.Logger
	// ExtraConns is how many connections OpenGroup's pool has beyond what
	// the group uses (GroupPoolConns): for the program's own enqueues and
	// reads on Group.Pool. Default 2; negative: none. Not read by NewGroup.
	ExtraConns int
	// Testing holds hooks for tests; not for production.
	Testing GroupTestingOptions
}

// GroupTestingOptions are hooks into a group's session, for tests; not for
// production. The queues' own hooks are in their Options.Testing.
type GroupTestingOptions struct {
	// Session holds the hooks of the group's sessions (each heartbeat).
	Session session.TestingOptions
}

// DefaultExtraConns is the default of GroupOptions.ExtraConns.
const DefaultExtraConns = 2

// Group works several queues of one database with one session: one row in
// the sessions table, one heartbeat (on a connection of its own), one
// wake-up listener, and for each queue its own handler, concurrency, parts,
// limits, wake-ups and maintenance, as a Worker of that queue would. The
// session is the unit of failure: when it is lost, every queue's handlers
// see their contexts cancelled and the group starts a new session for all;
// a graceful stop closes it once every queue's handlers finished, which
// releases all their claims and parts at once; a process that dies leaves
// all its queues' claims to be released when peers reap its session, after
// its expiry. Create it with NewGroup (or OpenGroup) and call Run once.
type Group struct {
	workers []*Worker
	opts    GroupOptions
	db      DB
	tables  crsql.Tables
	// single: the group of one of Worker.Run (a small pool is a warning,
	// not an error, as before groups).
	single bool
	// pool is the pool OpenGroup opened (closed by Close); nil otherwise.
	pool *pgxpool.Pool
}

// NewGroup returns a group that works queues with one session. The queues
// must be distinct and share one database and one set of tables (the
// sessions table is the group's); each queue's handler and options are as
// New takes them (Options.Middleware wraps that queue's handler). With
// defaults, a group uses the sum of its queues' PoolConns from the pool,
// and one heartbeat and one listener connection for all (GroupConnections);
// Run fails at once when the pool (a *pgxpool.Pool) has fewer connections
// than GroupPoolConns.
func NewGroup(queues []QueueConfig, opts GroupOptions) (*Group, error) {
	if len(queues) == 0 {
		return nil, errors.New("worker: a group needs at least one queue")
	}
	if opts.StartTimeout < 0 || opts.RestartDelay < 0 || opts.ShutdownTimeout < 0 {
		return nil, fmt.Errorf("worker: group: negative StartTimeout %v, RestartDelay %v or ShutdownTimeout %v",
			opts.StartTimeout, opts.RestartDelay, opts.ShutdownTimeout)
	}
	opts.StartTimeout = cmp.Or(opts.StartTimeout, DefaultStartTimeout)
	opts.RestartDelay = cmp.Or(opts.RestartDelay, DefaultRestartDelay)
	opts.ShutdownTimeout = cmp.Or(opts.ShutdownTimeout, DefaultShutdownTimeout)
	if opts.Logger == nil {
		opts.Logger = cmp.Or(queues[0].Options.Logger, zap.NewNop())
	}
	g := &Group{opts: opts}
	seen := make(map[string]bool)
	for i, qc := range queues {
		if qc.Queue == nil {
			return nil, fmt.Errorf("worker: group: queue %d is nil", i)
		}
		name := qc.Queue.Name()
		o := qc.Options
		switch {
		case seen[name]:
			return nil, fmt.Errorf("worker: group: queue %q is given twice", name)
		case o.Session != (session.Tuning{}) && o.Session != opts.Session:
			return nil, fmt.Errorf("worker: group: queue %q sets Options.Session, which is the group's: set GroupOptions.Session", name)
		case o.Name != "" && o.Name != opts.Name:
			return nil, fmt.Errorf("worker: group: queue %q sets Options.Name, which is the group's: set GroupOptions.Name", name)
		case (o.StartTimeout != 0 && o.StartTimeout != opts.StartTimeout) || (o.RestartDelay != 0 && o.RestartDelay != opts.RestartDelay):
			return nil, fmt.Errorf("worker: group: queue %q sets Options.StartTimeout or RestartDelay, which are the group's: set them in GroupOptions", name)
		}
		seen[name] = true
		o.Session, o.Name, o.StartTimeout, o.RestartDelay = opts.Session, opts.Name, opts.StartTimeout, opts.RestartDelay
		w, err := New(qc.Queue, qc.Handler, o)
		if err != nil {
			return nil, fmt.Errorf("worker: group: queue %q: %w", name, err)
		}
		if i == 0 {
			g.db, g.tables = w.db, w.tables
		} else if w.tables != g.tables {
			return nil, fmt.Errorf("worker: group: queue %q has other tables than queue %q (%+v, %+v): a group's queues share the sessions table",
				name, g.workers[0].name, w.tables, g.tables)
		} else if !sameDB(w.db, g.db) {
			return nil, fmt.Errorf("worker: group: queue %q is on another database (DB) than queue %q: make one group per database", name, g.workers[0].name)
		}
		w.inGroup = true
		g.workers = append(g.workers, w)
	}
	return g, nil
}

// sameDB reports whether a and b are the same database value (a pool or a
// connection); values of a type that cannot be compared count as the same.
func sameDB(a, b DB) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb {
		return false
	}
	if !ta.Comparable() {
		return true
	}
	return a == b
}

// asGroup returns the group of one that runs w (Worker.Run).
func (w *Worker) asGroup() *Group {
	return &Group{workers: []*Worker{w}, db: w.db, tables: w.tables, single: true,
		opts: GroupOptions{Name: w.opts.Name, Session: w.opts.Session, StartTimeout: w.opts.StartTimeout,
			RestartDelay: w.opts.RestartDelay, ShutdownTimeout: w.opts.ShutdownTimeout, Logger: w.opts.Logger,
			Testing: GroupTestingOptions{Session: w.opts.Testing.Session}}}
}

// Workers returns the group's workers, one per queue in the order given to
// NewGroup: for their Stats and Queue (a metrics collector takes them one
// by one). Their Run fails: the group runs them.
func (g *Group) Workers() []*Worker { return append([]*Worker(nil), g.workers...) }

// Worker returns the worker of the queue named queue, or nil.
func (g *Group) Worker(queue string) *Worker {
	for _, w := range g.workers {
		if w.name == queue {
			return w
		}
	}
	return nil
}

// Queue returns the claim.Queue named queue, or nil: with OpenGroup, the
// one it made (enqueue through it).
func (g *Group) Queue(queue string) *claim.Queue {
	if w := g.Worker(queue); w != nil {
		return w.queue
	}
	return nil
}

// Stats returns a snapshot of each queue's worker's counters, by queue
// name (Stats.Session is the group's one session).
func (g *Group) Stats() map[string]Stats {
	m := make(map[string]Stats, len(g.workers))
	for _, w := range g.workers {
		m[w.name] = w.Stats()
	}
	return m
}

// PoolConns returns the connections the group uses from its pool at most
// (GroupPoolConns of its queues' options).
func (g *Group) PoolConns() int {
	n := 0
	for _, w := range g.workers {
		n += PoolConns(w.opts)
	}
	return n
}

// GroupPoolConns returns the number of connections a group of queues with
// these options uses from its pool at most: the sum of their PoolConns
// (each queue claims, settles, maintains and checks statistics on its own
// connections, and in parts mode rebalances on one more). The heartbeat and
// the wake-up listener have connections of their own, outside the pool,
// one each for the whole group (see GroupConnections). With the defaults:
// 5 per queue, 6 in parts mode.
func GroupPoolConns(opts ...Options) int {
	n := 0
	for _, o := range opts {
		n += PoolConns(o)
	}
	return n
}

// GroupConnections returns the number of connections to the database a
// group of queues with these options opens at most: GroupPoolConns, plus
// one for the session's heartbeat, plus one for the wake-up listener
// (or the idle probe) unless every queue has NoWake: 3 queues with the
// defaults, one in parts mode, use 5 + 5 + 6 + 2 = 18, where three
// Workers would use 7 + 7 + 8 = 22 (and three sessions).
func GroupConnections(opts ...Options) int {
	n := GroupPoolConns(opts...) + 1
	for _, o := range opts {
		if !o.NoWake {
			return n + 1
		}
	}
	return n
}

// OpenGroup connects to the database at connString (a URL or DSN, as
// pgxpool.ParseConfig takes it) with a pool sized for the queues:
// GroupPoolConns of their options plus GroupOptions.ExtraConns (more if
// connString's pool_max_conns says so), configured for the group's session
// expiry (ConfigurePool), makes each queue from its QueueConfig.Claim on
// that pool, and returns the group of them. Enqueue through Group.Queue;
// Group.Pool is the pool; call Close after Run returned.
func OpenGroup(ctx context.Context, connString string, queues []QueueConfig, opts GroupOptions) (*Group, error) {
	if len(queues) == 0 {
		return nil, errors.New("worker: a group needs at least one queue")
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("worker: group: %w", err)
	}
	if err := ConfigurePool(cfg, Options{Session: opts.Session}); err != nil {
		return nil, err
	}
	all := make([]Options, len(queues))
	for i, qc := range queues {
		if qc.Queue != nil {
			return nil, fmt.Errorf("worker: group: queue %d (%q) is given: OpenGroup makes its queues from QueueConfig.Claim on its own pool; use NewGroup for queues of your pool",
				i, qc.Queue.Name())
		}
		all[i] = qc.Options
	}
	extra := opts.ExtraConns
	if extra == 0 {
		extra = DefaultExtraConns
	}
	cfg.MaxConns = max(cfg.MaxConns, int32(GroupPoolConns(all...)+max(0, extra)))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("worker: group: %w", err)
	}
	qs := make([]QueueConfig, len(queues))
	for i, qc := range queues {
		q, err := claim.New(pool, qc.Claim)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("worker: group: queue %d: %w", i, err)
		}
		qc.Queue = q
		qs[i] = qc
	}
	g, err := NewGroup(qs, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	g.pool = pool
	return g, nil
}

// Pool returns the pool OpenGroup opened, or nil for a group made by
// NewGroup.
func (g *Group) Pool() *pgxpool.Pool { return g.pool }

// Close closes the pool OpenGroup opened (nothing for NewGroup's): call it
// after Run returned.
func (g *Group) Close() {
	if g.pool != nil {
		g.pool.Close()
	}
}

// ErrPoolTooSmall is wrapped by the error of Group.Run when the group's
// pool has fewer connections (pgxpool.Config.MaxConns) than the group uses
// (Group.PoolConns).
var ErrPoolTooSmall = errors.New("the pool is too small for the group's queues")

// poolUse counts, per pool, the connections that the running groups and
// workers of the process use from it (their PoolConns), so that Run can
// tell when several share a pool too small for all of them.
var poolUse struct {
	mu sync.Mutex
	m  map[*pgxpool.Pool]int
}

// reservePool checks the group's pool (a *pgxpool.Pool; others are not
// checked) against what the group and the other running groups and
// workers on it use: a group whose own use exceeds the pool fails with
// ErrPoolTooSmall; a worker's (the group of one of Worker.Run), and any
// group's whose use with the others' exceeds it, is logged as a warning
// (the workers' statements then wait for each other's connections, which
// slows them but loses nothing). release undoes the reservation.
func (g *Group) reservePool() (release func(), err error) {
	pool, ok := g.db.(*pgxpool.Pool)
	if !ok {
		return func() {}, nil
	}
	need, have := g.PoolConns(), int(pool.Config().MaxConns)
	if need > have && !g.single {
		return nil, fmt.Errorf("worker: group: %w: its %d queues use %d connections (GroupPoolConns), the pool has MaxConns %d: "+
			"raise MaxConns (pool_max_conns in the URL) to at least %d, or let OpenGroup size the pool",
			ErrPoolTooSmall, len(g.workers), need, have, need)
	}
	poolUse.mu.Lock()
	if poolUse.m == nil {
		poolUse.m = make(map[*pgxpool.Pool]int)
	}
	others := poolUse.m[pool]
	poolUse.m[pool] = others + need
	poolUse.mu.Unlock()
	if need+others > have {
		log := g.opts.Logger
		if g.single {
			log = g.workers[0].log
		}
		log.Warn("the pool is smaller than what the workers running on it use: their statements will wait for each other's connections "+
			"(a lease extension behind an ANALYZE, acks behind claims); raise the pool's MaxConns, or run the queues in one worker.Group",
			zap.Int("pool_max_conns", have), zap.Int("this_worker_uses", need), zap.Int("others_use", others))
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			poolUse.mu.Lock()
			if poolUse.m[pool] -= need; poolUse.m[pool] <= 0 {
				delete(poolUse.m, pool)
			}
			poolUse.mu.Unlock()
		})
	}, nil
}

// Run works every queue of the group until ctx is cancelled, then shuts
// down gracefully: every queue stops claiming and lets its in-flight
// handlers finish within its ShutdownTimeout (then cancels them and
// releases their items), and once every queue is done the group closes its
// session within GroupOptions.ShutdownTimeout, which releases every claim
// and part left at once. When the session is lost, every queue's handlers
// see their contexts cancelled and Run starts a new session after
// RestartDelay; a queue whose session work fails to start (its rebalancer)
// ends the session for all, which then restart together. Run returns nil
// after a graceful stop, or an error when it cannot start: at once for a
// schema that is not this code's, a database user that lacks a privilege
// the workers need on a crdbwork table (ErrPrivileges: Run checks them
// once, before its first session), bad options or a pool smaller than
// GroupPoolConns (ErrPoolTooSmall), after StartTimeout for a database it
// cannot reach. Worker.Run is Run of a group of one (a small pool is then a
// warning).
func (g *Group) Run(ctx context.Context) error {
	began := time.Now()
	// retryStart reports whether a failed start may be tried again: not for
	// a schema that is not this code's or bad options, and before the
	// first session only for a transient failure within StartTimeout.
	retryStart := func(err error, first bool) bool {
		switch {
		case errors.Is(err, crsql.ErrSchemaMissing), errors.Is(err, crsql.ErrSchemaOutdated), errors.Is(err, crsql.ErrSchemaNewer),
			errors.Is(err, ErrPrivileges) && first:
			return false
		case !first:
			return true
		}
		return attempt.Transient(err) && time.Since(began) < g.opts.StartTimeout
	}
	pause := func() {
		t := time.NewTimer(g.opts.RestartDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	release, err := g.reservePool()
	if err != nil {
		return err
	}
	defer release()
	// Once, before anything is written: the user's privileges on every
	// table the workers use (and the schema's version).
	for {
		err := CheckGrants(ctx, g.db, g.tables)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		if !retryStart(err, true) {
			return fmt.Errorf("worker: %w", err)
		}
		g.workers[0].log.Warn("reaching the database failed; retrying", zap.Error(err))
		pause()
	}
	for _, w := range g.workers {
		for {
			err := w.ensureParts(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil // stopped before it started
			}
			if !retryStart(err, true) {
				return fmt.Errorf("worker: %w", err)
			}
			w.log.Warn("reaching the database failed; retrying", zap.Error(err))
			pause()
		}
	}
	for _, w := range g.workers {
		defer w.startWake()()
	}
	log := g.opts.Logger
	if g.single {
		log = g.workers[0].log
	}
	first := true
	for ctx.Err() == nil {
		sess, done, err := g.startSession(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			err = g.workers[0].explainRefusal(ctx, err)
			if !retryStart(err, first) {
				return fmt.Errorf("worker: %w", err)
			}
			log.Warn("starting a session failed; retrying", zap.Error(err))
		default:
			if first {
				g.workers[0].checkIdleTimeout(ctx, sess.Options().Expiry, log)
			}
			first = false
			end := &sessionEnd{sess: sess, timeout: g.opts.ShutdownTimeout}
			end.left.Store(int32(len(g.workers)))
			var wg sync.WaitGroup
			for i, w := range g.workers {
				w.sessions.Add(1)
				w.current.Store(sess.ID().String())
				wg.Add(1)
				go func() {
					defer wg.Done()
					// One maintenance loop per session deletes expired
					// sessions: the first queue's.
					w.runSession(ctx, sess, end, i == 0)
				}()
			}
			wg.Wait()
			done()
			for _, w := range g.workers {
				w.current.Store("")
			}
			if ctx.Err() != nil {
				return nil
			}
			for _, w := range g.workers {
				w.lost.Add(1)
			}
		}
		pause()
	}
	return nil
}

// sessionEnd closes a group's session once every queue is done with it.
type sessionEnd struct {
	sess *session.Session
	left atomic.Int32 // queues still working on the session
	// timeout bounds the close (GroupOptions.ShutdownTimeout).
	timeout time.Duration
}

// done tells that one queue is done with the session: the last one closes
// it (within the group's ShutdownTimeout); the others wait for the session
// to end, since their rebalancers and maintenance loops run until it does.
// The wait is bounded: every queue's steps before done are (by its
// ShutdownTimeout), and so is the last one's Close.
func (e *sessionEnd) done() error {
	if e.left.Add(-1) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		defer cancel()
		return e.sess.Close(ctx)
	}
	<-e.sess.Done()
	return nil
}

// startSession starts the group's session and makes it a member of every
// queue. ctx bounds the start (a cancelled ctx stops a start stuck on an
// unreachable database) but not the session's life: a shutdown closes the
// session gracefully rather than losing it. Call done once the session is
// closed.
func (g *Group) startSession(ctx context.Context) (sess *session.Session, done func(), err error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	sopts := session.Options{Tuning: g.opts.Session, Name: g.opts.Name, Tables: g.tables, Logger: g.opts.Logger, Testing: g.opts.Testing.Session}
	sopts.ReapEvery = -1 // the maintenance loop reaps, on its own connection
	// The session's counters ride on its heartbeats (for operators:
	// crdbwork status), summed over the queues; counted from the
	// session's start.
	base := make([]claim.Stats, len(g.workers))
	for i, w := range g.workers {
		base[i] = w.queue.Stats()
	}
	sopts.Report = func() session.Counters {
		var c session.Counters
		for i, w := range g.workers {
			st, b := w.queue.Stats(), base[i]
			c.Claimed += st.Claimed - b.Claimed
			c.Acked += st.Acked - b.Acked
			c.Failed += st.Nacked + st.Dead - b.Nacked - b.Dead
			c.InFlight += w.inflight.Load()
		}
		return c
	}
	closeSess := func(sess *session.Session) {
		closeCtx, cancelClose := context.WithTimeout(context.WithoutCancel(ctx), g.opts.ShutdownTimeout)
		sess.Close(closeCtx)
		cancelClose()
	}
	sess, err = session.Start(sctx, g.db, sopts)
	if err == nil {
		// The session works the queues: it counts among each queue's
		// members (its parts and, without parts, its limit shares are
		// divided among them) before its first claim.
		for _, w := range g.workers {
			if jerr := sess.Join(sctx, w.name); jerr != nil {
				closeSess(sess)
				sess, err = nil, fmt.Errorf("worker: joining queue %q: %w", w.name, jerr)
				break
			}
		}
	}
	if !stop() {
		// ctx ended during the start: the session, if any, is already lost.
		if err == nil {
			closeSess(sess)
		}
		cancel()
		return nil, nil, fmt.Errorf("worker: starting a session: %w", ctx.Err())
	}
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return sess, cancel, nil
}
