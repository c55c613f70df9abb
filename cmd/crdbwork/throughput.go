package main

import (
	"fmt"
	"time"
)

// throughputWindow is how far back status --watch looks for its rate.
const throughputWindow = 10 * time.Second

// throughput computes the items acked per second over the last
// throughputWindow from the counters that sessions report with their
// heartbeats: no counter row is written per ack.
type throughput struct {
	samples []sample
}

type sample struct {
	at    time.Time
	acked map[string]int64 // by session id
}

// add records the counters of the sessions read at now and returns the rate over the
// window, or -1 while there is no earlier sample.
func (t *throughput) add(now time.Time, sessions []sessionStatus) float64 {
	cur := sample{at: now, acked: map[string]int64{}}
	for _, ss := range sessions {
		cur.acked[ss.ID] = ss.Acked
	}
	t.samples = append(t.samples, cur)
	// Keep the newest sample at least a window old, and the ones after it.
	for len(t.samples) > 2 && now.Sub(t.samples[1].at) >= throughputWindow {
		t.samples = t.samples[1:]
	}
	if len(t.samples) < 2 {
		return -1
	}
	// Each session seen in the window counts from its value in the first
	// sample (0 if it started since) to the last value it reported, so a
	// session that ended (killed, or stopped) keeps the work it did.
	first := t.samples[0]
	last := map[string]int64{}
	for _, smp := range t.samples {
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

// describe writes the rate for people, "" while unknown.
func (t *throughput) describe(rate float64) string {
	if rate < 0 || len(t.samples) < 2 {
		return ""
	}
	span := t.samples[len(t.samples)-1].at.Sub(t.samples[0].at).Round(time.Second)
	return fmt.Sprintf("throughput: %.0f items/s acked over the last %v (from the sessions' heartbeats)", rate, span)
}
