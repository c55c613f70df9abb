package workertest_test

import "github.com/crdbwork/crdbwork/claim"

// The tests' reads of claim.Queue's lists and results, as one value and
// its error: deadList(q.DeadItems(ctx, claim.DeadQuery{Limit: 10})).

// deadList is the items of one page of dead items.
func deadList(p claim.DeadPage, err error) ([]claim.DeadItem, error) { return p.Items, err }
