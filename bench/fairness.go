package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/claim"
)

// The fairness experiment (go -C bench run . fairness): many tenants with
// skewed backlogs share one queue, fair or plain, while small tenants'
// single items trickle in; it reports how long small tenants waited and how
// evenly the backlogged tenants were served. It was `demo run --tenants`.
//
// The tenant load: N tenants whose backlogs follow
// a Pareto distribution are enqueued up front (in random order, so that a
// plain queue serves each tenant in proportion to its backlog), and while
// the workers drain them a producer enqueues single items of random small
// tenants at --trickle-rate. The workers run in this process and note, for
// every item, when it was enqueued and when it was claimed (both by the
// database clock); the run then reports how long small tenants waited and
// how evenly the backlogged tenants were served.

// paretoShape is the shape of the backlogs' Pareto distribution: α = log4(5)
// ≈ 1.16 is the "80/20" one (a fifth of the tenants hold four fifths of
// the items).
const paretoShape = 1.16

// trickleUntil is the share of the up-front items claimed after which the
// trickle stops: its items arrive while there is a backlog to wait behind,
// and the run can end.
const trickleUntil = 0.8

// fairnessRounds is the length of a window of Jain's index, in rounds: a
// window starting with n backlogged tenants spans fairnessRounds·n claims.
const fairnessRounds = 4

// tenantLease is the claim lease of the tenant runs' workers: the claim
// time of an item is its lease end less this.
const tenantLease = 2 * time.Minute

// tenantConfig are the fairness experiment's own flags.
type tenantConfig struct {
	tenants     int
	fair        bool
	trickleRate int
	seed        int
}

// tenantLoad is one run's tenant load and what its workers saw.
type tenantLoad struct {
	cfg     tenantConfig
	names   []string       // tenant i's name
	index   map[string]int // name → i
	backlog []int          // tenant i's up-front items
	small   []int          // the small tenants: backlog at most the median
	isSmall []bool
	upfront int

	mu       sync.Mutex
	seen     map[uuid.UUID]bool
	claims   []tenantClaim
	upClaims int // up-front items among claims
	trickled int

	stop chan struct{}
	done chan struct{}
}

// tenantClaim is one item's first claim, as its handler saw it.
type tenantClaim struct {
	tenant   int
	trickle  bool
	enqueued time.Time // database clock
	claimed  time.Time // database clock: the lease's end less the lease
	turn     time.Time // the item's place in claim order (ties within a claim)
}

// newTenantLoad draws the backlogs of items items over cfg.tenants tenants.
func newTenantLoad(cfg tenantConfig, items int) *tenantLoad {
	rng := rand.New(rand.NewPCG(uint64(cfg.seed), 0x7e4a))
	l := &tenantLoad{cfg: cfg, index: map[string]int{}, seen: map[uuid.UUID]bool{}, upfront: items}
	n := cfg.tenants
	l.backlog = paretoBacklogs(rng, n, items)
	for i := range n {
		name := fmt.Sprintf("tenant-%04d", i)
		l.names = append(l.names, name)
		l.index[name] = i
	}
	sorted := append([]int(nil), l.backlog...)
	sort.Ints(sorted)
	median := sorted[(n-1)/2]
	l.isSmall = make([]bool, n)
	for i, b := range l.backlog {
		if b <= median {
			l.small = append(l.small, i)
			l.isSmall[i] = true
		}
	}
	return l
}

// paretoBacklogs returns n backlogs adding up to items (each at least 1),
// proportional to Pareto(1, paretoShape) draws: one item each, and the rest
// shared in proportion to the draws (largest remainders round up).
func paretoBacklogs(rng *rand.Rand, n, items int) []int {
	draws := make([]float64, n)
	var sum float64
	for i := range draws {
		draws[i] = math.Pow(1-rng.Float64(), -1/paretoShape) // 1 - U is in (0, 1]
		sum += draws[i]
	}
	rest := items - n
	backlog := make([]int, n)
	frac := make([]int, n)
	given := 0
	rems := make([]float64, n)
	for i, d := range draws {
		share := d / sum * float64(rest)
		backlog[i] = 1 + int(share)
		given += int(share)
		rems[i] = share - math.Floor(share)
		frac[i] = i
	}
	sort.SliceStable(frac, func(a, b int) bool { return rems[frac[a]] > rems[frac[b]] })
	for k := 0; given < rest; k++ {
		backlog[frac[k%n]]++
		given++
	}
	return backlog
}

// enqueue enqueues the up-front items, every tenant's backlog shuffled
// together.
func (l *tenantLoad) enqueue(ctx context.Context, q *claim.Queue) error {
	order := make([]int, 0, l.upfront)
	for i, b := range l.backlog {
		for range b {
			order = append(order, i)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(l.cfg.seed), 0x5ca1))
	rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
	items := make([]claim.NewItem, len(order))
	for k, t := range order {
		items[k] = claim.NewItem{Payload: []byte(strconv.Itoa(k)), Tenant: l.names[t]}
	}
	return enqueueChunks(ctx, q, items)
}

// trickle marks the trickle's payloads.
const trickle = "trickle"

// observe is the workers' claim hook: it notes the item's first claim.
func (l *tenantLoad) observe(it claim.Item) {
	t, ok := l.index[it.Tenant]
	if !ok {
		return
	}
	c := tenantClaim{tenant: t, trickle: string(it.Payload) == trickle, enqueued: it.EnqueuedAt,
		claimed: it.LeaseUntil.Add(-tenantLease), turn: it.TurnAt}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[it.ID] {
		return
	}
	l.seen[it.ID] = true
	l.claims = append(l.claims, c)
	if !c.trickle {
		l.upClaims++
	}
}

// trickleInFlight bounds the trickle's enqueues in flight: the trickle is
// an open loop (an item every 1/rate, however long enqueues take), as
// independent producers are, unless enqueues fall this far behind.
const trickleInFlight = 16

// startTrickle starts the producer of single small-tenant items: one at
// once, then one every 1/rate, each in its own goroutine, until
// trickleUntil of the up-front items are claimed or stopTrickle. It has a
// pool of its own, of trickleInFlight connections, so that its enqueues
// never wait for the run's other statements nor hold them up.
func (l *tenantLoad) startTrickle(ctx context.Context, url string, errOut io.Writer) error {
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	if l.cfg.trickleRate == 0 || len(l.small) == 0 {
		close(l.done)
		return nil
	}
	pool, err := openPool(ctx, url, trickleInFlight, "bench-trickle")
	if err != nil {
		close(l.done)
		return err
	}
	q, err := claim.New(pool, claim.Options{Queue: expQueue})
	if err == nil {
		// The first call checks the schema through the pool: not inside
		// an enqueue's transaction, which holds a connection of it.
		_, err = q.Settings(ctx)
	}
	if err != nil {
		pool.Close()
		close(l.done)
		return fmt.Errorf("starting the trickle: %w", err)
	}
	go func() {
		var wg sync.WaitGroup
		defer func() { wg.Wait(); pool.Close(); close(l.done) }()
		slots := make(chan struct{}, trickleInFlight)
		failed := make(chan struct{})
		var once sync.Once
		rng := rand.New(rand.NewPCG(uint64(l.cfg.seed), 0x71c1e))
		tick := time.NewTicker(time.Second / time.Duration(l.cfg.trickleRate))
		defer tick.Stop()
		for {
			l.mu.Lock()
			claimed := l.upClaims
			l.mu.Unlock()
			if float64(claimed) >= trickleUntil*float64(l.upfront) {
				return
			}
			select {
			case slots <- struct{}{}:
				tenant := l.small[rng.IntN(len(l.small))]
				it := claim.NewItem{Payload: []byte(trickle), Tenant: l.names[tenant]}
				wg.Add(1)
				go func() {
					defer func() { <-slots; wg.Done() }()
					if _, err := q.Enqueue(ctx, it); err != nil {
						if ctx.Err() == nil {
							once.Do(func() { fmt.Fprintf(errOut, "bench: trickle: %v\n", err); close(failed) })
						}
						return
					}
					l.mu.Lock()
					l.trickled++
					l.mu.Unlock()
				}()
			default: // enqueues are trickleInFlight behind: skip this tick
			}
			select {
			case <-ctx.Done():
				return
			case <-l.stop:
				return
			case <-failed:
				return
			case <-tick.C:
			}
		}
	}()
	return nil
}

// stopTrickle stops the producer, waits for it and returns the items it
// enqueued.
func (l *tenantLoad) stopTrickle() int {
	if l.stop != nil {
		close(l.stop)
		<-l.done
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.trickled
}

// TenantReport is what the fairness experiment measured; its fields join
// the run's JSON summary.
type TenantReport struct {
	Tenants      int  `json:"tenants"`
	Fair         bool `json:"fair"`
	SmallTenants int  `json:"small_tenants"` // backlog at most the median
	TrickleItems int  `json:"trickle_items"`
	Observed     int  `json:"observed_claims"` // items whose claim the workers noted
	// TenantFairness is Jain's index of the service of the backlogged
	// tenants (see jain), and FairnessWindows the windows it averages.
	TenantFairness  float64 `json:"tenant_fairness"`
	FairnessWindows int     `json:"tenant_fairness_windows"`
	// Waits from enqueue to claim, in seconds by the database clock, of the
	// small tenants' items (their up-front items and the trickle), of the
	// trickle alone and of every item.
	SmallMedianWait   float64 `json:"small_tenant_median_wait_seconds"`
	SmallP99Wait      float64 `json:"small_tenant_p99_wait_seconds"`
	TrickleMedianWait float64 `json:"trickle_median_wait_seconds"`
	TrickleP99Wait    float64 `json:"trickle_p99_wait_seconds"`
	AllMedianWait     float64 `json:"all_median_wait_seconds"`
	AllP99Wait        float64 `json:"all_p99_wait_seconds"`
	// The same waits counted in claims: how many other items were claimed
	// between the item's enqueue and its claim (independent of the
	// machine's speed).
	SmallMedianWaitClaims   int `json:"small_tenant_median_wait_claims"`
	SmallP99WaitClaims      int `json:"small_tenant_p99_wait_claims"`
	TrickleMedianWaitClaims int `json:"trickle_median_wait_claims"`
	TrickleP99WaitClaims    int `json:"trickle_p99_wait_claims"`
	// Newcomers are the trickle items whose tenant had nothing else
	// queued when they were enqueued (the others wait behind their own
	// tenant's items): in a fair queue they wait about one round.
	NewcomerItems            int     `json:"newcomer_items"`
	NewcomerMedianWait       float64 `json:"newcomer_median_wait_seconds"`
	NewcomerP99Wait          float64 `json:"newcomer_p99_wait_seconds"`
	NewcomerMedianWaitClaims int     `json:"newcomer_median_wait_claims"`
	NewcomerP99WaitClaims    int     `json:"newcomer_p99_wait_claims"`
}

// report computes the run's figures from the claims the workers noted.
func (l *tenantLoad) report() *TenantReport {
	l.mu.Lock()
	claims := append([]tenantClaim(nil), l.claims...)
	r := &TenantReport{Tenants: l.cfg.tenants, Fair: l.cfg.fair, SmallTenants: len(l.small), TrickleItems: l.trickled, Observed: len(claims)}
	l.mu.Unlock()
	// Claim order: claim time, then the claim's own order (turn).
	sort.SliceStable(claims, func(i, j int) bool {
		if !claims[i].claimed.Equal(claims[j].claimed) {
			return claims[i].claimed.Before(claims[j].claimed)
		}
		return claims[i].turn.Before(claims[j].turn)
	})
	times := make([]time.Time, len(claims))
	for i, c := range claims {
		times[i] = c.claimed
	}
	// A trickle item is a newcomer's if no other item of its tenant was
	// enqueued before it and claimed after it was enqueued.
	byTenant := map[int][]tenantClaim{}
	for _, c := range claims {
		byTenant[c.tenant] = append(byTenant[c.tenant], c)
	}
	newcomer := func(c tenantClaim) bool {
		for _, o := range byTenant[c.tenant] {
			if o != c && o.enqueued.Before(c.enqueued) && o.claimed.After(c.enqueued) {
				return false
			}
		}
		return true
	}
	var small, trick, fresh, all []float64
	var smallN, trickN, freshN []int
	for i, c := range claims {
		w := max(c.claimed.Sub(c.enqueued).Seconds(), 0)
		// Claims made after the item's enqueue, before its own.
		before := sort.Search(len(times), func(k int) bool { return times[k].After(c.enqueued) })
		n := max(i-before, 0)
		all = append(all, w)
		if c.trickle || l.isSmall[c.tenant] {
			small, smallN = append(small, w), append(smallN, n)
		}
		if c.trickle {
			trick, trickN = append(trick, w), append(trickN, n)
			if newcomer(c) {
				fresh, freshN = append(fresh, w), append(freshN, n)
			}
		}
	}
	r.SmallMedianWait, r.SmallP99Wait = quantile(small, 0.5), quantile(small, 0.99)
	r.TrickleMedianWait, r.TrickleP99Wait = quantile(trick, 0.5), quantile(trick, 0.99)
	r.AllMedianWait, r.AllP99Wait = quantile(all, 0.5), quantile(all, 0.99)
	r.NewcomerItems = len(fresh)
	r.NewcomerMedianWait, r.NewcomerP99Wait = quantile(fresh, 0.5), quantile(fresh, 0.99)
	r.NewcomerMedianWaitClaims, r.NewcomerP99WaitClaims = quantileInt(freshN, 0.5), quantileInt(freshN, 0.99)
	r.SmallMedianWaitClaims, r.SmallP99WaitClaims = quantileInt(smallN, 0.5), quantileInt(smallN, 0.99)
	r.TrickleMedianWaitClaims, r.TrickleP99WaitClaims = quantileInt(trickN, 0.5), quantileInt(trickN, 0.99)
	var served []int
	for _, c := range claims {
		if !c.trickle {
			served = append(served, c.tenant)
		}
	}
	r.TenantFairness, r.FairnessWindows = jain(served, l.cfg.tenants)
	return r
}

// jain returns Jain's fairness index of the service of backlogged tenants,
// averaged over windows, and the number of windows. served lists the
// tenant of every up-front item in claim order; all of them were enqueued
// before the first claim, so a tenant is backlogged from the start until
// its last item is claimed. A window starting at claim s, when n tenants
// are still backlogged, spans the next fairnessRounds·n claims; the tenants
// backlogged throughout it (an item of theirs is claimed after it) each
// got x_t of its claims, and the window's index is (Σx)² / (m·Σx²) over
// those m tenants: 1 when each got the same, 1/m when one got them all.
// The run's index is the windows' average weighted by their claims.
// Windows with fewer than two such tenants say nothing and are skipped;
// so is the last, partial window.
func jain(served []int, tenants int) (float64, int) {
	last := make([]int, tenants)
	for i := range last {
		last[i] = -1
	}
	for i, t := range served {
		last[t] = i
	}
	lasts := append([]int(nil), last...)
	sort.Ints(lasts)
	x := make([]float64, tenants)
	var sum, weight float64
	windows := 0
	for s := 0; s < len(served); {
		n := len(lasts) - sort.SearchInts(lasts, s) // backlogged at s
		w := fairnessRounds * n
		e := s + w
		if n < 2 || e > len(served) {
			break
		}
		for _, t := range served[s:e] {
			x[t]++
		}
		var m, sx, sx2 float64
		for t := range tenants {
			if last[t] >= e {
				m++
				sx += x[t]
				sx2 += x[t] * x[t]
			}
		}
		for _, t := range served[s:e] {
			x[t] = 0
		}
		if m >= 2 && sx2 > 0 {
			sum += sx * sx / (m * sx2) * float64(w)
			weight += float64(w)
			windows++
		}
		s = e
	}
	if weight == 0 {
		return 0, 0
	}
	return sum / weight, windows
}

// quantile returns the q-quantile of v (nearest rank; 0 if v is empty).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[rank(len(s), q)]
}

func quantileInt(v []int, q float64) int {
	if len(v) == 0 {
		return 0
	}
	s := append([]int(nil), v...)
	sort.Ints(s)
	return s[rank(len(s), q)]
}

// rank is the 0-based nearest rank of the q-quantile of n values.
func rank(n int, q float64) int {
	return min(max(int(math.Ceil(q*float64(n)))-1, 0), n-1)
}

// fairnessResult is the fairness experiment's JSON line.
type fairnessResult struct {
	expOutcome
	*TenantReport
}

// fairness runs the fairness experiment.
func fairness(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("fairness", out)
	var c expConfig
	c.register(fs, 10_000)
	var tc tenantConfig
	fs.IntVar(&tc.tenants, "tenants", 100, "tenants the --items are spread over, with Pareto-distributed backlogs")
	fs.BoolVar(&tc.fair, "fair", true, "make the queue fair (claims take the backlogged tenants' items in turn); --fair=false: a plain first-in-first-out queue")
	fs.IntVar(&tc.trickleRate, "trickle-rate", 50, "single items of random small tenants enqueued per second while the workers run, until 80% of the up-front items are claimed (0: none)")
	fs.IntVar(&tc.seed, "seed", 1, "seed of the backlog sizes, the enqueue order and the trickle's tenants")
	fs.BoolVar(&c.anyPart, "any-part", false, "the workers claim in any part (no part ownership) instead of their own parts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("fairness: unexpected argument %q", fs.Arg(0))
	}
	if err := c.validate(); err != nil {
		return err
	}
	switch {
	case tc.tenants < 1 || tc.tenants > 1_000_000:
		return fmt.Errorf("--tenants %d: must be between 1 and 1000000", tc.tenants)
	case c.items < tc.tenants:
		return fmt.Errorf("--items %d is fewer than --tenants %d: every tenant needs at least one item", c.items, tc.tenants)
	case tc.trickleRate < 0 || tc.trickleRate > 10_000:
		return fmt.Errorf("--trickle-rate %d: must be between 0 and 10000", tc.trickleRate)
	case tc.seed < 0:
		return fmt.Errorf("--seed %d: must not be negative", tc.seed)
	}
	l := newTenantLoad(tc, c.items)
	c.observe, c.lease = l.observe, tenantLease
	o, err := runExperiment(ctx, &c, expHooks{
		setup: func(ctx context.Context, q *claim.Queue) error {
			st, err := q.Settings(ctx)
			if err != nil {
				return err
			}
			st.Fair = tc.fair
			return q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &st.Policy})
		},
		enqueue: func(ctx context.Context, _ *pgxpool.Pool, q *claim.Queue) (int, error) {
			return c.items, l.enqueue(ctx, q)
		},
		started: func(ctx context.Context, url string) (func() int, error) {
			if err := l.startTrickle(ctx, url, out); err != nil {
				return nil, err
			}
			return l.stopTrickle, nil
		},
	}, out)
	if err != nil {
		return err
	}
	r := fairnessResult{o, l.report()}
	if c.json {
		return printJSON(out, r)
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	printOutcome(tw, o)
	printTenantLines(tw, r.TenantReport)
	tw.Flush()
	_, err = io.WriteString(out, b.String())
	return err
}

// printTenantLines writes the tenant figures.
func printTenantLines(tw *tabwriter.Writer, r *TenantReport) {
	mode := "fair"
	if !r.Fair {
		mode = "plain (first in, first out)"
	}
	fmt.Fprintf(tw, "  tenants\t%d, %s queue; %d small (backlog at most the median), %d trickle items\n", r.Tenants, mode, r.SmallTenants, r.TrickleItems)
	fmt.Fprintf(tw, "  small tenants' wait\tmedian %s, p99 %s (in claims: median %d, p99 %d)\n",
		secs(r.SmallMedianWait), secs(r.SmallP99Wait), r.SmallMedianWaitClaims, r.SmallP99WaitClaims)
	fmt.Fprintf(tw, "  trickle's wait\tmedian %s, p99 %s (in claims: median %d, p99 %d)\n",
		secs(r.TrickleMedianWait), secs(r.TrickleP99Wait), r.TrickleMedianWaitClaims, r.TrickleP99WaitClaims)
	fmt.Fprintf(tw, "  newcomers' wait\tmedian %s, p99 %s (in claims: median %d, p99 %d; %d trickle items of tenants with nothing else queued)\n",
		secs(r.NewcomerMedianWait), secs(r.NewcomerP99Wait), r.NewcomerMedianWaitClaims, r.NewcomerP99WaitClaims, r.NewcomerItems)
	fmt.Fprintf(tw, "  every item's wait\tmedian %s, p99 %s\n", secs(r.AllMedianWait), secs(r.AllP99Wait))
	fmt.Fprintf(tw, "  tenant fairness\t%.3f (Jain's index of backlogged tenants' service, %d windows)\n", r.TenantFairness, r.FairnessWindows)
}

// secs formats seconds as a rounded duration.
func secs(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d
}
