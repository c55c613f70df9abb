package dashboard

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// historyLen is how many samples a queue's charts keep.
const historyLen = 90

// idleAfter is how long the sampler keeps sampling after the last page
// was served.
const idleAfter = time.Minute

// sampler reads the queues' figures, the sessions and the part owners
// every Refresh while someone watches, and keeps the last historyLen
// samples of each queue for the charts, and the rebalances it saw.
type sampler struct {
	h *handler

	mu      sync.Mutex
	running bool
	seen    time.Time // the last page served
	snap    *snapshot
	hist    map[string]*history
	fleet   []ratePoint      // the sessions' acks per second
	acked   map[string]int64 // by session, at the last round
	owners  map[partKey]uuid.UUID
	events  []rebalance   // the newest last
	ready   chan struct{} // closed at the first round's end
	readyOK bool
}

// snapshot is one round's reading.
type snapshot struct {
	At       time.Time
	Queues   []queueFigures
	Sessions []session.Info
	Owners   []claim.PartOwner
	Err      string
}

// queueFigures are one queue's figures and its history.
type queueFigures struct {
	store.QueueSummary
	// EndRate is the items ended per second since the previous round
	// (-1 while unknown). (Rate is the queue's limit.)
	EndRate float64
	// Rates and Backlogs are the history, oldest first.
	Rates    []float64
	Backlogs []float64
}

type history struct {
	rates, backlogs []float64
	last            time.Time
}

type ratePoint struct {
	At   time.Time
	Rate float64
}

type partKey struct {
	Queue string
	Part  int
}

// rebalance is a part that changed owner between two rounds.
type rebalance struct {
	At       time.Time
	Queue    string
	Part     int
	From, To uuid.UUID // uuid.Nil: nobody
}

func newSampler(h *handler) *sampler {
	return &sampler{h: h, hist: map[string]*history{}, acked: map[string]int64{}, ready: make(chan struct{})}
}

// current returns the last snapshot, starting the sampler if it is not
// running, and waiting for its first round (up to ctx's end).
func (s *sampler) current(ctx context.Context) *snapshot {
	s.mu.Lock()
	s.seen = time.Now()
	if !s.running {
		// (Re)started: the first page waits for a fresh round rather than
		// showing the reading of before the pause.
		s.running = true
		if s.readyOK {
			s.ready, s.readyOK = make(chan struct{}), false
		}
		go s.run()
	}
	ready := s.ready
	s.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap == nil {
		return &snapshot{Err: "the first reading of the queues has not finished"}
	}
	return s.snap
}

// refresh reads a round now if the sampler runs, so that the page shown
// after an action shows what it did.
func (s *sampler) refresh() {
	s.mu.Lock()
	running := s.running
	s.mu.Unlock()
	if running {
		s.round()
	}
}

// run samples every Refresh until nobody has watched for idleAfter. A
// round that takes long (many queues, a slow database) spaces the rounds
// out: the next one starts at least three times its duration after its
// end, so that the sampler keeps a connection busy a quarter of the time
// at most.
func (s *sampler) run() {
	for {
		start := time.Now()
		s.round()
		took := time.Since(start)
		time.Sleep(max(s.h.opts.Refresh-took, 3*took))
		s.mu.Lock()
		if time.Since(s.seen) > idleAfter {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// round reads once and stores the snapshot.
func (s *sampler) round() {
	ctx, cancel := context.WithTimeout(context.Background(), max(10*time.Second, 5*s.h.opts.Refresh))
	defer cancel()
	snap, err := s.read(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.snap != nil {
			old := *s.snap
			old.Err = err.Error()
			s.snap = &old
		} else {
			s.snap = &snapshot{At: time.Now(), Err: err.Error()}
		}
	} else {
		s.record(snap)
		s.snap = snap
	}
	if !s.readyOK {
		s.readyOK = true
		close(s.ready)
	}
}

// read reads the queues, their figures, the sessions and the owners.
func (s *sampler) read(ctx context.Context) (*snapshot, error) {
	h := s.h
	names, err := claim.Queues(ctx, h.db, h.opts.Tables)
	if err != nil {
		return nil, err
	}
	snap := &snapshot{At: time.Now()}
	s.mu.Lock()
	since := map[string]time.Time{}
	for n, hs := range s.hist {
		since[n] = hs.last
	}
	s.mu.Unlock()
	for _, n := range names {
		from, ok := since[n]
		if !ok {
			from = time.Now().Add(100 * 365 * 24 * time.Hour) // none: the first sample has no rate
		}
		var sum store.QueueSummary
		err := retry.Do(ctx, nil, func(ctx context.Context) error {
			var err error
			sum, err = h.store.QueueSummary(ctx, h.db, n, h.opts.CountCap, from)
			return store.Classify(err)
		})
		if err != nil {
			return nil, fmt.Errorf("reading the figures of %q: %w", n, err)
		}
		sum.Name = n
		snap.Queues = append(snap.Queues, queueFigures{QueueSummary: sum, EndRate: -1})
	}
	if snap.Sessions, err = session.List(ctx, h.db, h.opts.Tables); err != nil {
		return nil, err
	}
	if snap.Owners, err = claim.PartOwners(ctx, h.db, h.opts.Tables, ""); err != nil {
		return nil, err
	}
	return snap, nil
}

// record adds a round's snapshot to the history (with s.mu held): the
// queues' rates and backlogs, the fleet's rate, and the rebalances.
func (s *sampler) record(snap *snapshot) {
	live := map[string]bool{}
	for i := range snap.Queues {
		q := &snap.Queues[i]
		live[q.Name] = true
		hs := s.hist[q.Name]
		if hs == nil {
			hs = &history{}
			s.hist[q.Name] = hs
		} else if d := q.Now.Sub(hs.last).Seconds(); d > 0 {
			q.EndRate = float64(q.Ended) / d
			hs.rates = appendCapped(hs.rates, q.EndRate)
		}
		hs.last = q.Now
		hs.backlogs = appendCapped(hs.backlogs, float64(q.Unclaimed+q.Claimed))
		q.Rates = append([]float64(nil), hs.rates...)
		q.Backlogs = append([]float64(nil), hs.backlogs...)
	}
	for n := range s.hist {
		if !live[n] {
			delete(s.hist, n)
		}
	}
	// The fleet's rate, from the acks the sessions report with their
	// heartbeats (as crdbwork status --watch): a session counts from its
	// value at the previous round, 0 if it is new.
	var acked int64
	cur := map[string]int64{}
	for _, in := range snap.Sessions {
		id := in.ID.String()
		cur[id] = in.Reported.Acked
		if prev, ok := s.acked[id]; ok {
			acked += max(0, in.Reported.Acked-prev)
		} else if len(s.fleet) > 0 || s.snap != nil {
			acked += in.Reported.Acked
		}
	}
	if s.snap != nil {
		if d := snap.At.Sub(s.snap.At).Seconds(); d > 0 {
			s.fleet = append(s.fleet, ratePoint{At: snap.At, Rate: float64(acked) / d})
			if len(s.fleet) > historyLen {
				s.fleet = s.fleet[len(s.fleet)-historyLen:]
			}
		}
	}
	s.acked = cur
	// Rebalances: parts whose owner changed since the last round.
	owners := map[partKey]uuid.UUID{}
	for _, o := range snap.Owners {
		owners[partKey{o.Queue, o.Part}] = o.Session
	}
	if s.owners != nil {
		var moved []rebalance
		for k, to := range owners {
			if from := s.owners[k]; from != to {
				moved = append(moved, rebalance{At: snap.At, Queue: k.Queue, Part: k.Part, From: from, To: to})
			}
		}
		for k, from := range s.owners {
			if _, ok := owners[k]; !ok {
				moved = append(moved, rebalance{At: snap.At, Queue: k.Queue, Part: k.Part, From: from})
			}
		}
		sort.Slice(moved, func(i, j int) bool {
			if moved[i].Queue != moved[j].Queue {
				return moved[i].Queue < moved[j].Queue
			}
			return moved[i].Part < moved[j].Part
		})
		s.events = append(s.events, moved...)
		if len(s.events) > 200 {
			s.events = s.events[len(s.events)-200:]
		}
	}
	s.owners = owners
}

func appendCapped(xs []float64, x float64) []float64 {
	xs = append(xs, x)
	if len(xs) > historyLen {
		xs = xs[len(xs)-historyLen:]
	}
	return xs
}

// fleetRates returns the fleet's rate history.
func (s *sampler) fleetRates() []ratePoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ratePoint(nil), s.fleet...)
}

// rebalances returns the rebalances seen, the newest first.
func (s *sampler) rebalances() []rebalance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]rebalance, len(s.events))
	for i, e := range s.events {
		out[len(out)-1-i] = e
	}
	return out
}
