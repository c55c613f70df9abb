package claim

import (
	"context"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// Pause pauses the queue: from the next claim on, the claims (Claimer) of
// every session return no items, until Resume. Items already claimed are
// not affected (they are acked, nacked or released as usual), and enqueues
// go on. It is idempotent.
func (q *Queue) Pause(ctx context.Context) error { return q.setPaused(ctx, true) }

// Resume ends a Pause. It is idempotent.
func (q *Queue) Resume(ctx context.Context) error { return q.setPaused(ctx, false) }

// Paused reports whether the queue is paused.
func (q *Queue) Paused(ctx context.Context) (bool, error) {
	if err := q.ready(ctx); err != nil {
		return false, fmt.Errorf("claim: reading whether %q is paused: %w", q.opts.Queue, err)
	}
	var paused bool
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		paused, err = q.store.QueuePaused(ctx, q.db, q.opts.Queue)
		return store.Classify(err)
	})
	if err != nil {
		return false, fmt.Errorf("claim: reading whether %q is paused: %w", q.opts.Queue, err)
	}
	return paused, nil
}

func (q *Queue) setPaused(ctx context.Context, paused bool) error {
	verb := map[bool]string{true: "pausing", false: "resuming"}[paused]
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	err := retry.Do(ctx, q.stats.retried("pause"), func(ctx context.Context) error {
		return store.Classify(q.store.PauseQueue(ctx, q.db, q.opts.Queue, paused))
	})
	if err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	return nil
}
