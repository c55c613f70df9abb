package worker

// Fleet-wide limits
//
// A queue (and each tenant of it) may be limited to at most N items in
// flight across all workers and to R items claimed per second. There is no
// shared counter: a row that every claim and every ack updates would be a
// hot spot on CockroachDB (every claimer would contend on one range, and
// every conflict costs a transaction retry). Instead each session enforces
// a share of each limit locally, and the shares are computed so that they
// add up to the limit:
//
//   - In parts mode the limit is spread over the queue's parts: of n parts
//     and a limit L, part p (counted from a rotating offset) gets
//     floor((p+1)·L/n) − floor(p·L/n) units, so every part gets L/n rounded
//     down or up and the parts' units add up to exactly L. A session's share
//     is the sum over the parts it owns and is not draining. Parts have one
//     owner at a time (a unique row in the database), so the shares of the
//     owners add up to at most L. The rate is divided the same way, as a
//     real number: R·(parts owned)/n.
//   - Without parts, the limit is spread the same way over the queue's
//     live members (session.Members) in the order of their ids: the
//     session of rank i of k gets the units of slot i.
//   - When L is smaller than the number of slots, some slots get no unit; so
//     that no part (or session) waits for ever, the offset moves by one slot
//     every LimitOptions.Rotate by the database clock (every session derives
//     the same offset from the same clock).
//
// A share that shrinks (a part given up, a session joining, the offset
// moving away) takes effect at once: the session claims nothing until its
// items in flight fall under the new share. A share that grows is used only
// once it has been that large for LimitOptions.Grace: by then every other
// session has seen the change (they refresh their view every
// LimitOptions.Refresh, which Grace exceeds) and stopped claiming beyond its
// own new share. So the limit holds, except for items that a session
// claimed under its old, larger share and that are still running Grace
// after the change: the fleet may exceed the limit by at most the shares
// that moved while such items ran, and only until they end (at most
// ItemTimeout + HangGrace). In parts mode a part given up first drains (its items end, or
// Partition.DrainTimeout passes: then their handlers are cancelled and the
// items given back, partition.Options.OnDrainTimeout) before another
// session can acquire it, so
// items shorter than the drain plus Grace never overlap.
//
// Tenant limits are enforced the same way without parts (the tenant's limit
// spread over the sessions by rank, from an offset that depends on the
// tenant, so that different tenants' units land on different sessions). In
// parts mode a tenant's items without a key all live in one part (the part
// follows the tenant), so the owner of that part sees all of them and
// enforces the tenant's whole limit; other sessions see none of them. Items
// with a key are spread by key: for them the tenant's limit holds per
// session. The urgent lane (Options.UrgentLane), which claims from any
// part, takes items of limited tenants only from the session's own parts,
// so that it never multiplies a tenant's limit by the number of sessions. A session leaves the tenants at their share out of its claims
// (claim.ClaimRequest.SkipTenants, for the tenants it knows about: those
// with stored limits and those whose items it has claimed recently); an
// item of a tenant at its share that a claim still returns is released at
// once, without running and without counting an attempt.
//
// The rate is a token bucket per session (and per tenant) filled at the
// share's rate, holding at most max(1, rate·LimitOptions.Burst) tokens, and
// empty when the session starts: over any window of w seconds the fleet
// claims at most R·w plus one bucket per session.
//
// Only a queue's members count (session.Members: the live sessions that
// work the queue): sessions of other queues in the same database take no
// share, so a queue's shares are neither diluted nor multiplied by them.
//
// # When the limits cannot be read
//
// A session re-reads the limits (and the queue's parts or members) every
// LimitOptions.Refresh while they limit something. While they limit
// nothing, it reads them when its heartbeat finds the queue's change
// marker moved (a write of limits by code of schema version 6 raises it)
// and every limitQuietRefresh (30 s, for writers of versions 3 to 5), and
// dates them by its last heartbeat (they are that recent, as far as
// version-6 writers go). While a read fails, it goes on with the last values
// read, but for at most LimitOptions.StaleAfter after its last successful
// read began (default 5 s): values are as old as the read's start, however
// long it took. A read is given at most StaleAfter; one that takes longer
// (waiting for a lock) fails. Past that the limits are stale
// (LimitStats.Stale) and the session fails safe, until a read succeeds:
//
//   - if the last values limit the queue (in flight or rate) or every
//     tenant (a default tenant limit), it claims nothing at all;
//   - if they limit only some tenants, it leaves those tenants out of its
//     claims and releases, without running, any item of theirs a claim
//     still returns;
//   - if they limit nothing, it claims on: a limit stored while the
//     reads fail takes effect with the first read that succeeds, as any
//     new limit does.
//
// So a limit lowered (or added to a limited queue) while a session cannot
// read it is exceeded by that session's claims for at most StaleAfter
// (plus one Refresh, the time the other sessions need to see the change),
// and by the items claimed before then until they end (at most their
// ItemTimeout + HangGrace). Items already running are never stopped by
// staleness. Before its first successful read a session claims nothing
// from any queue.
//
// # What is not bounded: frozen processes
//
// Shares are counted per live session. A process that is frozen (SIGSTOP,
// a paused VM, a stall of the whole process) for longer than its session's
// expiry loses its session while it cannot notice: peers reap the row
// (releasing its claims and parts at once, through the foreign keys),
// divide its parts and shares among themselves, and claim its items again.
// When the process continues, its handlers resume where they stopped: for
// them the limits do not count any more. Within a heartbeat the session
// finds itself lost and cancels their contexts, and none of their acks can
// commit (their claims are gone), so each such handler overlaps the fleet's
// new work only until it returns on its cancelled context: a handler that
// honours its context adds at most the time it takes to stop; one that
// ignores it runs on (the worker abandons it after HangGrace, but cannot
// stop the goroutine). The claim of every item the frozen process held
// ends with its session's expiry or its lease (claim.Options.Lease),
// whichever comes first, so no item waits on a frozen process for longer
// than that. A process frozen for less than its session's expiry keeps
// its session and its share, and nothing moves.

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/crdbwork/crdbwork/claim"
)

// Defaults for LimitOptions.
const (
	DefaultLimitRefresh = time.Second
	DefaultLimitGrace   = 2500 * time.Millisecond
	DefaultLimitRotate  = 5 * time.Second
	DefaultLimitBurst   = 100 * time.Millisecond
	// DefaultLimitStaleAfter is LimitOptions.StaleAfter when left zero
	// (unless three Refresh intervals are longer: then those).
	DefaultLimitStaleAfter = 5 * time.Second
)

// maxSkipTenants bounds the tenants one claim leaves out by name; items of
// further tenants at their limit are released when a claim returns them.
const maxSkipTenants = 1000

// tenantIdle is how long a session remembers a tenant it has no item of.
const tenantIdle = time.Minute

// LimitOptions configure how a worker enforces its queue's fleet-wide
// limits (stored in the database: claim.Queue.UpdateSettings and
// claim.SettingsUpdate.TenantLimits). The zero value is valid.
type LimitOptions struct {
	// Refresh is how often the worker reads the stored limits (and,
	// without parts, the queue's live members) while they limit
	// something. While they limit nothing it reads them when its
	// heartbeat finds the queue's change marker moved (writes of limits
	// raise it), and every 30 s (see "When the limits cannot be read" in
	// limits.go). Default 1 s.
	Refresh time.Duration
	// Grace is how long a share that grows waits before the worker uses
	// it; it must exceed Refresh. A new session claims nothing from a
	// limited queue during its first Grace. Default 2.5 s.
	Grace time.Duration
	// Rotate is how often the units of a limit smaller than the number of
	// parts (or sessions) move on by one part (or session). Default 5 s.
	Rotate time.Duration
	// Burst sizes the token buckets: each holds at most max(1, rate·Burst)
	// tokens. Default 100 ms.
	Burst time.Duration
	// StaleAfter bounds how long the worker goes on enforcing the limits
	// it last read while re-reading them fails: once its last successful
	// read is StaleAfter old, it claims nothing that those limits govern
	// until a read succeeds (see "When the limits cannot be read" in
	// limits.go). It must exceed Refresh. Default 5 s, or three Refresh
	// intervals if longer.
	StaleAfter time.Duration
}

func (o LimitOptions) withDefaults() (LimitOptions, error) {
	if o.Refresh == 0 {
		o.Refresh = DefaultLimitRefresh
	}
	if o.Grace == 0 {
		o.Grace = max(DefaultLimitGrace, 2*o.Refresh+o.Refresh/2)
	}
	if o.Rotate == 0 {
		o.Rotate = DefaultLimitRotate
	}
	if o.Burst == 0 {
		o.Burst = DefaultLimitBurst
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = max(DefaultLimitStaleAfter, 3*o.Refresh)
	}
	switch {
	case o.Refresh < 0 || o.Rotate < 0 || o.Burst < 0 || o.Grace < 0 || o.StaleAfter < 0:
		return o, fmt.Errorf("worker: negative Limits durations (refresh %v, grace %v, rotate %v, burst %v, stale after %v)",
			o.Refresh, o.Grace, o.Rotate, o.Burst, o.StaleAfter)
	case o.Refresh > MaxDuration || o.Grace > MaxDuration || o.Rotate > MaxDuration || o.Burst > MaxDuration || o.StaleAfter > MaxDuration:
		return o, fmt.Errorf("worker: Limits durations must be at most %v", MaxDuration)
	case o.Grace <= o.Refresh:
		return o, fmt.Errorf("worker: Limits.Grace %v must exceed Limits.Refresh %v", o.Grace, o.Refresh)
	case o.StaleAfter <= o.Refresh:
		return o, fmt.Errorf("worker: Limits.StaleAfter %v must exceed Limits.Refresh %v", o.StaleAfter, o.Refresh)
	}
	return o, nil
}

// Limits are the limits a worker enforces: the queue's, the default for
// each tenant, and the tenants' own.
type Limits struct {
	// Queue limits all the queue's items.
	Queue claim.Limit
	// Tenant limits each tenant that has no limit of its own in Tenants.
	Tenant claim.Limit
	// Tenants are the tenants' own limits.
	Tenants map[string]claim.Limit
}

// forTenant returns tenant t's limit.
func (l Limits) forTenant(t string) claim.Limit {
	if o, ok := l.Tenants[t]; ok {
		return o
	}
	return l.Tenant
}

// none reports whether l limits nothing at all.
func (l Limits) none() bool {
	if !l.Queue.Unlimited() || !l.Tenant.Unlimited() {
		return false
	}
	for _, t := range l.Tenants {
		if !t.Unlimited() {
			return false
		}
	}
	return true
}

// unit returns the units of a limit of total that slot r of n gets: the
// slots' units differ by at most one and add up to total.
func unit(total int64, n, r int) int64 {
	return (int64(r)+1)*total/int64(n) - int64(r)*total/int64(n)
}

// spread returns the units of a limit of total that slots (of n) get, slot
// offset getting the first slot's units.
func spread(total int64, n int, slots []int, offset int) int64 {
	if n <= 0 {
		return 0
	}
	var sum int64
	for _, s := range slots {
		if s < 0 || s >= n {
			continue
		}
		sum += unit(total, n, ((s-offset)%n+n)%n)
	}
	return sum
}

// view is what a session's shares derive from at one time: the slots it
// holds of n, and the rotation epoch.
type view struct {
	from  time.Time // local time the view was first seen
	ok    bool      // false: the session holds nothing (not live yet, no parts count)
	ranks bool      // slots are the session's rank among the live sessions, not parts
	n     int
	slots []int
	epoch int64
}

func (v view) same(o view) bool {
	return v.ok == o.ok && v.ranks == o.ranks && v.n == o.n && v.epoch == o.epoch && slices.Equal(v.slots, o.slots)
}

// offset returns the rotating offset of a limit of total units in v.
func (v view) offset(total int64, salt uint64) int {
	if v.n <= 0 {
		return 0
	}
	off := salt % uint64(v.n)
	if total < int64(v.n) {
		off = (off + uint64(v.epoch)%uint64(v.n)) % uint64(v.n)
	}
	return int(off)
}

// queueShare returns the session's share of the queue's limit in v.
func (v view) queueShare(l claim.Limit) (inFlight int64, rate float64) {
	if !v.ok || v.n <= 0 {
		return 0, 0
	}
	if l.MaxInFlight > 0 {
		inFlight = spread(int64(l.MaxInFlight), v.n, v.slots, v.offset(int64(l.MaxInFlight), 0))
	}
	return inFlight, l.Rate * float64(len(v.slots)) / float64(v.n)
}

// tenantShare returns the session's share of a tenant's limit in v: the
// whole limit in parts mode (the tenant's part holds its items), a rank's
// share otherwise.
func (v view) tenantShare(l claim.Limit, salt uint64) (inFlight int64, rate float64) {
	if !v.ok || v.n <= 0 {
		return 0, 0
	}
	if !v.ranks {
		return int64(l.MaxInFlight), l.Rate
	}
	if l.MaxInFlight > 0 {
		inFlight = spread(int64(l.MaxInFlight), v.n, v.slots, v.offset(int64(l.MaxInFlight), salt))
	}
	return inFlight, l.Rate / float64(v.n)
}

// bucket is a token bucket.
type bucket struct {
	tokens float64
	last   time.Time
}

// fill adds the tokens of the time since the last fill at rate, up to
// capacity, and returns the tokens.
func (b *bucket) fill(now time.Time, rate, capacity float64) float64 {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens += rate * now.Sub(b.last).Seconds()
	}
	b.last = now
	b.tokens = min(b.tokens, capacity)
	return b.tokens
}

// wait returns how long a bucket holding tokens takes to hold one at rate.
func wait(tokens, rate float64) time.Duration {
	if rate <= 0 {
		return MaxDuration
	}
	d := time.Duration((1 - tokens) / rate * float64(time.Second))
	return max(d, time.Millisecond)
}

// tenantState is a session's count of one tenant's items.
type tenantState struct {
	inFlight int64
	bucket   bucket
	seen     time.Time
	salt     uint64
}

// limiter enforces one session's shares. Safe for concurrent use.
type limiter struct {
	opts LimitOptions

	mu       sync.Mutex
	lims     Limits
	loaded   bool
	readAt   time.Time     // local time of the last successful read
	fails    int64         // failed reads
	dbOffset time.Duration // database clock minus local clock
	parts    int           // the queue's number of parts (0: no parts)
	rank     view          // without parts: the session's rank view from the last refresh
	views    []view        // the views of the last Grace, oldest first
	cur      view          // the view of the last plan
	inFlight int64
	bucket   bucket
	tenants  map[string]*tenantState
	refused  int64
}

func newLimiter(opts LimitOptions) *limiter {
	return &limiter{opts: opts, tenants: map[string]*tenantState{}}
}

// set records limits read at local time now, with the database's clock
// reading dbNow (zero: unknown), and either the queue's number of parts
// (parts mode) or the session's rank of k live sessions (rank < 0: not
// live).
func (l *limiter) set(now time.Time, lims Limits, dbNow time.Time, parts, rank, k int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lims, l.loaded, l.parts, l.readAt = lims, true, parts, now
	if !dbNow.IsZero() {
		l.dbOffset = dbNow.Sub(now)
	}
	l.rank = view{ok: rank >= 0 && k > 0, ranks: true, n: k, slots: []int{rank}}
	for t, st := range l.tenants {
		if st.inFlight == 0 && now.Sub(st.seen) > tenantIdle {
			delete(l.tenants, t)
		}
	}
}

// quiet reports whether the last read of the limits succeeded and limits
// nothing: then the maintenance loop reads them again only when the
// queue's change marker moves, or every limitQuietRefresh.
func (l *limiter) quiet() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loaded && l.lims.none()
}

// confirm dates limits that limit nothing from at, a heartbeat that found
// the queue's change marker where it was at their read (so they are that
// recent, as far as writers of schema version 6 go): they do not become
// stale while nothing changes. Limits that limit something are dated by
// their reads alone.
func (l *limiter) confirm(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loaded && l.lims.none() && at.After(l.readAt) {
		l.readAt = at
	}
}

// failed counts a read of the limits (or of what the shares derive from)
// that failed.
func (l *limiter) failed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fails++
}

// staleLocked reports whether the limits last read are more than
// StaleAfter old at now.
func (l *limiter) staleLocked(now time.Time) bool {
	return l.loaded && now.Sub(l.readAt) > l.opts.StaleAfter
}

// epoch returns the rotation epoch at local time now, by the database clock.
func (l *limiter) epoch(now time.Time) int64 {
	return now.Add(l.dbOffset).UnixNano() / int64(l.opts.Rotate)
}

// observe records v as the view at now and keeps the views of the last
// Grace.
func (l *limiter) observe(now time.Time, v view) {
	v.from = now
	if n := len(l.views); n == 0 || !l.views[n-1].same(v) {
		l.views = append(l.views, v)
	}
	edge := now.Add(-l.opts.Grace)
	for len(l.views) >= 2 && !l.views[1].from.After(edge) {
		l.views = l.views[1:]
	}
	l.cur = v
}

// minShare returns the least of f over the views of the last Grace; zero if
// the first view is younger than Grace (the session is new).
func (l *limiter) minShare(now time.Time, f func(v view) (int64, float64)) (inFlight int64, rate float64) {
	if len(l.views) == 0 || l.views[0].from.After(now.Add(-l.opts.Grace)) {
		return 0, 0
	}
	inFlight, rate = math.MaxInt64, math.Inf(1)
	for _, v := range l.views {
		c, r := f(v)
		inFlight, rate = min(inFlight, c), min(rate, r)
	}
	return inFlight, rate
}

// plan is what a claim may take.
type plan struct {
	// n is the most items to claim.
	n int
	// skip are tenants to leave out of the claim.
	skip []string
	// full reports that the session is at its in-flight share: wait for an
	// item to end.
	full bool
	// wait, if positive, is how long until the rate allows another item.
	wait time.Duration
}

// plan returns what a claim with free slots may take at now. parts are the
// parts to claim in (parts mode; nil without parts).
func (l *limiter) plan(now time.Time, free int, parts []int) plan {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.loaded {
		return plan{full: true}
	}
	v := l.rank
	if l.parts > 0 {
		v = view{ok: true, n: l.parts, slots: slices.Clone(parts)}
	}
	v.epoch = l.epoch(now)
	l.observe(now, v)
	p := plan{n: free}
	if l.lims.none() {
		return p
	}
	if l.staleLocked(now) && (!l.lims.Queue.Unlimited() || !l.lims.Tenant.Unlimited()) {
		// Fail safe: the queue's limit, or the default tenant limit,
		// governs every item (and items of any tenant may come back).
		return plan{full: true}
	}
	q := l.lims.Queue
	share, rate := l.minShare(now, func(v view) (int64, float64) { return v.queueShare(q) })
	if q.MaxInFlight > 0 && int64(p.n) > share-l.inFlight {
		p.n, p.full = int(max(0, share-l.inFlight)), true
	}
	if q.Rate > 0 {
		tokens := l.bucket.fill(now, rate, max(1, rate*l.opts.Burst.Seconds()))
		if float64(p.n) > math.Floor(tokens) {
			p.n = int(math.Floor(tokens))
			// Claim again when the tokens left after this claim make one.
			p.wait = wait(tokens-float64(p.n), rate)
		}
	}
	if p.n == 0 {
		return p
	}
	for t, st := range l.tenants {
		if len(p.skip) == maxSkipTenants {
			break
		}
		if !l.tenantRoom(now, t, st) {
			p.skip = append(p.skip, t)
		}
	}
	for t, lim := range l.lims.Tenants {
		if len(p.skip) == maxSkipTenants {
			break
		}
		if _, known := l.tenants[t]; !known && !lim.Unlimited() {
			if !l.tenantRoom(now, t, l.tenant(t, now)) {
				p.skip = append(p.skip, t)
			}
		}
	}
	slices.Sort(p.skip)
	return p
}

// laneTenants returns the tenants whose items the urgent lane may take only
// from the session's own parts: every tenant's (all) when a default tenant
// limit applies, otherwise the tenants with a limit of their own. In parts
// mode the owner of a tenant's part enforces the tenant's whole limit
// (tenantShare), which holds only if no other session claims those items:
// the lane, which claims from any part, must leave them to the owner.
// Tenants with an explicit unlimited limit under a default one are kept to
// owned parts too (a harmless restriction).
func (l *limiter) laneTenants() (all bool, limited []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.lims.Tenant.Unlimited() {
		return true, nil
	}
	for t, lim := range l.lims.Tenants {
		if !lim.Unlimited() {
			limited = append(limited, t)
		}
	}
	slices.Sort(limited)
	return false, limited
}

// tenant returns tenant t's state, created if new.
func (l *limiter) tenant(t string, now time.Time) *tenantState {
	st := l.tenants[t]
	if st == nil {
		h := fnv.New64a()
		h.Write([]byte(t))
		st = &tenantState{salt: h.Sum64(), seen: now}
		l.tenants[t] = st
	}
	return st
}

// tenantRoom reports whether tenant t may have one more item now.
func (l *limiter) tenantRoom(now time.Time, t string, st *tenantState) bool {
	lim := l.lims.forTenant(t)
	if lim.Unlimited() {
		return true
	}
	if l.staleLocked(now) {
		return false // fail safe: nothing a stale limit governs
	}
	share, rate := l.minShare(now, func(v view) (int64, float64) { return v.tenantShare(lim, st.salt) })
	if lim.MaxInFlight > 0 && st.inFlight >= share {
		return false
	}
	if lim.Rate > 0 && st.bucket.fill(now, rate, max(1, rate*l.opts.Burst.Seconds())) < 1 {
		return false
	}
	return true
}

// admit counts an item a claim returned and reports whether it may run:
// false for an item of a tenant at its share, to be released at once.
func (l *limiter) admit(now time.Time, tenant string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if tenant != "" && !l.lims.forTenant(tenant).Unlimited() {
		st := l.tenant(tenant, now)
		st.seen = now
		if !l.tenantRoom(now, tenant, st) {
			l.refused++
			return false
		}
		st.inFlight++
		if l.lims.forTenant(tenant).Rate > 0 {
			st.bucket.tokens--
		}
	} else if tenant != "" {
		// Unlimited now; remembered in case a limit appears.
		l.tenant(tenant, now).seen = now
	}
	l.inFlight++
	if l.lims.Queue.Rate > 0 {
		l.bucket.tokens--
	}
	return true
}

// done counts the end of an admitted item.
func (l *limiter) done(tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	if st := l.tenants[tenant]; st != nil && st.inFlight > 0 {
		st.inFlight--
	}
}

// LimitStats are a worker's view of its queue's limits.
type LimitStats struct {
	// Limits are the limits last read (zero: none, or not read yet).
	Limits Limits
	// Share and RateShare are the session's current shares of the queue's
	// limits (0 with no limit).
	Share     int64
	RateShare float64
	// Refused counts items a claim returned for tenants at their share,
	// released without running.
	Refused int64
	// Stale reports that the limits were last read more than
	// LimitOptions.StaleAfter ago (re-reading them keeps failing): the
	// worker claims nothing they govern until a read succeeds.
	Stale bool
	// FailedReads counts the current session's failed reads of the
	// limits (and of the parts or members the shares derive from).
	FailedReads int64
}

// stats returns the limiter's figures at now.
func (l *limiter) stats(now time.Time) LimitStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.lims.Queue
	share, rate := l.minShare(now, func(v view) (int64, float64) { return v.queueShare(q) })
	if q.MaxInFlight == 0 {
		share = 0
	}
	if q.Rate == 0 {
		rate = 0
	}
	return LimitStats{Limits: l.lims, Share: share, RateShare: rate, Refused: l.refused, Stale: l.staleLocked(now), FailedReads: l.fails}
}
