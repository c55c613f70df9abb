package main

import "github.com/crdbwork/crdbwork/claim"

// The tests' reads of claim.Queue's lists and results, as one value and
// its error: deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})).

// waitingOf is the number of waiting items Inspect counted.
func waitingOf(info claim.QueueInfo, err error) (int64, error) { return info.Waiting, err }
