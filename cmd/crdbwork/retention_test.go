package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestRetention shows and sets a queue's retention: a tightening needs
// --yes (--dry-run changes nothing), "off" and "default" work, --json
// reports it, and the library reads back what the command set.
func TestRetention(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	d.kill(t, "emails", 3)
	ctx := context.Background()
	q := d.queue(t, "emails", crsql.Tables{})

	m := jsonOf(t, must(t, d.env, "retention", "--queue", "emails", "--json"))
	if r, _ := m["retention"].(map[string]any); r["dead_max_age_seconds"] != float64(30*24*3600) || r["dead_max_count"] != float64(100000) {
		t.Fatalf("retention --json of a queue never set: %v", m)
	}
	if r := must(t, d.env, "retention", "--queue", "emails"); r.stdout != "queue \"emails\" keeps dead items at most 30 days old, at most 100000; ended items with their history for a day\n" {
		t.Errorf("retention: %q", r.stdout)
	}
	// Tightening: refused without --yes, shown by --dry-run, done with --yes.
	want(t, d.env, 2, []string{"would set queue \"emails\" keeps dead items at most 7 days old, at most 10", "holds 3", "--yes"},
		"retention", "--queue", "emails", "--dead-max-age", "7d", "--dead-max-count", "10")
	if r := must(t, d.env, "retention", "--queue", "emails", "--dead-max-age", "7d", "--dead-max-count", "10", "--dry-run"); r.stdout == "" {
		t.Errorf("--dry-run printed nothing: %s", r)
	}
	if r, err := readRetention(q.Settings(ctx)); err != nil || r != (claim.Retention{DeadMaxAge: claim.DefaultDeadMaxAge, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("a refused or dry change stored %+v, %v", r, err)
	}
	m = jsonOf(t, must(t, d.env, "retention", "--queue", "emails", "--dead-max-age", "7d", "--dead-max-count", "10", "--yes", "--json"))
	if r, _ := m["retention"].(map[string]any); r["dead_max_age_seconds"] != float64(7*24*3600) || r["dead_max_count"] != float64(10) {
		t.Fatalf("retention --yes --json: %v", m)
	}
	if r, err := readRetention(q.Settings(ctx)); err != nil || r != (claim.Retention{DeadMaxAge: 7 * 24 * time.Hour, DeadMaxCount: 10, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("after the change: %+v, %v", r, err)
	}
	// Loosening needs no --yes; "off" and "default".
	must(t, d.env, "retention", "--queue", "emails", "--dead-max-age", "off", "--dead-max-count", "default")
	if r, err := readRetention(q.Settings(ctx)); err != nil || r != (claim.Retention{NoDeadMaxAge: true, DeadMaxCount: claim.DefaultDeadMaxCount, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("after off and default: %+v, %v", r, err)
	}
	// The flag not given keeps its value.
	must(t, d.env, "retention", "--queue", "emails", "--dead-max-count", "off")
	if r, err := readRetention(q.Settings(ctx)); err != nil || r != (claim.Retention{NoDeadMaxAge: true, NoDeadMaxCount: true, HistoryWindow: claim.DefaultHistoryWindow}) {
		t.Fatalf("after --dead-max-count off: %+v, %v", r, err)
	}
	// The history window: longer needs no --yes, shorter does, off keeps
	// ended items for the dedup window only.
	must(t, d.env, "retention", "--queue", "emails", "--history", "7d")
	if r, err := readRetention(q.Settings(ctx)); err != nil || r.HistoryWindow != 7*24*time.Hour || r.NoHistory {
		t.Fatalf("after --history 7d: %+v, %v", r, err)
	}
	want(t, d.env, 2, []string{"ended items with their history for the dedup window only", "--yes"}, "retention", "--queue", "emails", "--history", "off")
	must(t, d.env, "retention", "--queue", "emails", "--history", "off", "--yes")
	if r, err := readRetention(q.Settings(ctx)); err != nil || r.HistoryWindow != 0 || !r.NoHistory {
		t.Fatalf("after --history off: %+v, %v", r, err)
	}
	must(t, d.env, "retention", "--queue", "emails", "--history", "default")
	for _, bad := range [][]string{{"--dead-max-age", "-1h"}, {"--dead-max-age", "soon"}, {"--dead-max-count", "0"}, {"--dead-max-count", "x"}, {"--dead-max-age", "10ms"}, {"--history", "-1h"}, {"--history", "10ms"}} {
		want(t, d.env, 2, nil, append([]string{"retention", "--queue", "emails"}, bad...)...)
	}
	want(t, d.env, 2, []string{`unknown queue "nope"`}, "retention", "--queue", "nope")
	// status shows a retention other than the default.
	if r := must(t, d.env, "status", "--queue", "emails"); !strings.Contains(r.stdout, "retention: keeps dead items any age, any number") {
		t.Errorf("status does not show the retention:\n%s", r.stdout)
	}
}

// TestStatusShowsProgress checks that the progress a handler reported
// shows in status, as text and in --json, with its checkpoint's size.
func TestStatusShowsProgress(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	d.enqueue(t, "emails", 3)
	q := d.queue(t, "emails", crsql.Tables{})
	s, err := session.Start(ctx, d.pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	got, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	if err := q.ReportProgress(ctx, got[0], claim.Progress{Done: 42, Total: 168}); err != nil {
		t.Fatal(err)
	}
	if err := q.SaveCheckpoint(ctx, got[0], []byte("cursor=42")); err != nil {
		t.Fatal(err)
	}
	m := jsonOf(t, must(t, d.env, "status", "--queue", "emails", "--json"))
	list, _ := m["progress"].([]any)
	if len(list) != 1 {
		t.Fatalf("status --json progress: %v", m["progress"])
	}
	p, _ := list[0].(map[string]any)
	if p["id"] != got[0].ID.String() || p["running"] != true || p["done"] != float64(42) || p["total"] != float64(168) ||
		p["checkpoint_bytes"] != float64(9) || p["attempt"] != float64(1) {
		t.Errorf("status --json progress row: %v", p)
	}
	if r := must(t, d.env, "status", "--queue", "emails"); !strings.Contains(r.stdout, "42/168 (25%)") || !strings.Contains(r.stdout, got[0].ID.String()) {
		t.Errorf("status does not show the progress:\n%s", r.stdout)
	}
}
