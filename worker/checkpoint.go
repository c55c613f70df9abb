package worker

import (
	"context"
	"fmt"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker/internal/attempt"
)

// SaveCheckpoint saves data as the checkpoint of the item whose handler
// calls it (with the context the handler was given, or one derived from
// it): if the item runs again (a retry after an error, a crash of this
// process, an expired lease), the next attempt finds data in
// claim.Item.Checkpoint and can resume from it. It is one statement, one
// round trip, fenced on the item's claim: if the claim was lost (the item
// is already another attempt's), nothing is saved and the error wraps
// claim.ErrClaimLost; the handler should stop. It spends no attempt and
// does not extend the lease. At most claim.MaxCheckpointSize bytes
// (claim.ErrCheckpointTooLarge); nil clears the checkpoint. The checkpoint
// goes with the item when it is acked. At-most-once items have none
// (claim.ErrNoCheckpointRow).
//
//	for i := start; i < len(rows); i++ {
//		process(rows[i])
//		if i%1000 == 999 {
//			if err := worker.SaveCheckpoint(ctx, encodeOffset(i+1)); err != nil {
//				return nil, err
//			}
//		}
//	}
func SaveCheckpoint(ctx context.Context, data []byte) error {
	if err := attempt.SaveCheckpoint(ctx, data); err != nil {
		return fmt.Errorf("worker: SaveCheckpoint: %w", err)
	}
	return nil
}

// ReportProgress reports that the handler calling it (with its context)
// has done done of total units of its item (total 0: unknown). It shows in
// `crdbwork status` and claim.Queue.Progressing, and the next attempt, if
// any, finds it in claim.Item.Progress. Like SaveCheckpoint it is one
// fenced statement (claim.ErrClaimLost once the claim is lost) that spends
// no attempt; report every few seconds or percent, not per unit.
func ReportProgress(ctx context.Context, done, total int64) error {
	if err := attempt.ReportProgress(ctx, claim.Progress{Done: done, Total: total}); err != nil {
		return fmt.Errorf("worker: ReportProgress: %w", err)
	}
	return nil
}
