package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTableWithPeers runs the table with the Node.js peers beside crdbwork
// and the exactly-once limit: each peer's run fails unless every job
// completed (and, for pg-boss, wrote one result row). It needs the peers'
// packages installed (npm ci in bench/peers, or one run of the table
// command) and skips without them, so that CI needs no npm.
func TestTableWithPeers(t *testing.T) {
	if _, err := os.Stat(filepath.Join("peers", "node_modules")); err != nil {
		t.Skip("the Node.js peers are not installed (bench/peers/node_modules: npm ci there, or run go -C bench run . table once)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out strings.Builder
	if err := run(ctx, []string{"table", "--items", "2000", "--rounds", "2", "--river-workers", "64", "--systems", "crdbwork,graphile,pgboss,limit-eo"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	rows := checkTable(t, out.String(), "crdbwork bench mode", "graphile-worker batched", "pg-boss batch fetch", "limit exactly-once")
	for _, peer := range []string{"graphile-worker batched", "pg-boss batch fetch"} {
		if rows[peer][8] != "—" {
			t.Errorf("%s: round trips %s per 1,000 jobs; want — (another process's connections)", peer, rows[peer][8])
		}
	}
	for _, want := range []string{"graphile-worker 0.17.3", "pg-boss 10.4.2", "goal: crdbwork bench mode ≥ 1.5× pg-boss batch fetch: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
