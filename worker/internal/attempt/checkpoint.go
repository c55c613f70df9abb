package attempt

import (
	"context"
	"errors"

	"github.com/crdbwork/crdbwork/claim"
)

// ErrNotHandler is returned by SaveCheckpoint and ReportProgress for a
// context that is not a handler's under Run.
var ErrNotHandler = errors.New("not a handler's context (the ctx a worker or workertest gave the handler, or one derived from it)")

// box returns the attempt's value box in ctx, if any.
func box(ctx context.Context) (*valueBox, bool) {
	b, ok := ctx.Value(valueKey{}).(*valueBox)
	return b, ok && b.q != nil
}

// SaveCheckpoint saves data as the checkpoint of the item whose handler
// runs with ctx (claim.Queue.SaveCheckpoint on the attempt's queue, fenced on
// its claim).
func SaveCheckpoint(ctx context.Context, data []byte) error {
	b, ok := box(ctx)
	if !ok {
		return ErrNotHandler
	}
	return b.q.SaveCheckpoint(ctx, *b.it, data)
}

// ReportProgress saves p as the progress of the item whose handler runs
// with ctx (claim.Queue.ReportProgress).
func ReportProgress(ctx context.Context, p claim.Progress) error {
	b, ok := box(ctx)
	if !ok {
		return ErrNotHandler
	}
	return b.q.ReportProgress(ctx, *b.it, p)
}
