package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// TestFaultModelEveryItemEnds runs workers on a database with the
// CockroachDB fault model installed at high rates, in every mode of the
// tests (testdb.InstallFaults): SQLSTATE 40001 at a fifth of the writing
// statements of transactions and of their COMMITs, and at a tenth of
// the single statements and first writes. Items of two parts modes, some
// failing once (nacks), some run while a worker stops (releases). Every
// item must end exactly once, faults must have been injected at
// statements and at COMMITs, and no 40001 may reach the workers' logs:
// the retries absorb them all.
func TestFaultModelEveryItemEnds(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{0, 4} {
		t.Run(fmt.Sprintf("parts=%d", parts), func(t *testing.T) {
			t.Parallel()
			url := testschema.NewURL(t)
			installed := testdb.InstallFaults(t, url, testdb.FaultConfig{On: true, Seed: 7})
			e := newFaultEnv(t, url)
			if parts > 0 {
				if err := partition.SetParts(context.Background(), e.direct, crsql.Tables{}, "default", parts); err != nil {
					t.Fatal(err)
				}
			}
			const n = 300
			e.enqueue(n, "", 0)
			if installed {
				testdb.SetFaultRate(t, e.direct, 0.2, 0.1)
			}
			e.monitor()
			core, logs := observer.New(zapcore.WarnLevel)
			var failed atomic.Int64
			h := func(ctx context.Context, it claim.Item) (worker.Record, error) {
				if it.Attempt == 1 && it.ID[0]%4 == 0 {
					failed.Add(1)
					return nil, errors.New("every fourth item's first attempt fails")
				}
				return work(2*time.Millisecond)(ctx, it)
			}
			opts := worker.Options{Parts: parts, Concurrency: 6, ShutdownTimeout: 100 * time.Millisecond, Logger: zap.New(core)}
			// A third worker, slow, is stopped while it holds items: it
			// releases them.
			// It starts first and alone, so that the others cannot end every
			// item before it holds one.
			slow := e.startWorkers(1, url, work(200*time.Millisecond), opts)
			waitFor(t, "the slow worker to hold items", time.Minute, func() bool { return slow[0].w.Stats().InFlight > 0 })
			rs := e.startWorkers(2, url, h, opts)
			slow[0].Stop(t)
			e.assertEnded(time.Now(), time.Minute)
			stopAll(t, rs)
			if installed {
				stmts, commits := testdb.InjectedFaults(t, e.direct)
				t.Logf("injected 40001 at %d statements and %d commits; %d first attempts failed", stmts, commits, failed.Load())
				if stmts == 0 || commits == 0 {
					t.Errorf("injected 40001 at %d statements and %d commits: the model did not reach the workers' transactions", stmts, commits)
				}
			}
			for _, entry := range logs.All() {
				text := entry.Message
				for k, v := range entry.ContextMap() {
					text += fmt.Sprintf(" %s=%v", k, v)
				}
				if strings.Contains(text, "40001") {
					t.Errorf("a serialization failure reached the log, not absorbed by a retry: %s", text)
				}
			}
		})
	}
}
