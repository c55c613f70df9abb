// Package wake wakes a process's idle workers when items are enqueued: an
// in-process hub, which an enqueue through package claim signals after its
// commit, and on PostgreSQL one listener connection per process and
// database, which turns the notifications that enqueues of every process
// send (see sql.Store.Notify) into signals of the same hub.
//
// A wake-up only shortens an idle wait: a worker claims as it would after
// its poll interval, and the poll stays its fallback. Nothing here is
// needed for correctness; a lost signal costs at most one poll interval.
package wake

import (
	"sync"
)

// hub holds the process's subscriptions, by channel (sql.Store.NotifyChannel
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

// Signal wakes every subscription of channel, without blocking.
func Signal(channel string) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	for s := range hub.subs[channel] {
		select {
		case s.c <- struct{}{}:
		default: // one is pending already
		}
	}
}
