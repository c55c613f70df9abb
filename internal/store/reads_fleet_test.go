package store_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainFleetStatements checks the plans of the fleet's reads
// (reads_fleet.go) in the state of TestExplainDashboardStatements: the
// per-queue figures on the queue that holds half of 100k items ("big"),
// capped, must read a bounded window of each index named, and exactly on a
// small queue; neither may scan a table of items, deaths, ended ids or
// waiting items sequentially.
func TestExplainFleetStatements(t *testing.T) {
	t.Parallel()
	pool := dashboardSeed(t)
	since := time.Now().Add(-time.Minute)
	st := store.FleetStatementsForTest(crsql.Tables{})
	all := []string{"crdbwork_items_turn_next", "crdbwork_items_lease", "crdbwork_dead_items_by_queue", "crdbwork_ended_by_age",
		"crdbwork_waiting_by_queue", "crdbwork_items_snoozed", "crdbwork_items_cancel_requested"}
	cases := []struct {
		name    string
		indexes []string
		args    []any
	}{
		{"FleetQueue", all, []any{"big", int64(1000), since}},
		{"FleetQueue", nil, []any{"q7", int64(math.MaxInt64), since}},
		{"FleetLiveSessions", nil, []any{1000}},
		{"FleetSessionCounts", nil, nil},
		{"WaitingItem", []string{"crdbwork_waiting_pkey"}, []any{uuid.New()}},
		{"EndedOfID", []string{"crdbwork_ended_pkey", "crdbwork_cancelled_items_pkey"}, []any{[]string{"big", "q7", "q8"}, uuid.New()}},
		{"AuditFilter", nil, []any{"", "pause", "q7", int64(3600e6), nil, nil, 20}},
		// The items by kind are exact: they read every row of the queue,
		// as the backlog by part does (inspectStatements.Unclaimed). On
		// "big", half of every table, a sequential scan is the cheaper
		// read and both plan one; a small queue's must go through its
		// indexes.
		{"FleetKinds", []string{"crdbwork_items_part_turn|crdbwork_items_turn_next", "crdbwork_items_lease", "crdbwork_dead_items_by_queue"}, []any{"q7", 21}},
	}
	pcs := make([]planCase, len(cases))
	covered := map[string]bool{}
	for i, c := range cases {
		if st[c.name] == "" {
			t.Fatalf("no fleet statement %q", c.name)
		}
		pcs[i] = planCase{c.name, st[c.name], c.args}
		covered[c.name] = true
	}
	for name := range st {
		if !covered[name] {
			t.Errorf("the fleet statement %s has no plan case", name)
		}
	}
	explainEach(t, pool, "fleet_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		for _, table := range []string{"crdbwork_items", "crdbwork_dead_items", "crdbwork_ended", "crdbwork_waiting"} {
			if strings.Contains(text, "Seq Scan on "+table+" ") || strings.Contains(text, "Seq Scan on "+table+"\n") {
				t.Errorf("%s (%s) scans %s:\n%s", c.name, mode, table, text)
			}
		}
		if c.name == "FleetQueue" && (strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan")) {
			t.Errorf("%s (%s) scans a table:\n%s", c.name, mode, text)
		}
		if testdb.Kind(t) == "postgres" {
			for _, ix := range c.indexes {
				if !containsAny(text, strings.Split(ix, "|")) {
					t.Errorf("%s (%s) does not read %s:\n%s", c.name, mode, ix, text)
				}
			}
		}
		t.Logf("%s (%s):\n%s", c.name, mode, text)
	})
}

// FleetQueue counts each state of a queue's items and stops each count at
// the cap; FleetLiveSessions lists the first live sessions by id, and
// FleetSessionCounts counts the live and the expired ones.
func TestStoreFleetReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := applied(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s, err := st.SessionsCreate(ctx, pool, time.Hour, "h", 1, "w")
	if err != nil {
		t.Fatal(err)
	}
	// 4 due, 2 scheduled (one snoozed), 3 claimed (one asked to stop), 2
	// dead, 1 waiting, 2 ended.
	for i, st := range []string{"due", "due", "due", "due", "later", "snoozed", "claimed", "claimed", "cancel"} {
		vest, claim, snoozes, cancel := "now() - INTERVAL '1 minute'", "NULL", 0, "NULL"
		switch st {
		case "later":
			vest = "now() + INTERVAL '1 hour'"
		case "snoozed":
			vest, snoozes = "now() + INTERVAL '1 hour'", 1
		case "claimed":
			claim = "'" + s.String() + "'"
		case "cancel":
			claim, cancel = "'"+s.String()+"'", "now()"
		}
		exec(`INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, claim, lease_until, snoozes, cancel_requested_at)
			VALUES (gen_random_uuid(), 'q', 0, `+vest+`, now() + $1 * INTERVAL '1 millisecond', '\x00'::BYTEA, `+claim+`,
			        CASE WHEN `+claim+` IS NULL THEN NULL ELSE now() + INTERVAL '1 hour' END, $2, `+cancel+`)`, i, snoozes)
	}
	for range 2 {
		exec(`INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, died_at)
			VALUES ($1, 'q', 0, 0, 1, 1, '\x00'::BYTEA, now(), now())`, uuid.New())
		exec(`INSERT INTO crdbwork_ended (queue, id, ended_at, outcome) VALUES ('q', $1, now(), 'acked')`, uuid.New())
	}
	exec(`INSERT INTO crdbwork_waiting (id, queue, hash, payload, remaining) VALUES ($1, 'q', 0, '\x00'::BYTEA, 1)`, uuid.New())
	since := time.Now().Add(-time.Hour)
	row, err := st.FleetQueue(ctx, pool, "q", math.MaxInt64, since)
	if err != nil {
		t.Fatal(err)
	}
	if row.Stored || row.NumParts != 1 || row.Unclaimed != 6 || row.Due != 4 || row.Claimed != 3 || row.Dead != 2 || row.Ended != 2 ||
		row.Waiting != 1 || row.Snoozed != 1 || row.Cancelling != 1 || row.OldestDue == nil || row.Now.Sub(*row.OldestDue) < time.Minute {
		t.Errorf("FleetQueue, exact: %+v", row)
	}
	if row, err = st.FleetQueue(ctx, pool, "q", 1, since); err != nil {
		t.Fatal(err)
	}
	if row.Unclaimed != 1 || row.Due != 1 || row.Claimed != 1 || row.Dead != 1 || row.Ended != 1 || row.Waiting != 1 {
		t.Errorf("FleetQueue, capped at 1: %+v", row)
	}
	if row, err = st.FleetQueue(ctx, pool, "q", math.MaxInt64, time.Now().Add(time.Hour)); err != nil || row.Ended != 0 {
		t.Errorf("FleetQueue, ended since a future time: %+v, %v", row, err)
	}
	// The last activity: the latest end and death, the schedules.
	if row.LastEnded == nil || row.LastDied == nil || row.Schedules != 0 || row.ScheduleMarked != nil {
		t.Errorf("FleetQueue's last activity: ended %v, died %v, %d schedules marked %v; want an end, a death, no schedule",
			row.LastEnded, row.LastDied, row.Schedules, row.ScheduleMarked)
	}
	exec(`INSERT INTO crdbwork_schedules (queue, name, last_period, updated_at) VALUES ('q', 'a', now(), now() - INTERVAL '1 hour'), ('q', 'b', now(), now() - INTERVAL '2 hours')`)
	if row, err = st.FleetQueue(ctx, pool, "q", math.MaxInt64, since); err != nil || row.Schedules != 2 || row.ScheduleMarked == nil ||
		row.Now.Sub(*row.ScheduleMarked) < time.Hour || row.Now.Sub(*row.ScheduleMarked) > 2*time.Hour {
		t.Errorf("FleetQueue with two schedules: %d, marked %v (now %v), %v", row.Schedules, row.ScheduleMarked, row.Now, err)
	}
	if empty, err := st.FleetQueue(ctx, pool, "none", math.MaxInt64, since); err != nil || empty.LastEnded != nil || empty.LastDied != nil || empty.Schedules != 0 {
		t.Errorf("FleetQueue of an unused queue: %+v, %v", empty, err)
	}
	for range 2 {
		if _, err := st.SessionsCreate(ctx, pool, time.Hour, "h", 1, "w"); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := st.SessionsCreate(ctx, pool, time.Second, "h", 1, "gone")
	if err != nil {
		t.Fatal(err)
	}
	expire(t, pool, gone)
	rows, err := st.FleetLiveSessions(ctx, pool, 2)
	if err != nil || len(rows) != 2 || rows[0].ID.String() >= rows[1].ID.String() || rows[0].Expiry != time.Hour {
		t.Errorf("FleetLiveSessions(2): %+v, %v", rows, err)
	}
	if live, expired, err := st.FleetSessionCounts(ctx, pool); err != nil || live != 3 || expired != 1 {
		t.Errorf("FleetSessionCounts: %d live, %d expired, %v; want 3, 1", live, expired, err)
	}
}

// FleetKinds counts a queue's unclaimed (and due), claimed and dead items
// by kind, the items without one under "", the kinds with the most
// unclaimed items first, at most the limit, and nothing of other queues.
func TestStoreFleetKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := applied(t)
	s, err := st.SessionsCreate(ctx, pool, time.Hour, "h", 1, "w")
	if err != nil {
		t.Fatal(err)
	}
	// queue, kind, vesting ("due", "later"), claimed
	for _, it := range []struct {
		queue, kind, when string
		claimed           bool
	}{
		{"q", "email", "due", false}, {"q", "email", "due", false}, {"q", "email", "later", false}, {"q", "email", "due", true},
		{"q", "sms", "due", false}, {"q", "", "later", false}, {"q", "", "due", true}, {"q", "report", "due", true},
		{"other", "email", "due", false}, {"other", "fax", "due", false},
	} {
		vest := "now() - INTERVAL '1 minute'"
		if it.when == "later" {
			vest = "now() + INTERVAL '1 hour'"
		}
		var claim, kind any
		if it.claimed {
			claim = s
		}
		if it.kind != "" {
			kind = it.kind
		}
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload, claim, lease_until, kind)
			VALUES (gen_random_uuid(), $1, 0, `+vest+`, now(), '\x00'::BYTEA, $2::UUID, CASE WHEN $2::UUID IS NULL THEN NULL ELSE now() + INTERVAL '1 hour' END, $3)`,
			it.queue, claim, kind); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []any{"sms", "sms", "fax", nil} {
		if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_dead_items (id, queue, part, priority, attempts, max_attempts, payload, enqueued_at, kind)
			VALUES (gen_random_uuid(), 'q', 0, 0, 1, 1, '\x00'::BYTEA, now(), $1)`, k); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.FleetKinds(ctx, pool, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range got {
		fmt.Fprintf(&b, "%s:%d/%d/%d/%d/%v ", k.Kind, k.Unclaimed, k.Due, k.Claimed, k.Dead, k.OldestDue != nil)
	}
	// email 3 unclaimed (2 due), 1 claimed; then "" and sms (1 unclaimed
	// each: "" has 1 claimed, sms none); then report (claimed only), fax
	// (dead only).
	want := "email:3/2/1/0/true :1/0/1/1/false sms:1/1/0/2/true report:0/0/1/0/false fax:0/0/0/1/false "
	if b.String() != want {
		t.Errorf("kinds of q:\n got %s\nwant %s", b.String(), want)
	}
	if got, err := st.FleetKinds(ctx, pool, "q", 2); err != nil || len(got) != 2 || got[0].Kind != "email" || got[1].Kind != "" {
		t.Errorf("the first 2 kinds of q: %+v, %v", got, err)
	}
	if got, err := st.FleetKinds(ctx, pool, "none", 10); err != nil || len(got) != 0 {
		t.Errorf("kinds of a queue without items: %+v, %v", got, err)
	}
}
