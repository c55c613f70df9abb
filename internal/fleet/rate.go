package fleet

import (
	"time"

	"github.com/google/uuid"
)

// AckRate is the fleet's throughput: the items acked per second over the
// last Window, from the counters that sessions report with their
// heartbeats (no row is written per ack). crdbwork status --watch and the
// dashboard's fleet chart read it. The zero value measures between the
// last two samples; it is not safe for concurrent use.
type AckRate struct {
	// Window is how far back the rate looks: the oldest sample kept is
	// the newest one at least Window old. 0: the previous sample.
	Window  time.Duration
	samples []ackSample
}

type ackSample struct {
	at    time.Time
	acked map[uuid.UUID]int64
}

// Add records the counters of the sessions read at now and returns the
// rate over the window, or -1 while there is no earlier sample. Each
// session seen in the window counts from its value in the window's first
// sample (0 if it started since) to the last value it reported, so a
// session that ended (killed, or stopped) keeps the work it did.
func (r *AckRate) Add(now time.Time, sessions []Session) float64 {
	cur := ackSample{at: now, acked: map[uuid.UUID]int64{}}
	for _, s := range sessions {
		cur.acked[s.ID] = s.Reported.Acked
	}
	r.samples = append(r.samples, cur)
	for len(r.samples) > 2 && now.Sub(r.samples[1].at) >= r.Window {
		r.samples = r.samples[1:]
	}
	if len(r.samples) < 2 {
		return -1
	}
	first := r.samples[0]
	last := map[uuid.UUID]int64{}
	for _, smp := range r.samples {
		for id, n := range smp.acked {
			last[id] = n
		}
	}
	var done int64
	for id, n := range last {
		done += n - first.acked[id]
	}
	d := now.Sub(first.at).Seconds()
	if d <= 0 || done < 0 {
		return -1
	}
	return float64(done) / d
}

// Span is the time the rate covers: from the window's first sample to the
// last (0 before two samples).
func (r *AckRate) Span() time.Duration {
	if len(r.samples) < 2 {
		return 0
	}
	return r.samples[len(r.samples)-1].at.Sub(r.samples[0].at)
}
