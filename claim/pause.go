package claim

import (
	"context"
	"fmt"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// paused reports whether the queue is paused (Settings.Paused).
func (q *Queue) paused(ctx context.Context) (bool, error) {
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
		return store.Classify(q.store.QueuePause(ctx, q.db, q.opts.Queue, paused))
	})
	if err != nil {
		return fmt.Errorf("claim: %s %q: %w", verb, q.opts.Queue, err)
	}
	return nil
}
