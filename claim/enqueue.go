package claim

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/retry"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// enqueueChunk bounds the rows of one INSERT (8 parameters each, far below
// the protocol's 65535).
const enqueueChunk = 500

// NewItem is an item to enqueue. Only Payload is required.
type NewItem struct {
	// Payload is the item's data, at most Options.MaxPayload bytes.
	Payload []byte
	// Metadata is optional data kept beside the payload (headers, tracing).
	Metadata []byte
	// Key, if set, fixes the item's part: items with the same key land in
	// the same part, so parts mode handles them in order of priority and
	// vesting time. Without a key, items are spread evenly over the parts.
	Key string
	// Priority orders claims: lower values are claimed first. Default 0.
	Priority int
	// Delay postpones the item: it becomes claimable this long after the
	// enqueue, by the database clock.
	Delay time.Duration
	// MaxAttempts overrides Options.MaxAttempts for this item.
	MaxAttempts int
}

// Enqueue adds items to the queue atomically (all or none) and returns their
// ids in order.
func (q *Queue) Enqueue(ctx context.Context, items ...NewItem) ([]uuid.UUID, error) {
	if len(items) <= enqueueChunk {
		var ids []uuid.UUID
		err := retry.Do(ctx, q.stats.retried("enqueue"), func(ctx context.Context) error {
			var err error
			ids, err = q.EnqueueTx(ctx, q.db, items...)
			return err
		})
		return ids, err
	}
	var ids []uuid.UUID
	err := retry.Tx(ctx, q.db, q.stats.retried("enqueue"), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		ids, err = q.EnqueueTx(ctx, tx, items...)
		return err
	})
	return ids, err
}

// EnqueueTx adds items through db, typically the caller's own transaction, so
// that the items exist if and only if that transaction commits. It does not
// retry: retrying the caller's transaction is the caller's business.
func (q *Queue) EnqueueTx(ctx context.Context, db crsql.DB, items ...NewItem) ([]uuid.UUID, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: enqueueing into %q: %w", q.opts.Queue, err)
	}
	ids := make([]uuid.UUID, len(items))
	args := make([]any, 0, 1+crsql.EnqueueParams*min(len(items), enqueueChunk))
	for i := range items {
		if err := q.validate(i, &items[i]); err != nil {
			return nil, err
		}
	}
	for start := 0; start < len(items); start += enqueueChunk {
		chunk := items[start:min(start+enqueueChunk, len(items))]
		args = append(args[:0], q.opts.Queue)
		for i, it := range chunk {
			id, err := uuid.NewRandom()
			if err != nil {
				return nil, fmt.Errorf("claim: generating item id: %w", err)
			}
			ids[start+i] = id
			var key *string
			var hash uint64
			if it.Key != "" {
				key = &it.Key
				h := fnv.New64a()
				h.Write([]byte(it.Key))
				hash = h.Sum64()
			} else {
				hash = q.next.Add(1)
			}
			payload := it.Payload
			if payload == nil {
				payload = []byte{}
			}
			maxAttempts := it.MaxAttempts
			if maxAttempts == 0 {
				maxAttempts = q.opts.MaxAttempts
			}
			args = append(args, id, int64(hash&math.MaxInt64), key, int64(it.Priority),
				it.Delay.Microseconds(), int64(maxAttempts), payload, it.Metadata)
		}
		if _, err := db.Exec(ctx, q.st.EnqueueRows(len(chunk)), args...); err != nil {
			return nil, fmt.Errorf("claim: enqueueing %d items into %q: %w", len(chunk), q.opts.Queue, crsql.Classify(err))
		}
	}
	q.stats.enqueued.Add(int64(len(items)))
	return ids, nil
}

func (q *Queue) validate(i int, it *NewItem) error {
	switch {
	case len(it.Payload) > q.opts.MaxPayload:
		return fmt.Errorf("claim: item %d: %w: %d bytes, the limit is %d (Options.MaxPayload); store large data elsewhere and enqueue a reference",
			i, ErrPayloadTooLarge, len(it.Payload), q.opts.MaxPayload)
	case len(it.Metadata) > q.opts.MaxPayload:
		return fmt.Errorf("claim: item %d: %w: metadata is %d bytes, the limit is %d (Options.MaxPayload)",
			i, ErrPayloadTooLarge, len(it.Metadata), q.opts.MaxPayload)
	case it.Delay < 0:
		return fmt.Errorf("claim: item %d: negative delay %v", i, it.Delay)
	case it.MaxAttempts < 0:
		return fmt.Errorf("claim: item %d: negative MaxAttempts %d", i, it.MaxAttempts)
	}
	return nil
}
