// Package metrics exposes crdbwork's counters to Prometheus: a Collector
// that users register with their registry.
//
// Three kinds of metrics come out of one Collector:
//
//   - counters of what this process did, read at scrape time from the Stats
//     snapshots of the workers and queues added with AddWorker and AddQueue:
//     items enqueued, claimed, acked, nacked, released, dead-lettered and
//     unblocked (waiting items released by their last prerequisite's ack),
//     claims lost, serialization-failure retries by statement, sessions
//     started and lost, parts acquired and released, handlers in flight,
//     checkpoints and progress reports saved, dead items pruned under the
//     queues' retention;
//   - histograms of handler durations (by kind and outcome) and of the
//     number of items per ack transaction, fed by the workers themselves:
//     pass the Collector as worker.Options.Observer (it is a
//     worker.KindObserver);
//   - gauges of the whole database, with Options.DB, read at scrape time and
//     cached for Options.CacheFor (so that many scrapers cost one read):
//     unclaimed and due items per queue and part, claimed items, dead items,
//     waiting items (enqueued with prerequisites not yet acked),
//     the age of the oldest due unclaimed item per queue, live sessions
//     and expired sessions not yet reaped, and with Options.BacklogByKind
//     unclaimed and due items per queue and kind:
//     one snapshot of the fleet, the read model crdbwork status and the
//     dashboard show too, of the first Options.MaxQueues queues by name.
//
// Every metric name starts with Options.Namespace ("crdbwork" by default).
//
// # Kinds
//
// The kind label (claim.NewItem.Kind; "" for items without one) is bounded,
// as kinds are whatever producers write: the handler histogram labels a run
// with its item's kind only when the worker's worker.Kinds registered a
// handler for it (worker.HandlerRun.Registered), and with OtherKind
// otherwise (an unknown kind, or any kind under a handler that is not a
// Kinds'); the gauges by kind list each queue's fleet.MaxKinds (20) kinds
// with the most unclaimed items, and the rest together as OtherKind.
package metrics

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/fleet"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Defaults for Options.
const (
	DefaultNamespace    = "crdbwork"
	DefaultCacheFor     = 5 * time.Second
	DefaultQueryTimeout = 3 * time.Second
	DefaultMaxQueues    = fleet.DefaultMaxQueues
)

// OtherKind is the kind label of what is not labelled by its own kind: the
// handler runs of kinds the worker did not register
// (worker.HandlerRun.MetricKind), and in the gauges by kind, a queue's
// items of the kinds beyond the MaxKinds with the most unclaimed items. It
// is not "" (the items without a kind), and no kind a program would
// register.
const OtherKind = worker.OtherKind

// MaxKinds is how many kinds of each queue the gauges by kind list on their
// own (the rest are OtherKind).
const MaxKinds = fleet.MaxKinds

// Options configure a Collector. The zero value is valid: the process's
// counters and histograms only, no database reads.
type Options struct {
	// Namespace prefixes every metric name. Default "crdbwork".
	Namespace string
	// DB, if not nil, is read at scrape time for the database gauges:
	// one snapshot of the fleet, the same read model as crdbwork status
	// and the dashboard (the figures and backlog by part of the first
	// MaxQueues queues by name, and the live sessions).
	DB claim.DB
	// Tables names the crdbwork tables read through DB.
	Tables crsql.Tables
	// CacheFor is how long one read of the database gauges is reused.
	// Default 5 s.
	CacheFor time.Duration
	// QueryTimeout bounds one read of the database gauges. Default 3 s.
	QueryTimeout time.Duration
	// MaxQueues bounds the queues the database gauges report: the first
	// MaxQueues by name. Default DefaultMaxQueues.
	MaxQueues int
	// BacklogByKind adds the gauges by kind (kind_backlog_items,
	// kind_backlog_due_items) to the database gauges, and their read: one
	// more statement per queue, which reads the queue's unclaimed, claimed
	// and dead items (the read of crdbwork status --by-kind). Off by
	// default: on a database of 90,000 items it made each snapshot about
	// half again as long, which a fleet that uses no kinds would pay for
	// nothing.
	BacklogByKind bool
	// HandlerBuckets are the buckets, in seconds, of the handler duration
	// histogram. Default: 1 ms to about 65 s, doubling.
	HandlerBuckets []float64
}

// Collector is a prometheus.Collector of crdbwork metrics; it is also a
// worker.Observer. Create it with New; it is safe for concurrent use.
type Collector struct {
	opts Options

	mu      sync.Mutex
	workers []*worker.Worker
	queues  []*claim.Queue

	counterDescs map[string]*prometheus.Desc
	retries      *prometheus.Desc
	inFlight     *prometheus.Desc

	handler  *prometheus.HistogramVec
	ackBatch *prometheus.HistogramVec

	unclaimed, vested, claimed, dead, oldest, sessions, dbUp *prometheus.Desc
	kindUnclaimed, kindVested                                *prometheus.Desc
	expired                                                  *prometheus.Desc
	waiting                                                  *prometheus.Desc
	dbErrors                                                 *prometheus.Desc

	dbMu       sync.Mutex
	dbReadAt   time.Time
	dbCached   []prometheus.Metric
	dbErrCount float64
	lastErr    error
	// fleet reads the database gauges (made at the first read).
	fleet *fleet.Reader
}

// LastDatabaseError returns the error of the last failed read of the
// database gauges (nil if none failed yet); crdbwork_database_up says
// whether the latest read failed.
func (c *Collector) LastDatabaseError() error {
	c.dbMu.Lock()
	defer c.dbMu.Unlock()
	return c.lastErr
}

var _ prometheus.Collector = (*Collector)(nil)
var _ worker.KindObserver = (*Collector)(nil)

// counterHelp are the process counters, by name (without the namespace).
var counterHelp = map[string]string{
	"items_enqueued_total":    "Items enqueued by this process.",
	"items_claimed_total":     "Items claimed by this process.",
	"items_acked_total":       "Items acknowledged by this process (committed acks only).",
	"items_nacked_total":      "Items nacked for a retry by this process.",
	"items_released_total":    "Items released without counting the attempt by this process.",
	"items_dead_total":        "Items moved to the dead-items table by this process.",
	"claims_lost_total":       "Acks, nacks and releases refused because the claim was gone.",
	"sessions_started_total":  "Sessions started by this process's workers.",
	"sessions_lost_total":     "Sessions of this process's workers that were lost.",
	"parts_acquired_total":    "Parts acquired by this process's workers.",
	"parts_released_total":    "Parts released by this process's workers.",
	"part_rebalances_total":   "Part rebalances run by this process's workers.",
	"handler_panics_total":    "Handler runs that panicked.",
	"handler_timeouts_total":  "Handler runs that outlived the item timeout.",
	"checkpoints_saved_total": "Checkpoints saved by this process's handlers (worker.SaveCheckpoint, claim.Queue.SaveCheckpoint).",
	"progress_reports_total":  "Progress reports saved by this process's handlers (worker.ReportProgress, claim.Queue.ReportProgress).",
	"dead_items_pruned_total": "Dead items this process's reapers deleted under their queue's retention.",
	// Cancel and snooze (docs/cancel-and-snooze.md).
	"items_cancelled_total":         "Items ended as cancelled by this process.",
	"items_cancelled_running_total": "Items ended as cancelled by this process whose handler was running when the cancel was asked for.",
	"items_snoozed_total":           "Snoozes by this process's handlers (items handed back with a delay, their attempt not counted).",
	"items_unblocked_total":         "Waiting items (enqueued with prerequisites) released into their queue by this process's acks and reaps.",
}

// New returns a Collector. Register it with a prometheus.Registerer, add the
// workers and queues to report on, and pass it as worker.Options.Observer for
// the histograms.
func New(opts Options) *Collector {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.CacheFor == 0 {
		opts.CacheFor = DefaultCacheFor
	}
	if opts.QueryTimeout == 0 {
		opts.QueryTimeout = DefaultQueryTimeout
	}
	if opts.MaxQueues <= 0 {
		opts.MaxQueues = DefaultMaxQueues
	}
	if opts.HandlerBuckets == nil {
		opts.HandlerBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)
	}
	ns := opts.Namespace
	name := func(n string) string { return prometheus.BuildFQName(ns, "", n) }
	c := &Collector{opts: opts, counterDescs: map[string]*prometheus.Desc{}}
	for n, help := range counterHelp {
		c.counterDescs[n] = prometheus.NewDesc(name(n), help, []string{"queue"}, nil)
	}
	c.retries = prometheus.NewDesc(name("retries_total"),
		"Serialization-failure retries by statement (enqueue, claim, ack, nack, release, cancel, requeue, parts).",
		[]string{"queue", "statement"}, nil)
	c.inFlight = prometheus.NewDesc(name("handlers_in_flight"), "Handlers running now.", []string{"queue"}, nil)
	c.handler = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "handler_duration_seconds",
		Help: "Duration of handler runs (the ack, nack or release after them not included), by item kind (those the worker registered; \"" + OtherKind +
			"\" for the others, \"\" for none) and outcome: acked, retried, dead, released, unsettled, dropped, snoozed, cancelled.",
		Buckets: opts.HandlerBuckets,
	}, []string{"queue", "kind", "outcome"})
	c.ackBatch = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "ack_batch_size",
		Help:    "Items per ack transaction (group commit).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11),
	}, []string{"queue"})
	c.unclaimed = prometheus.NewDesc(name("backlog_items"), "Unclaimed items in the database, by queue and part.", []string{"queue", "part"}, nil)
	c.vested = prometheus.NewDesc(name("backlog_due_items"), "Unclaimed items whose vesting time has come, by queue and part.", []string{"queue", "part"}, nil)
	c.kindUnclaimed = prometheus.NewDesc(name("kind_backlog_items"),
		"Unclaimed items in the database, by queue and kind (\"\" for none; the 20 kinds with the most, the rest as \""+OtherKind+"\").", []string{"queue", "kind"}, nil)
	c.kindVested = prometheus.NewDesc(name("kind_backlog_due_items"),
		"Unclaimed items whose vesting time has come, by queue and kind (as kind_backlog_items).", []string{"queue", "kind"}, nil)
	c.claimed = prometheus.NewDesc(name("claimed_items"), "Claimed items in the database, by queue.", []string{"queue"}, nil)
	c.dead = prometheus.NewDesc(name("dead_items"), "Items in the dead-items table, by queue.", []string{"queue"}, nil)
	c.waiting = prometheus.NewDesc(name("waiting_items"), "Items waiting for prerequisites (not yet claimable), by queue.", []string{"queue"}, nil)
	c.oldest = prometheus.NewDesc(name("oldest_unclaimed_age_seconds"),
		"Age of the oldest unclaimed item that is due (now minus its vesting time, by the database clock); 0 when none is due.",
		[]string{"queue"}, nil)
	c.sessions = prometheus.NewDesc(name("sessions_live"), "Live sessions in the database (all queues).", nil, nil)
	c.expired = prometheus.NewDesc(name("sessions_expired"),
		"Expired sessions in the database that no peer has reaped yet (their parts and claims wait for the reap).", nil, nil)
	c.dbUp = prometheus.NewDesc(name("database_up"), "1 if the last read of the database gauges succeeded, else 0.", nil, nil)
	c.dbErrors = prometheus.NewDesc(name("database_read_errors_total"), "Failed reads of the database gauges.", nil, nil)
	return c
}

// AddWorker reports w's counters (its queue's included) from now on.
func (c *Collector) AddWorker(w *worker.Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.workers = append(c.workers, w)
}

// AddQueue reports q's counters from now on. Do not add the queue of a
// worker added with AddWorker: its counters are already in the worker's.
func (c *Collector) AddQueue(q *claim.Queue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queues = append(c.queues, q)
}

// HandlerDone implements worker.Observer: a run without a kind (kind "").
// A worker calls KindHandlerDone instead.
func (c *Collector) HandlerDone(queue string, d time.Duration, outcome claim.Outcome) {
	c.handler.WithLabelValues(queue, "", outcome.String()).Observe(d.Seconds())
}

// KindHandlerDone implements worker.KindObserver: the run's kind labels it
// if the worker registered it (or it is "", none), OtherKind otherwise.
func (c *Collector) KindHandlerDone(run worker.HandlerRun) {
	c.handler.WithLabelValues(run.Queue, run.MetricKind(), run.Outcome.String()).Observe(run.Took.Seconds())
}

// AckBatch implements worker.Observer.
func (c *Collector) AckBatch(queue string, n int) {
	c.ackBatch.WithLabelValues(queue).Observe(float64(n))
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counterDescs {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.retries, c.inFlight} {
		ch <- d
	}
	c.handler.Describe(ch)
	c.ackBatch.Describe(ch)
	if c.opts.DB != nil {
		for _, d := range []*prometheus.Desc{c.unclaimed, c.vested, c.claimed, c.dead, c.waiting, c.oldest, c.sessions, c.expired, c.dbUp, c.dbErrors} {
			ch <- d
		}
		if c.opts.BacklogByKind {
			ch <- c.kindUnclaimed
			ch <- c.kindVested
		}
	}
}

// perQueue sums the counters of one queue's workers and queues.
type perQueue struct {
	counts   map[string]int64
	retries  map[string]int64
	inFlight int64
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectProcess(ch)
	c.handler.Collect(ch)
	c.ackBatch.Collect(ch)
	if c.opts.DB != nil {
		for _, m := range c.databaseMetrics() {
			ch <- m
		}
	}
}

func (c *Collector) collectProcess(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	workers := append([]*worker.Worker(nil), c.workers...)
	queues := append([]*claim.Queue(nil), c.queues...)
	c.mu.Unlock()
	byQueue := map[string]*perQueue{}
	get := func(q string) *perQueue {
		p := byQueue[q]
		if p == nil {
			p = &perQueue{counts: map[string]int64{}, retries: map[string]int64{}}
			byQueue[q] = p
		}
		return p
	}
	addClaim := func(p *perQueue, s claim.Stats) {
		p.counts["items_enqueued_total"] += s.Enqueued
		p.counts["items_claimed_total"] += s.Claimed
		p.counts["items_acked_total"] += s.Acked
		p.counts["items_nacked_total"] += s.Nacked
		p.counts["items_released_total"] += s.Released
		p.counts["items_dead_total"] += s.Dead
		p.counts["items_unblocked_total"] += s.Unblocked
		p.counts["claims_lost_total"] += s.LostClaims
		p.counts["checkpoints_saved_total"] += s.Checkpoints
		p.counts["progress_reports_total"] += s.ProgressReports
		p.counts["dead_items_pruned_total"] += s.DeadPruned
		p.counts["items_cancelled_total"] += s.Cancelled
		p.counts["items_cancelled_running_total"] += s.CancelledRunning
		p.counts["items_snoozed_total"] += s.Snoozed
		for k, v := range s.Retries {
			p.retries[k] += v
		}
	}
	for _, w := range workers {
		s := w.Stats()
		p := get(w.Queue().Name())
		addClaim(p, s.Stats)
		p.counts["sessions_started_total"] += s.Sessions
		p.counts["sessions_lost_total"] += s.SessionsLost
		p.counts["parts_acquired_total"] += s.Parts.Acquired
		p.counts["parts_released_total"] += s.Parts.Released
		p.counts["part_rebalances_total"] += s.Parts.Rebalances
		p.counts["handler_panics_total"] += s.Panics
		p.counts["handler_timeouts_total"] += s.Timeouts
		p.retries["parts"] += s.Parts.Retries
		p.inFlight += s.InFlight
	}
	for _, q := range queues {
		addClaim(get(q.Name()), q.Stats())
	}
	for q, p := range byQueue {
		for n, d := range c.counterDescs {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(p.counts[n]), q)
		}
		for k, v := range p.retries {
			ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(v), q, k)
		}
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(p.inFlight), q)
	}
}

// databaseMetrics returns the database gauges, read at most once per
// CacheFor.
func (c *Collector) databaseMetrics() []prometheus.Metric {
	c.dbMu.Lock()
	defer c.dbMu.Unlock()
	if !c.dbReadAt.IsZero() && time.Since(c.dbReadAt) < c.opts.CacheFor {
		return c.dbCached
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.QueryTimeout)
	defer cancel()
	ms, err := c.readDatabase(ctx)
	up := 1.0
	if err != nil {
		c.dbErrCount++
		up = 0
		c.lastErr = err
		ms = nil
	}
	ms = append(ms,
		prometheus.MustNewConstMetric(c.dbUp, prometheus.GaugeValue, up),
		prometheus.MustNewConstMetric(c.dbErrors, prometheus.CounterValue, c.dbErrCount))
	c.dbReadAt, c.dbCached = time.Now(), ms
	return ms
}

// readDatabase reads the database gauges from one snapshot of the fleet
// (package internal/fleet, as crdbwork status and the dashboard read it):
// every queue's figures, backlog by part and by kind, and the live
// sessions.
func (c *Collector) readDatabase(ctx context.Context) ([]prometheus.Metric, error) {
	if c.fleet == nil {
		r, err := fleet.New(c.opts.DB, c.opts.Tables)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		c.fleet = r
	}
	snap, err := c.fleet.Snapshot(ctx, fleet.Options{Parts: true, Kinds: c.opts.BacklogByKind, MaxQueues: c.opts.MaxQueues, Timeout: c.opts.QueryTimeout})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var ms []prometheus.Metric
	for _, q := range snap.Queues {
		name := q.Name
		// Every part of a queue with a stored part count is reported, 0
		// when empty, so that a drained queue shows 0 rather than no
		// series; a queue with dead items only has none.
		for _, p := range q.Parts {
			part := strconv.Itoa(p.Part)
			ms = append(ms,
				prometheus.MustNewConstMetric(c.unclaimed, prometheus.GaugeValue, float64(p.Unclaimed), name, part),
				prometheus.MustNewConstMetric(c.vested, prometheus.GaugeValue, float64(p.Due), name, part))
		}
		ms = c.kindMetrics(ms, &q)
		if q.Stored || q.HasItems() {
			ms = append(ms,
				prometheus.MustNewConstMetric(c.claimed, prometheus.GaugeValue, float64(q.Claimed), name),
				prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, q.OldestDue().Seconds(), name))
		}
		if q.Dead > 0 {
			ms = append(ms, prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(q.Dead), name))
		}
		if q.Stored || q.HasItems() || q.Waiting > 0 {
			ms = append(ms, prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(q.Waiting), name))
		}
	}
	ms = append(ms, prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(snap.LiveSessions)),
		prometheus.MustNewConstMetric(c.expired, prometheus.GaugeValue, float64(snap.ExpiredSessions)))
	return ms, nil
}

// kindMetrics appends q's gauges by kind to ms: each kind the read listed
// (fleet.MaxKinds at most, those with the most unclaimed items), and when
// the queue has more kinds, the rest as OtherKind: the queue's counts less
// those listed (read by another statement of the same snapshot, a moment
// apart: clipped at 0). A kind a producer named OtherKind is counted with
// the rest, so that it cannot make a second series of the same labels
// (which would fail the scrape).
func (c *Collector) kindMetrics(ms []prometheus.Metric, q *fleet.Queue) []prometheus.Metric {
	var unclaimed, due int64
	rest := q.MoreKinds
	for _, k := range q.Kinds {
		if k.Kind == OtherKind {
			rest = true
			continue
		}
		unclaimed, due = unclaimed+k.Unclaimed, due+k.Due
		ms = append(ms,
			prometheus.MustNewConstMetric(c.kindUnclaimed, prometheus.GaugeValue, float64(k.Unclaimed), q.Name, k.Kind),
			prometheus.MustNewConstMetric(c.kindVested, prometheus.GaugeValue, float64(k.Due), q.Name, k.Kind))
	}
	if rest {
		ms = append(ms,
			prometheus.MustNewConstMetric(c.kindUnclaimed, prometheus.GaugeValue, float64(max(0, q.Unclaimed-unclaimed)), q.Name, OtherKind),
			prometheus.MustNewConstMetric(c.kindVested, prometheus.GaugeValue, float64(max(0, q.Due-due)), q.Name, OtherKind))
	}
	return ms
}
