package claim

import (
	"context"
	"math"
	"sync"
	"time"

	crsql "github.com/crdbwork/crdbwork/sql"
)

// Spreading a fair queue's tenants over the parts.
//
// With parts, each session claims in its own parts only, in turn order. If
// a tenant's items all sat in one part (the tenant fixing the part as a key
// does), a session whose parts hold few backlogged tenants would go through
// its turns faster than one whose parts hold many, and its tenants would get
// more than their share: fair within each session, not across the fleet.
// So in a fair queue, enqueue spreads a tenant's items without a key over
// the parts by their turns: the item with turn t goes to part (h + t·s) mod
// parts, where h is the tenant's hash, t counts microseconds and s is
// spreadStride, so a tenant's consecutive turns (1 µs apart) land in parts
// far apart, and any `parts` consecutive turns in all of them. Every
// part then holds about 1/parts of each backlogged tenant's items, in the
// same turn order as the queue, and sessions that are at the same place in
// turn order serve all backlogged tenants evenly, whatever the size of
// their claims (the worker's fair pacing keeps parts-mode sessions near one
// another). No row is shared and nothing is locked: the part is a function
// of the item's own turn.
//
// Tenant limits in parts mode are enforced by the owner of the tenant's
// part, which must then see all of the tenant's items (worker.Limits). So
// the items of a tenant that has a limit when it enqueues (its own, or the
// queue's default tenant limit) keep the tenant's part, as in a plain
// queue. The limits are read with the queue's settings at most every
// spreadTTL per Queue.

// spreadTTL is how long a fair queue's tenant limits, once read, decide
// which tenants enqueue spreads.
const spreadTTL = time.Second

// spreadCache holds the tenant limits that decide which tenants' items a
// fair enqueue spreads over the parts.
type spreadCache struct {
	mu   sync.Mutex
	read time.Time
	// fair: the queue is fair; all: a default tenant limit applies, so no
	// tenant is spread; limited: the tenants with a limit of their own.
	fair    bool
	all     bool
	limited map[string]bool
}

// spreads returns whether the items of tenants without a key are spread
// over the parts (false for every tenant if the queue is not fair, as last
// read, or a default tenant limit applies)
// and the tenants that keep their part, read through db at most every
// spreadTTL.
func (q *Queue) spreads(ctx context.Context, db crsql.DB) (bool, map[string]bool, error) {
	c := &q.spread
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := q.readSpread(ctx, db); err != nil {
		return false, nil, err
	}
	return c.fair && !c.all, c.limited, nil
}

// readSpread reads the queue's fair setting and tenant limits into
// q.spread, at most every spreadTTL; the caller holds q.spread.mu.
func (q *Queue) readSpread(ctx context.Context, db crsql.DB) error {
	c := &q.spread
	if !c.read.IsZero() && time.Since(c.read) < spreadTTL {
		return nil
	}
	r, stored, err := q.store.QueueSettings(ctx, db, q.opts.Queue)
	if err != nil {
		return err
	}
	fair := stored && r.Fair
	all := fair && (r.TenantMaxInFlight > 0 || r.TenantRate > 0)
	var limited map[string]bool
	if fair && !all { // a queue that is not fair spreads nothing: no limits to read
		rows, err := q.store.QueueTenantLimits(ctx, db, q.opts.Queue)
		if err != nil {
			return err
		}
		for _, row := range rows {
			if row.MaxInFlight > 0 || row.Rate > 0 {
				if limited == nil {
					limited = map[string]bool{}
				}
				limited[row.Tenant] = true
			}
		}
	}
	c.read, c.fair, c.all, c.limited = time.Now(), fair, all, limited
	return nil
}

// A claim over several parts of a fair queue reads each part up to its
// share of the claim, not up to the whole claim.
//
// The per-part claim reads every owned part in (priority, turn_at) order
// and keeps the best n of what it read (crsql's partClaimStatements). Read
// up to n from each of k parts, it reads (and on CockroachDB locks) up to k·n
// rows to hand out n, and a fair queue's rows, taken in turn order, lie on
// as many heap pages as rows.
// In a fair queue whose tenants' items are spread over the parts by turn,
// every part holds an even share of the turns, so the best n across k parts
// are about n/k of each: the claim reads each part up to partShare(n, k),
// half as much again as that, and locks about 1.5·n rows. A part that holds
// more of the best items than its share (a tenant with a limit keeps its
// part, keyed items keep theirs) gives its share, and the claim then reads
// the parts that gave their whole share again for the rest (claimWith), so a
// claim still comes back short only when the parts hold fewer claimable
// items. The order across parts is then relaxed within one claim: a part's
// items past its share wait for the claim that follows, as items of parts
// other sessions own always do.
func partShare(n, k int) int {
	return (3*n + 2*k - 1) / (2 * k) // ⌈1.5·n/k⌉
}

// claimShare returns how many items a claim of n items over k parts reads
// from each part (see partShare), or 0 for n from each: in a queue that is
// not fair, in one whose tenants are not spread (a default tenant limit),
// with one part, or when the settings cannot be read.
func (q *Queue) claimShare(ctx context.Context, n, k int) int {
	if k < 2 {
		return 0
	}
	c := &q.spread
	c.mu.Lock()
	err := q.readSpread(ctx, q.db)
	spread := c.fair && !c.all
	c.mu.Unlock()
	if err != nil || !spread {
		return 0
	}
	if share := partShare(n, k); share < n {
		return share
	}
	return 0
}

// spreadStride is the step, in key hash, between a tenant's consecutive
// turns: a prime (so coprime with any number of parts up to it: a tenant's
// P consecutive turns land in P different parts) whose residues modulo the
// usual numbers of parts are near the golden section of the parts (5 of
// 16, 5 of 8, 21 of 32 and of 64, 13 of 24), so that consecutive turns land
// far apart. Sessions own runs of neighbouring parts (partition.Sticky and
// Contiguous); with a step of 1, a session's parts would hold a tenant's
// items in bursts of consecutive turns followed by long gaps, and the
// session's claims of a few rounds would serve some tenants several times
// and others not at all. With 16 parts in four runs of four, any four
// consecutive turns of a tenant land in all four runs.
const spreadStride = 1_986_133

// spreadHash is the key hash of a tenant's item without a key stamped with
// turn in a fair queue: the part is the hash modulo the queue's parts, so
// the tenant's consecutive turns go to parts spreadStride apart (modulo the
// parts).
func spreadHash(tenant string, turn time.Time) int64 {
	return int64((keyHash("", tenant) + uint64(turn.UnixMicro())*spreadStride) & math.MaxInt64)
}

// forget drops the cached limits: the next fair enqueue reads them again.
func (c *spreadCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = time.Time{}
}
