//go:build demotest

package main

import (
	"context"

	"github.com/crdbwork/crdbwork/internal/cli"
)

// The demotest build (go build -tags demotest) adds to `demo work` what the
// limit and deployment tests measure with, and the shipped demo leaves out:
// --record-runs, which records every handler run's start and end (database
// clock) in the table demo_runs. The tests build the demo with the tag
// (demoTestBin). The recording itself (runRecorder, record_runs.go) is in
// every build, so that the ordinary test run tests it; only this build
// reaches it.

func init() {
	workTestFlags = func(f *cli.FlagSet, c *workConfig) {
		f.BoolVar(&c.recordRuns, "record-runs", false, "record each handler run's start and end (database clock) in the table demo_runs, for the limit tests")
	}
	workTestSetup = setupRecordRuns
}

// setupRecordRuns, with --record-runs, opens the recording's own pool,
// creates demo_runs and wraps the demo handler; the returned function
// waits for the runs being recorded and closes the pool (runRecorder.close).
func setupRecordRuns(ctx context.Context, c *workConfig, out *cli.Console) (func(), error) {
	if !c.recordRuns {
		return func() {}, nil
	}
	rp, err := cli.Connect(ctx, c.databaseURL, 2)
	if err != nil {
		return nil, err
	}
	// Processes starting together race on CREATE TABLE IF NOT EXISTS,
	// which PostgreSQL may refuse to the loser: a second try finds it.
	if _, err := rp.Exec(ctx, runsTable); err != nil {
		if _, err := rp.Exec(ctx, runsTable); err != nil {
			rp.Close()
			return nil, cli.Failf(1, "creating demo_runs: %v", err)
		}
	}
	rec := newRunRecorder(rp, out)
	c.wrap = rec.wrap
	return rec.close, nil
}
