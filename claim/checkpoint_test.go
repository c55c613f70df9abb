package claim_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
)

// TestCheckpointAndProgressSurviveRetries saves a checkpoint and a progress
// during an attempt and checks that the save spends no attempt, that the
// next attempt after a nack and after a release gets both, that a stale
// copy of the claim cannot overwrite them (fenced), that nil clears the
// checkpoint, and the bounds: the size limit, a bad progress, an
// at-most-once item.
func TestCheckpointAndProgressSurviveRetries(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	s := startSession(t, ctx, pool)
	ids, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("long job")})
	if err != nil {
		t.Fatal(err)
	}
	id := ids.IDs[0]
	claimOne := func() claim.Item {
		t.Helper()
		var it claim.Item
		await.Until(t, "the item to be claimable again", func() bool {
			got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 1 {
				it = got[0]
			}
			return len(got) == 1
		})
		return it
	}

	first := claimOne()
	if first.Checkpoint != nil || first.Progress != (claim.Progress{}) {
		t.Fatalf("first attempt: checkpoint %q, progress %v; want none", first.Checkpoint, first.Progress)
	}
	if err := q.SaveCheckpoint(ctx, first, []byte("offset=100")); err != nil {
		t.Fatal(err)
	}
	if err := q.ReportProgress(ctx, first, claim.Progress{Done: 100, Total: 400}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT attempts FROM crdbwork_items WHERE id = $1`, id); n != 1 {
		t.Fatalf("attempts %d after the saves, want 1 (a save spends no attempt)", n)
	}
	list, err := q.Progressing(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != id || !list[0].Running || list[0].Progress != (claim.Progress{Done: 100, Total: 400}) ||
		list[0].CheckpointBytes != int64(len("offset=100")) || list[0].Attempt != 1 {
		t.Fatalf("Progressing = %+v, want the running item at 100/400 with a 10-byte checkpoint", list)
	}
	if _, err := q.Nack(ctx, first, errors.New("transient")); err != nil {
		t.Fatal(err)
	}

	second := claimOne()
	if second.Attempt != 2 || string(second.Checkpoint) != "offset=100" || second.Progress != (claim.Progress{Done: 100, Total: 400}) {
		t.Fatalf("after a nack: attempt %d, checkpoint %q, progress %v; want 2, offset=100, 100/400", second.Attempt, second.Checkpoint, second.Progress)
	}
	// The first attempt's copy is stale: its saves are refused.
	if err := q.SaveCheckpoint(ctx, first, []byte("stale")); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("stale SaveCheckpoint = %v, want ErrClaimLost", err)
	}
	if err := q.ReportProgress(ctx, first, claim.Progress{Done: 1}); !errors.Is(err, claim.ErrClaimLost) {
		t.Fatalf("stale ReportProgress = %v, want ErrClaimLost", err)
	}
	if err := q.SaveCheckpoint(ctx, second, []byte("offset=250")); err != nil {
		t.Fatal(err)
	}
	if err := q.Release(ctx, second); err != nil {
		t.Fatal(err)
	}
	third := claimOne()
	if third.Attempt != 2 || string(third.Checkpoint) != "offset=250" || third.Progress.Done != 100 {
		t.Fatalf("after a release: attempt %d, checkpoint %q, progress %v; want 2, offset=250, 100/400", third.Attempt, third.Checkpoint, third.Progress)
	}
	if list, err := q.Progressing(ctx, 5); err != nil || len(list) != 1 || !list[0].Running {
		t.Fatalf("Progressing = %+v, %v", list, err)
	}

	// The size limit: 64 KiB is stored, one byte more refused.
	big := bytes.Repeat([]byte{7}, claim.MaxCheckpointSize)
	if err := q.SaveCheckpoint(ctx, third, big); err != nil {
		t.Fatalf("a checkpoint of MaxCheckpointSize: %v", err)
	}
	if err := q.SaveCheckpoint(ctx, third, append(big, 7)); !errors.Is(err, claim.ErrCheckpointTooLarge) {
		t.Fatalf("a checkpoint over MaxCheckpointSize: %v, want ErrCheckpointTooLarge", err)
	}
	if n := count(t, pool, `SELECT octet_length(checkpoint) FROM crdbwork_items WHERE id = $1`, id); n != claim.MaxCheckpointSize {
		t.Fatalf("stored checkpoint of %d bytes, want the last accepted one (%d)", n, claim.MaxCheckpointSize)
	}
	for _, p := range []claim.Progress{{Done: -1}, {Done: 5, Total: 4}, {Total: -2}} {
		if err := q.ReportProgress(ctx, third, p); err == nil {
			t.Errorf("ReportProgress(%+v) accepted", p)
		}
	}
	// nil clears the checkpoint.
	if err := q.SaveCheckpoint(ctx, third, nil); err != nil {
		t.Fatal(err)
	}
	if err := q.Release(ctx, third); err != nil {
		t.Fatal(err)
	}
	fourth := claimOne()
	if fourth.Checkpoint != nil {
		t.Fatalf("checkpoint %d bytes after it was cleared", len(fourth.Checkpoint))
	}
	st := q.Stats()
	if st.Checkpoints != 4 || st.ProgressReports != 1 {
		t.Fatalf("stats: %d checkpoints, %d progress reports; want 4 and 1 (refused saves not counted)", st.Checkpoints, st.ProgressReports)
	}
	// The ack takes the checkpoint and progress with the item.
	if err := q.Ack(ctx, fourth, nil); err != nil {
		t.Fatal(err)
	}
	if list, err := q.Progressing(ctx, 5); err != nil || len(list) != 0 {
		t.Fatalf("Progressing after the ack = %+v, %v", list, err)
	}

	// An at-most-once item's claim deleted its row: nothing to save on.
	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("once"), AtMostOnce: true}); err != nil {
		t.Fatal(err)
	}
	once := claimOne()
	if err := q.SaveCheckpoint(ctx, once, []byte("x")); !errors.Is(err, claim.ErrNoCheckpointRow) {
		t.Fatalf("SaveCheckpoint of an at-most-once item = %v, want ErrNoCheckpointRow", err)
	}
}

// TestProgressString checks Progress's rendering and fraction.
func TestProgressString(t *testing.T) {
	t.Parallel()
	for p, want := range map[claim.Progress]string{
		{Done: 3, Total: 4}: "3/4 (75%)", {Done: 12}: "12", {}: "0", {Done: 10, Total: 10}: "10/10 (100%)",
	} {
		if got := p.String(); got != want {
			t.Errorf("%+v.String() = %q, want %q", p, got, want)
		}
	}
	if f, ok := (claim.Progress{Done: 1, Total: 4}).Fraction(); !ok || f != 0.25 {
		t.Errorf("Fraction = %v, %v", f, ok)
	}
	if _, ok := (claim.Progress{Done: 1}).Fraction(); ok {
		t.Error("Fraction with an unknown total reported ok")
	}
}
