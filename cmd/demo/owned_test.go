package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// demoTest is the demo built with the demotest tag (record_demotest.go),
// built once, by the first test that needs it.
var demoTest struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// demoTestBin returns the demotest build of the demo (with `demo work
// --record-runs`), building it on first use beside demoBin.
func demoTestBin(t *testing.T) string {
	t.Helper()
	demoTest.once.Do(func() {
		demoTest.bin = filepath.Join(filepath.Dir(demoBin), "demo-demotest")
		if runtime.GOOS == "windows" {
			demoTest.bin += ".exe"
		}
		build := exec.Command("go", "build", "-tags", "demotest", "-o", demoTest.bin, ".")
		build.Env = os.Environ()
		demoTest.out, demoTest.err = build.CombinedOutput()
	})
	if demoTest.err != nil {
		t.Fatalf("building the demo with -tags demotest: %v\n%s", demoTest.err, demoTest.out)
	}
	return demoTest.bin
}

// binFor returns the binary to run args with: bin, or, when bin is this
// code's demo and args ask for a demotest flag, its demotest build.
func binFor(t *testing.T, bin string, args []string) string {
	t.Helper()
	if bin == demoBin && slices.Contains(args, "--record-runs") {
		return demoTestBin(t)
	}
	return bin
}

// adoptDemoQueue records queue as one the demo created (demo_queues),
// creating the demo's tables if they are missing.
func adoptDemoQueue(t *testing.T, pool *pgxpool.Pool, queue string) {
	t.Helper()
	ctx := context.Background()
	if err := createDemoTables(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO demo_queues (queue) VALUES ($1) ON CONFLICT (queue) DO NOTHING`, queue); err != nil {
		t.Fatal(err)
	}
}
