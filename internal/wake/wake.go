// Package wake wakes a process's idle workers when items are enqueued: an
// in-process hub, which an enqueue through package claim signals after its
// commit, and on PostgreSQL one listener connection per process and
// database, which turns the notifications that enqueues of every process
// send (see store.Store.Notify) into signals of the same hub; and, where
// there is no LISTEN (CockroachDB, or when asked), one idle probe per
// process and database (probe.go), which reads the queues of idle workers
// at a short interval and signals the hub when it finds new items.
//
// A wake-up only shortens an idle wait: a worker claims as it would after
// its poll interval, and the poll stays its fallback. Nothing here is
// needed for correctness. A signal is never lost while a worker waits: one
// that comes during a claim is kept until the claim ends. The listener,
// after a lost connection, signals every channel once it listens again. A
// worker whose woken claim failed, or could not read an item's part (its
// session did not own it yet), claims again by itself (package worker's
// claim loop, and partition.Rebalancer.Changed), not at its next poll.
//
// A signal may name the key hashes of the items it announces (a hint):
// a worker in parts mode then claims in those items' parts only, with a
// statement that reads fewer parts. A signal without hashes announces
// items of any part.
package wake

import (
	"strconv"
	"strings"
	"sync"
)

// MaxHints bounds the key hashes one signal or subscription keeps: beyond
// it, the wake-up announces items of any part.
const MaxHints = 8

// hub holds the process's subscriptions, by channel (store.Store.NotifyChannel
// of the queue: it names the tables and the queue).
var hub struct {
	mu   sync.Mutex
	subs map[string]map[*Sub]struct{}
}

// Sub is one subscription to a channel's wake-ups.
type Sub struct {
	channel string
	c       chan struct{}
	once    sync.Once

	mu     sync.Mutex
	any    bool           // a pending wake-up announced items of any part
	hashes map[int64]bool // else the key hashes pending wake-ups announced
}

// Subscribe returns a subscription to channel's wake-ups. Close it when done.
func Subscribe(channel string) *Sub {
	s := &Sub{channel: channel, c: make(chan struct{}, 1)}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.subs == nil {
		hub.subs = make(map[string]map[*Sub]struct{})
	}
	m := hub.subs[channel]
	if m == nil {
		m = make(map[*Sub]struct{})
		hub.subs[channel] = m
	}
	m[s] = struct{}{}
	return s
}

// C returns the channel that receives a value after a wake-up of the
// subscription's channel. Wake-ups that come while one is pending are
// merged into it: a receiver that then claims sees every item committed
// before the last of them.
func (s *Sub) C() <-chan struct{} { return s.c }

// Hints returns, and forgets, the key hashes that the wake-ups since the
// last call announced, or ok false if one of them announced items of any
// part (or none named any): the receiver should then claim in every part.
// Call it after receiving from C.
func (s *Sub) Hints() (hashes []int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok = !s.any && len(s.hashes) > 0
	if ok {
		hashes = make([]int64, 0, len(s.hashes))
		for h := range s.hashes {
			hashes = append(hashes, h)
		}
	}
	s.any, s.hashes = false, nil
	return hashes, ok
}

// note merges a signal's hashes (nil: any part) into the pending hints.
func (s *Sub) note(hashes []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.any {
		return
	}
	if len(hashes) == 0 {
		s.any, s.hashes = true, nil
		return
	}
	if s.hashes == nil {
		s.hashes = make(map[int64]bool, len(hashes))
	}
	for _, h := range hashes {
		s.hashes[h] = true
	}
	if len(s.hashes) > MaxHints {
		s.any, s.hashes = true, nil
	}
}

// Close ends the subscription.
func (s *Sub) Close() {
	s.once.Do(func() {
		hub.mu.Lock()
		defer hub.mu.Unlock()
		if m := hub.subs[s.channel]; m != nil {
			delete(m, s)
			if len(m) == 0 {
				delete(hub.subs, s.channel)
			}
		}
	})
}

// Signal wakes every subscription of channel, without blocking, for items
// of any part.
func Signal(channel string) { SignalHashes(channel, nil) }

// SignalHashes wakes every subscription of channel, without blocking, for
// items with the given key hashes (nil or empty: items of any part).
func SignalHashes(channel string, hashes []int64) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	for s := range hub.subs[channel] {
		s.note(hashes)
		select {
		case s.c <- struct{}{}:
		default: // one is pending already
		}
	}
}

// Payload returns the notification payload that announces items with the
// given key hashes: the distinct hashes in decimal, comma-separated, or ""
// (items of any part) when there are more than MaxHints of them.
func Payload(hashes []int64) string {
	seen := make(map[int64]bool, MaxHints+1)
	var b strings.Builder
	for _, h := range hashes {
		if seen[h] {
			continue
		}
		seen[h] = true
		if len(seen) > MaxHints {
			return ""
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(h, 10))
	}
	return b.String()
}

// ParsePayload returns the key hashes a notification payload announces,
// or nil (items of any part) for an empty, malformed or oversized one.
func ParsePayload(p string) []int64 {
	if p == "" {
		return nil
	}
	fields := strings.Split(p, ",")
	if len(fields) > MaxHints {
		return nil
	}
	out := make([]int64, 0, len(fields))
	for _, f := range fields {
		h, err := strconv.ParseInt(f, 10, 64)
		if err != nil || h < 0 {
			return nil
		}
		out = append(out, h)
	}
	return out
}
