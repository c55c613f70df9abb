package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// HistoryEntry is one element of an errors array of crdbwork_attempt_errors (historyEntry,
// historyRequeued), as the statements write it.
type HistoryEntry struct {
	Attempt   int64      `json:"attempt"`
	StartedAt *time.Time `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	Session   *uuid.UUID `json:"session"`
	Kind      string     `json:"kind"`
	Error     string     `json:"error"`
	// From is where a requeue marker's item came from (dead, cancelled).
	From string `json:"from"`
}

// ParseHistory reads an errors array of crdbwork_attempt_errors (nil or empty: none).
func ParseHistory(raw []byte) ([]HistoryEntry, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var out []HistoryEntry
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("reading an item's attempt history: %w", err)
	}
	return out, nil
}

// Outcomes of an attempt in a Timeline.
const (
	AttemptRunning   = "running"   // a session works it now
	AttemptSucceeded = "succeeded" // its handler succeeded: the item was acked (or taken, at most once)
	AttemptFailed    = "failed"    // its handler failed; the item was retried
	AttemptPermanent = "permanent" // its handler failed for good
	AttemptDead      = "dead"      // it failed and the item died
	AttemptLease     = "lease expired"
	AttemptCancelled = "cancelled" // the item was cancelled while it ran
	// AttemptLost: no end was recorded. Its worker's session ended while
	// it ran (the process was killed or cut off, and the claim was
	// released with the session), or code older than schema version 6
	// ended it.
	AttemptLost = "lost"
	// AttemptRequeued is not an attempt: the item was requeued (from the
	// dead or cancelled items) and its attempts count from one again.
	AttemptRequeued = "requeued"
)

// Attempt is one attempt of an item's Timeline.
type Attempt struct {
	// Number is the attempt's number, from 1; Run counts the requeues
	// before it (0: before any).
	Number int64
	Run    int
	// StartedAt and EndedAt are its claim and its end (nil: not known, or
	// not ended); Session the session that ran it (nil: not known).
	StartedAt, EndedAt *time.Time
	Session            *uuid.UUID
	Outcome            string
	// Error is its error (at most HistoryMaxError characters, longer ones
	// cut with a marker).
	Error string
	// From is where a requeue (AttemptRequeued) took the item from.
	From string
}

// TimelineInput is what the tables hold about an item for its Timeline.
type TimelineInput struct {
	// Entries are its errors of crdbwork_attempt_errors.
	Entries []HistoryEntry
	// Attempts is its attempts since its last requeue (the row's count).
	Attempts int64
	// Last describes the last attempt when no entry does: AttemptRunning
	// (claimed now), AttemptSucceeded, AttemptCancelled, or "" (unknown:
	// an attempt without an entry is lost).
	Last string
	// LastStart, LastEnd and LastSession are the last attempt's start, end
	// and session, where known.
	LastStart, LastEnd *time.Time
	LastSession        *uuid.UUID
}

// Timeline returns an item's attempts, oldest first: each entry, the
// attempts no entry recorded (AttemptLost, or the last one as in.Last),
// and requeue markers. When the entries were cut (HistoryMaxEntries), the
// attempts before the oldest kept are left out, and omitted reports it.
func Timeline(in TimelineInput) (out []Attempt, omitted bool) {
	run, last := 0, -1
	for i, e := range in.Entries {
		if e.Kind == HistoryRequeued {
			run++
			last = i
		}
	}
	omitted = len(in.Entries) >= HistoryMaxEntries
	// Earlier runs: their entries as they are.
	r := 0
	for _, e := range in.Entries[:last+1] {
		a := entryAttempt(e, r)
		if e.Kind == HistoryRequeued {
			r++
		}
		out = append(out, a)
	}
	cur := in.Entries[last+1:]
	byNum := map[int64][]HistoryEntry{}
	for _, e := range cur {
		byNum[e.Attempt] = append(byNum[e.Attempt], e)
	}
	first := int64(1)
	if omitted && last < 0 && len(cur) > 0 {
		first = cur[0].Attempt
	}
	for k := first; k <= in.Attempts; k++ {
		if es, ok := byNum[k]; ok {
			for _, e := range es {
				out = append(out, entryAttempt(e, run))
			}
			continue
		}
		a := Attempt{Number: k, Run: run, Outcome: AttemptLost}
		if k == in.Attempts {
			if in.Last != "" {
				a.Outcome = in.Last
			}
			a.StartedAt, a.EndedAt, a.Session = in.LastStart, in.LastEnd, in.LastSession
		}
		out = append(out, a)
	}
	return out, omitted
}

func entryAttempt(e HistoryEntry, run int) Attempt {
	a := Attempt{Number: e.Attempt, Run: run, StartedAt: e.StartedAt, EndedAt: e.EndedAt, Session: e.Session, Error: e.Error, From: e.From}
	switch e.Kind {
	case HistoryFailed:
		a.Outcome = AttemptFailed
	case HistoryPermanent:
		a.Outcome = AttemptPermanent
	case HistoryLease:
		a.Outcome = AttemptLease
	case HistoryDead:
		a.Outcome = AttemptDead
	case HistoryRequeued:
		a.Outcome, a.Number = AttemptRequeued, 0
	default:
		a.Outcome = e.Kind
	}
	return a
}
