package claim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
)

// MaxCheckpointSize is the largest checkpoint SaveCheckpoint stores, in
// bytes (64 KiB). A checkpoint is where a long handler resumes after a
// crash or a retry (an offset, a cursor, the ids done so far), not its
// output: keep large state in your own tables and checkpoint a key to it.
const MaxCheckpointSize = 64 << 10

// ErrCheckpointTooLarge is wrapped by SaveCheckpoint's error for a
// checkpoint over MaxCheckpointSize; nothing was saved.
var ErrCheckpointTooLarge = errors.New("checkpoint larger than claim.MaxCheckpointSize (64 KiB)")

// ErrNoCheckpointRow is wrapped by SaveCheckpoint's and ReportProgress's
// errors for an at-most-once item: its claim deleted its row, so there is
// nothing to save on and no next attempt to hand it to.
var ErrNoCheckpointRow = errors.New("an at-most-once item has no row to save a checkpoint or progress on")

// Progress is how far an item's handler got: Done of Total units of work
// (rows, files, bytes: the handler's choice). Total 0 means the total is
// unknown. The zero Progress is "none reported".
type Progress struct {
	Done, Total int64
}

// Fraction returns Done/Total between 0 and 1, and false if the total is
// unknown.
func (p Progress) Fraction() (float64, bool) {
	if p.Total <= 0 {
		return 0, false
	}
	return min(float64(p.Done)/float64(p.Total), 1), true
}

// String renders p as "done/total (pct%)", or "done" with an unknown total.
func (p Progress) String() string {
	if f, ok := p.Fraction(); ok {
		return fmt.Sprintf("%d/%d (%.0f%%)", p.Done, p.Total, 100*f)
	}
	return fmt.Sprint(p.Done)
}

// validate reports a progress that cannot be stored.
func (p Progress) validate() error {
	if p.Done < 0 || p.Total < 0 || (p.Total > 0 && p.Done > p.Total) {
		return fmt.Errorf("progress %d of %d: done and total must not be negative, and done at most total (total 0: unknown)", p.Done, p.Total)
	}
	return nil
}

// SaveCheckpoint stores data as the checkpoint of it, the item as claimed
// (nil clears it): the item's next attempt, after a retry (Nack), a crash,
// an expired lease or a lost session, finds it in Item.Checkpoint. The save
// is one statement, one round trip, fenced on the claim like an ack: if it
// is no longer claimed by it.Session with it.Token (its lease expired and
// it was reaped, or it was claimed again), nothing is written and the error
// wraps ErrClaimLost, so a stale handler never overwrites the next
// attempt's checkpoint. It spends no attempt and does not extend the lease.
// A checkpoint over MaxCheckpointSize is refused (ErrCheckpointTooLarge).
//
// The checkpoint stays with the item until it is acked, moved to the dead
// items or cancelled; a dead item requeued starts without one. Handlers
// running under package worker call worker.SaveCheckpoint instead.
func (q *Queue) SaveCheckpoint(ctx context.Context, it Item, data []byte) error {
	if len(data) > MaxCheckpointSize {
		return fmt.Errorf("claim: saving the checkpoint of item %s: %d bytes: %w", it.ID, len(data), ErrCheckpointTooLarge)
	}
	if it.AtMostOnce {
		return fmt.Errorf("claim: saving the checkpoint of item %s: %w", it.ID, ErrNoCheckpointRow)
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: saving the checkpoint of item %s: %w", it.ID, err)
	}
	err := q.update(ctx, "checkpoint", func(ctx context.Context) (bool, error) {
		return q.store.ItemsCheckpointSave(ctx, q.db, it.claimKey(), data)
	})
	if err != nil {
		return fmt.Errorf("claim: saving the checkpoint of item %s: %w", it.ID, err)
	}
	q.stats.checkpoints.Add(1)
	return nil
}

// ReportProgress stores p as the progress of it, the item as claimed: it
// shows in Progressing (crdbwork status) and the next attempt finds it in
// Item.Progress. Like SaveCheckpoint it is one fenced statement (ErrClaimLost
// if the claim is gone), spends no attempt and does not extend the lease.
// Report at a human pace (every few seconds, or every few percent), not per
// unit of work: each report is a write.
func (q *Queue) ReportProgress(ctx context.Context, it Item, p Progress) error {
	if err := p.validate(); err != nil {
		return fmt.Errorf("claim: reporting the progress of item %s: %w", it.ID, err)
	}
	if it.AtMostOnce {
		return fmt.Errorf("claim: reporting the progress of item %s: %w", it.ID, ErrNoCheckpointRow)
	}
	if err := q.ready(ctx); err != nil {
		return fmt.Errorf("claim: reporting the progress of item %s: %w", it.ID, err)
	}
	err := q.update(ctx, "progress", func(ctx context.Context) (bool, error) {
		return q.store.ItemsProgressSave(ctx, q.db, it.claimKey(), p.Done, p.Total)
	})
	if err != nil {
		return fmt.Errorf("claim: reporting the progress of item %s: %w", it.ID, err)
	}
	q.stats.progress.Add(1)
	return nil
}

// ItemProgress is one item with a reported progress, as Progressing lists
// it.
type ItemProgress struct {
	ID   uuid.UUID
	Part int
	// Running reports that a session holds the item now; otherwise it waits
	// for its next attempt.
	Running bool
	// Attempt is the item's attempts so far (the running one included).
	Attempt, MaxAttempts int
	Progress             Progress
	// Age is how long ago the progress was reported, by the database clock.
	Age time.Duration
	// CheckpointBytes is the size of its checkpoint (0 if none), and
	// CheckpointAge how long ago it was saved (0 if never).
	CheckpointBytes int64
	CheckpointAge   time.Duration
}

// DefaultProgressing is how many items Progressing lists when asked for 0.
const DefaultProgressing = 20

// Progressing lists the queue's items with a reported progress, the most
// recently reported first, at most limit of them (DefaultProgressing if
// limit is 0): running items and items waiting for a retry alike
// (ItemProgress.Running tells them apart). It reads those items only, through
// an index of the items that reported a progress.
func (q *Queue) Progressing(ctx context.Context, limit int) ([]ItemProgress, error) {
	if limit <= 0 {
		limit = DefaultProgressing
	}
	if err := q.ready(ctx); err != nil {
		return nil, fmt.Errorf("claim: listing the progress of %q: %w", q.opts.Queue, err)
	}
	var rows []store.ProgressRow
	err := retry.Do(ctx, nil, func(ctx context.Context) error {
		var err error
		rows, err = q.store.ItemsProgressing(ctx, q.db, q.opts.Queue, limit)
		return store.Classify(err)
	})
	if err != nil {
		return nil, fmt.Errorf("claim: listing the progress of %q: %w", q.opts.Queue, err)
	}
	out := make([]ItemProgress, len(rows))
	for i, r := range rows {
		out[i] = ItemProgress{ID: r.ID, Part: r.Part, Running: r.Claimed, Attempt: r.Attempts, MaxAttempts: r.MaxAttempts,
			Progress: Progress{Done: r.Done, Total: r.Total}, Age: max(r.Now.Sub(r.ProgressAt), 0),
			CheckpointBytes: r.CheckpointBytes}
		if !r.CheckpointAt.IsZero() {
			out[i].CheckpointAge = max(r.Now.Sub(r.CheckpointAt), 0)
		}
	}
	return out, nil
}
