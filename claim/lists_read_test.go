package claim_test

import "github.com/crdbwork/crdbwork/claim"

// The tests' reads of claim.Queue's lists and results, as one value and
// its error: deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})).

// cancelFound reports whether CancelItem found the item.
func cancelFound(r claim.CancelResult, err error) (bool, error) { return r.Found, err }

// deadCount is the count a DeadQuery with Count asked for.
func deadCount(p claim.DeadPage, err error) (int64, error) { return p.Count, err }

// deadList is the items of one page of dead items.
func deadList(p claim.DeadPage, err error) ([]claim.DeadItem, error) { return p.Items, err }

// requeuedOne reports whether a Requeue of one id moved it.
func requeuedOne(r claim.RequeueResult, err error) (bool, error) { return r.Requeued > 0, err }

// waitingOf is the number of waiting items Inspect counted.
func waitingOf(info claim.QueueInfo, err error) (int64, error) { return info.Waiting, err }
