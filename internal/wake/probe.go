package wake

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// The idle probe: CockroachDB has no LISTEN, so each process asks the
// database itself, on one connection of its own per database, whether the
// queues of its idle workers have items to claim. Every interval (Every,
// jittered), for each queue that has at least one idle worker in the
// process (Idle), it runs one read-only statement (store.Store.Probe: the
// claim's read of up to 8 items in claim order, through the claim's index,
// without locks or writes) and, when it finds items it has not announced
// yet, signals the queue's channel with their parts as hints, as a
// notification would. Its cost is therefore one indexed read per queue
// per interval per process while some worker of the queue idles, and
// nothing while all are busy or stopped, however many workers and
// handlers the process runs.
//
// An item the probe announced and that stays claimable (a claim skipped
// it: its tenant is at its limit, its key's earlier item runs, or its part
// is another process's) is announced again at most every Again (the
// workers' poll interval), so idle workers claim no more often than they
// would poll without the probe; a new item behind 8 such items is found by
// that re-announcement or by the workers' own poll.
//
// The probe never holds up claims. Workers keep their poll; while the
// probe answers (Probing) they may poll less often, and when it stops
// answering (a failed or timed-out statement, a lost connection) it
// signals its channels once so that waiting workers go back to their
// normal poll at once, and reconnects with the listener's backoff (100 ms
// to 10 s).

// Timings of the prober.
const (
	// probeTimeout bounds one probe statement: a connection that stops
	// answering is given up after it, and the workers poll.
	probeTimeout = 2 * time.Second
)

// ProbeSpec is what a worker asks of the prober for its queue.
type ProbeSpec struct {
	// Store has the queue's tables; Queue is its name.
	Store *store.Store
	Queue string
	// Every is the probe interval (the shortest of the queue's workers'
	// applies); Again is how often an item found again, still claimable,
	// is announced again (the workers' poll interval: the shortest
	// applies).
	Every, Again time.Duration
	// CockroachOnly probes only once the server is known to be
	// CockroachDB (on PostgreSQL the listener wakes the workers; the
	// listener, which the worker must also start, finds the engine).
	CockroachOnly bool
}

// probers are the process's probers, one per database (by connection
// settings, as the listeners).
var probers struct {
	mu sync.Mutex
	m  map[string]*prober
}

// idle counts the idle workers of each channel (Idle); health records the
// channels whose last probe answered (Probing). kicks wakes the probers
// when a channel gains its first idle worker.
var idle struct {
	mu     sync.Mutex
	n      map[string]int
	health map[string]bool
}

// dialects records the engine found behind each database key, by the
// listener or the prober: channels that probe on CockroachDB only (their
// workers also start the listener, which finds the engine at its first
// connection) are probed once it is known to be CockroachDB, so that on
// PostgreSQL the prober never connects.
var dialects sync.Map // key → store.Dialect

// Idle marks one worker of channel as idle (waiting for items) until done
// is called: the prober probes only channels that have idle workers.
func Idle(channel string) (done func()) {
	idle.mu.Lock()
	if idle.n == nil {
		idle.n = make(map[string]int)
	}
	idle.n[channel]++
	first := idle.n[channel] == 1
	idle.mu.Unlock()
	if first {
		kickProbers()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			idle.mu.Lock()
			if idle.n[channel]--; idle.n[channel] <= 0 {
				delete(idle.n, channel)
			}
			idle.mu.Unlock()
		})
	}
}

// idleCount returns the number of idle workers of channel.
func idleCount(channel string) int {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	return idle.n[channel]
}

// Probing reports whether channel's last probe answered: its idle workers
// are then woken by the probe, and may poll less often.
func Probing(channel string) bool {
	idle.mu.Lock()
	defer idle.mu.Unlock()
	return idle.health[channel]
}

// setHealth records whether channel's probe answers; on a change to not
// answering it signals the channel, so that workers waiting on the probe
// go back to their poll.
func setHealth(channel string, ok bool) {
	idle.mu.Lock()
	if idle.health == nil {
		idle.health = make(map[string]bool)
	}
	was := idle.health[channel]
	if ok {
		idle.health[channel] = true
	} else {
		delete(idle.health, channel)
	}
	idle.mu.Unlock()
	if was && !ok {
		Signal(channel)
	}
}

func kickProbers() {
	probers.mu.Lock()
	defer probers.mu.Unlock()
	for _, p := range probers.m {
		p.kick()
	}
}

// prober probes, on one connection of its own, the channels its users
// asked for.
type prober struct {
	key string
	cfg *pgx.ConnConfig
	log *zap.Logger

	mu       sync.Mutex
	channels map[string]*probeChannel
	users    int
	changed  chan struct{} // signalled (without blocking) on a new channel or idle worker
	cancel   context.CancelFunc
}

// probeChannel is one channel's probe state.
type probeChannel struct {
	specs []ProbeSpec // one per user
	// seen are the ids the last probe found; announced is when they were
	// last announced.
	seen      map[uuid.UUID]bool
	announced time.Time
}

// spec returns the channel's merged spec: the shortest intervals, and
// CockroachOnly unless a user probes on every engine.
func (c *probeChannel) spec() ProbeSpec {
	s := c.specs[0]
	for _, o := range c.specs[1:] {
		s.Every, s.Again = min(s.Every, o.Every), min(s.Again, o.Again)
		s.CockroachOnly = s.CockroachOnly && o.CockroachOnly
	}
	return s
}

// Probe makes the process's prober of the database db connects to probe
// channel's queue (spec) while the channel has idle workers (Idle),
// starting the prober on a connection of its own if it is not running,
// until stop is called; the last stop of a database's prober closes its
// connection. db must give its connection settings (a *pgxpool.Pool or a
// *pgx.Conn); for any other, Probe does nothing and ok is false.
func Probe(db any, channel string, spec ProbeSpec, log *zap.Logger) (stop func(), ok bool) {
	cfg := connConfig(db)
	if cfg == nil || spec.Store == nil || spec.Every <= 0 {
		return func() {}, false
	}
	if spec.Again < spec.Every {
		spec.Again = spec.Every
	}
	if log == nil {
		log = zap.NewNop()
	}
	key := dbKey(cfg)
	probers.mu.Lock()
	if probers.m == nil {
		probers.m = make(map[string]*prober)
	}
	p := probers.m[key]
	if p == nil {
		ctx, cancel := context.WithCancel(context.Background())
		p = &prober{key: key, cfg: cfg, log: log.Named("probe"), channels: make(map[string]*probeChannel),
			changed: make(chan struct{}, 1), cancel: cancel}
		probers.m[key] = p
		go p.run(ctx)
	}
	p.mu.Lock()
	p.users++
	c := p.channels[channel]
	if c == nil {
		c = &probeChannel{}
		p.channels[channel] = c
	}
	c.specs = append(c.specs, spec)
	p.mu.Unlock()
	p.kick()
	probers.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { p.release(channel, spec) }) }, true
}

// dbKey names a database by its connection settings.
func dbKey(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s|%s:%d/%s/%s", cfg.ConnString(), cfg.Host, cfg.Port, cfg.Database, cfg.User)
}

func (p *prober) kick() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// release drops one user of channel; the last user stops the prober.
func (p *prober) release(channel string, spec ProbeSpec) {
	probers.mu.Lock()
	defer probers.mu.Unlock()
	p.mu.Lock()
	p.users--
	if c := p.channels[channel]; c != nil {
		for i, s := range c.specs {
			if s == spec {
				c.specs = append(c.specs[:i], c.specs[i+1:]...)
				break
			}
		}
		if len(c.specs) == 0 {
			delete(p.channels, channel)
			setHealth(channel, false)
		}
	}
	last := p.users == 0
	p.mu.Unlock()
	if last {
		delete(probers.m, p.key)
		p.cancel()
	}
}

// due is one channel to probe now.
type due struct {
	channel string
	spec    ProbeSpec
}

// wanted returns the channels to probe now: those with idle workers, and
// of those that probe on CockroachDB only, none on PostgreSQL; and the
// interval until the next round (the shortest of theirs, 0 if none).
func (p *prober) wanted() (ds []due, every time.Duration) {
	d, known := dialects.Load(p.key)
	cockroach := known && d.(store.Dialect) == store.Cockroach
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch, c := range p.channels {
		s := c.spec()
		if s.CockroachOnly && !cockroach {
			continue // until the listener (or this prober) found CockroachDB
		}
		if idleCount(ch) == 0 {
			// Not probed while nobody waits on it; its health stays: a
			// connection that died meanwhile fails the next probe, within
			// probeTimeout, which signals the channel.
			continue
		}
		ds = append(ds, due{ch, s})
		if every == 0 || s.Every < every {
			every = s.Every
		}
	}
	return ds, every
}

// run probes until ctx ends, reconnecting with backoff.
func (p *prober) run(ctx context.Context) {
	backoff := minBackoff
	for {
		connected, err := p.session(ctx)
		p.unhealthy()
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = minBackoff
		}
		if err == nil {
			continue // nothing to probe on this engine: session waits for a change
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		p.log.Warn("the idle probe's connection failed: idle workers poll until it is back", zap.Duration("reconnect_in", wait), zap.Error(err))
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

// unhealthy marks every channel of the prober as not probed.
func (p *prober) unhealthy() {
	p.mu.Lock()
	chs := make([]string, 0, len(p.channels))
	for ch := range p.channels {
		chs = append(chs, ch)
	}
	p.mu.Unlock()
	for _, ch := range chs {
		setHealth(ch, false)
	}
}

// waitWanted waits until some channel is to be probed, and returns the
// interval; false if ctx ended.
func (p *prober) waitWanted(ctx context.Context) (time.Duration, bool) {
	for {
		if _, every := p.wanted(); every > 0 {
			return every, true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-p.changed:
		}
	}
}

// errNothingToProbe ends a session whose channels all probe on CockroachDB
// only, on PostgreSQL.
var errNothingToProbe = errors.New("nothing to probe on PostgreSQL")

// session connects once something is to be probed and probes until the
// connection fails or ctx ends; connected reports whether it got as far as
// probing. It returns a nil error when the server is PostgreSQL and no
// channel probes there.
func (p *prober) session(ctx context.Context) (connected bool, err error) {
	if _, ok := p.waitWanted(ctx); !ok {
		return false, ctx.Err()
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, dialect, closeConn, err := connectDetect(cctx, p.cfg, "the idle probe")
	if err != nil {
		return false, err
	}
	defer closeConn()
	dialects.Store(p.key, dialect)
	// READ COMMITTED: a probe never waits for a transaction in flight (see
	// store.Store.ProbeSession). Not needed for correctness: a server that
	// refuses it probes at its default isolation.
	if err := store.New(crsql.Tables{}).ProbeSession(cctx, conn); err != nil {
		if conn.IsClosed() {
			return false, fmt.Errorf("wake: idle probe: %w", err)
		}
		p.log.Info("the idle probe reads at the server's default isolation", zap.Error(err))
	}
	cancel()
	for {
		ds, every := p.wanted()
		if every == 0 {
			if dialect == store.Postgres && p.onlyCockroach() {
				return true, nil // close the connection: nothing to probe here
			}
			if every, ok := p.waitWanted(ctx); !ok || every == 0 {
				return true, ctx.Err()
			}
			continue
		}
		for _, d := range ds {
			if err := p.probe(ctx, conn, dialect, d); err != nil {
				if ctx.Err() != nil {
					return true, ctx.Err()
				}
				return true, err
			}
		}
		// The next round after the interval, jittered by a fifth either
		// way so that processes do not probe in step.
		t := time.NewTimer(every*4/5 + rand.N(every*2/5+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return true, ctx.Err()
		case <-t.C:
		}
	}
}

// onlyCockroach reports whether every channel probes on CockroachDB only.
func (p *prober) onlyCockroach() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.channels {
		if !c.spec().CockroachOnly {
			return false
		}
	}
	return true
}

// probe runs one channel's probe, in the statement's twin of dialect, and
// signals its new items.
func (p *prober) probe(ctx context.Context, conn *pgx.Conn, dialect store.Dialect, d due) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	rows, err := d.spec.Store.Probe(pctx, conn, dialect, d.spec.Queue)
	cancel()
	if err != nil {
		setHealth(d.channel, false)
		return fmt.Errorf("wake: idle probe of queue %q: %w", d.spec.Queue, err)
	}
	now := time.Now()
	p.mu.Lock()
	c := p.channels[d.channel]
	if c == nil { // released meanwhile
		p.mu.Unlock()
		return nil
	}
	fresh := false
	seen := make(map[uuid.UUID]bool, len(rows))
	parts := make([]int64, 0, len(rows))
	for _, r := range rows {
		seen[r.ID] = true
		fresh = fresh || !c.seen[r.ID]
		parts = append(parts, r.Part)
	}
	announce := len(rows) > 0 && (fresh || now.Sub(c.announced) >= d.spec.Again)
	c.seen = seen
	if announce {
		c.announced = now
	}
	p.mu.Unlock()
	setHealth(d.channel, true)
	if announce {
		SignalHashes(d.channel, parts)
	}
	return nil
}
