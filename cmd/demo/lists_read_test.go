package main

import "github.com/crdbwork/crdbwork/claim"

// The tests' reads of claim.Queue's lists and results, as one value and
// its error: deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})).

// cancelFound reports whether CancelItem found the item.
func cancelFound(r claim.CancelResult, err error) (bool, error) { return r.Found, err }

// requeuedOne reports whether a Requeue of one id moved it.
func requeuedOne(r claim.RequeueResult, err error) (bool, error) { return r.Requeued > 0, err }
