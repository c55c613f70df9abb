package main

import "github.com/crdbwork/crdbwork/claim"

// What the tests read of a queue's settings (claim.Queue.Settings), as one
// value and its error: readRetention(q.Settings(ctx)).

func readPaused(s claim.Settings, err error) (bool, error) { return s.Paused, err }

func readRetention(s claim.Settings, err error) (claim.Retention, error) { return s.Retention, err }

// sequencing is a queue's sequencing as the tests check it.
type sequencing struct{ On, Items, Hold bool }

func readSequencing(s claim.Settings, err error) (sequencing, error) {
	return sequencing{On: s.Sequenced, Items: s.SequencedItems, Hold: s.SequenceHold}, err
}

func readTenantLimits(s claim.Settings, err error) (map[string]claim.Limit, error) {
	return s.TenantLimits, err
}
