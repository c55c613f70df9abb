package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/metrics"
	"github.com/crdbwork/crdbwork/partition"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// fleetFigures are one queue's numbers as one view shows them; -1: the
// view does not show it.
type fleetFigures struct {
	unclaimed, due, claimed, dead, waiting, snoozed, cancelling int64
	parts                                                       map[int]int64 // unclaimed by part
	owned, unowned                                              int64         // parts owned, parts below num_parts owned by nobody
}

func unknownFigures() fleetFigures {
	return fleetFigures{-1, -1, -1, -1, -1, -1, -1, nil, -1, -1}
}

// The fleet's three views, crdbwork status --json, the dashboard's pages
// and the metrics collector's gauges, show the same numbers for one
// database state, and those are the tables' own counts (the metrics have
// no tenants: status and the dashboard's tenants page agree on those; the
// backlog by kind of status --by-kind, the queue page and the gauges by
// kind agree too): several queues
// (one with stored parts, items in every state: due, scheduled, claimed,
// snoozed, asked to stop, waiting, dead; one with dead items only; one
// with a stored part count only), a live session and an expired one not
// yet reaped that still owns a part, holds an item and is a member.
func TestFleetViewsAgree(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	// The sessions are rows of their own, with no process behind them:
	// nothing heartbeats or reaps while the views read.
	newSession := func(name string) uuid.UUID {
		var id uuid.UUID
		if err := d.pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry, host, pid, name)
			VALUES (INTERVAL '1 hour', 'h', 1, $1) RETURNING id`, name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := d.pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	live, gone := newSession("live"), newSession("gone")

	// alpha: 4 parts, 10 due items, 2 scheduled, 3 claimed of which one
	// snoozed back and one asked to stop, a waiting item, 2 dead items.
	if err := partition.SetParts(ctx, d.pool, crsql.Tables{}, "alpha", 4); err != nil {
		t.Fatal(err)
	}
	alpha := d.queue(t, "alpha", crsql.Tables{})
	var items []claim.NewItem
	for i := range 10 {
		items = append(items, claim.NewItem{Key: fmt.Sprint("k", i), Tenant: []string{"t1", "t2"}[i%2], Kind: []string{"mail", "sms", ""}[i%3], Payload: []byte("x")})
	}
	items = append(items, claim.NewItem{Payload: []byte("later"), Kind: "mail", Delay: time.Hour}, claim.NewItem{Payload: []byte("later"), Delay: time.Hour})
	res, err := alpha.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.Enqueue(ctx, claim.NewItem{Payload: []byte("after"), After: []uuid.UUID{res.IDs[0]}}); err != nil {
		t.Fatal(err)
	}
	claimed, err := alpha.Claimer(live).Claim(ctx, claim.ClaimRequest{Max: 3})
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claiming 3 items of alpha: %v, %d items", err, len(claimed))
	}
	if _, err := alpha.Snooze(ctx, claimed[0], time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := alpha.CancelItem(ctx, claimed[1].ID, claim.CancelOptions{By: "test"}); err != nil {
		t.Fatal(err)
	}
	d.kill(t, "alpha", 2)
	exec(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'alpha', 0), ($1, 'alpha', 1)`, live)
	exec(`INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ('alpha', $1)`, live)

	// beta: 2 parts, 5 items, one held by the session that then expires,
	// which keeps part 1 and its membership until a peer reaps it.
	if err := partition.SetParts(ctx, d.pool, crsql.Tables{}, "beta", 2); err != nil {
		t.Fatal(err)
	}
	beta := d.queue(t, "beta", crsql.Tables{})
	for i := range 5 {
		if _, err := beta.Enqueue(ctx, claim.NewItem{Key: fmt.Sprint("b", i), Payload: []byte("y")}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := beta.Claimer(gone).Claim(ctx, claim.ClaimRequest{Max: 1}); err != nil || len(got) != 1 {
		t.Fatalf("claiming an item of beta: %v, %d items", err, len(got))
	}
	exec(`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ($1, 'beta', 1)`, gone)
	exec(`INSERT INTO crdbwork_session_queues (queue, session_id) VALUES ('beta', $1)`, gone)
	exec(`UPDATE crdbwork_sessions SET expiry = INTERVAL '1 second', heartbeat_at = now() - INTERVAL '1 hour' WHERE id = $1`, gone)

	// gamma: dead items only; delta: a stored part count only.
	d.kill(t, "gamma", 3)
	if err := partition.SetParts(ctx, d.pool, crsql.Tables{}, "delta", 3); err != nil {
		t.Fatal(err)
	}
	queues := []string{"alpha", "beta", "delta", "gamma"}

	// The tables' own counts.
	tables := map[string]fleetFigures{}
	for _, q := range queues {
		c := func(query string) int64 { return int64(d.count(t, query, q)) }
		f := fleetFigures{
			unclaimed:  c(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL`),
			due:        c(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND vesting_at <= now()`),
			claimed:    c(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NOT NULL`),
			dead:       c(`SELECT count(*) FROM crdbwork_dead_items WHERE queue = $1`),
			waiting:    c(`SELECT count(*) FROM crdbwork_waiting WHERE queue = $1`),
			snoozed:    c(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL AND snoozes > 0`),
			cancelling: c(`SELECT count(*) FROM crdbwork_items WHERE queue = $1 AND cancel_requested_at IS NOT NULL`),
			owned:      c(`SELECT count(*) FROM crdbwork_session_parts WHERE queue = $1`),
			unowned: c(`SELECT count(*) FROM crdbwork_queues AS q, generate_series(0, q.num_parts - 1) AS p(part)
				WHERE q.name = $1 AND NOT EXISTS (SELECT 1 FROM crdbwork_session_parts AS o WHERE o.queue = q.name AND o.part = p.part)
				AND EXISTS (SELECT 1 FROM crdbwork_session_parts AS o WHERE o.queue = q.name)`), // only where a session works it in parts mode
			parts: map[int]int64{},
		}
		rows, err := d.pool.Query(ctx, `SELECT part, count(*) FROM crdbwork_items WHERE queue = $1 AND claim IS NULL GROUP BY part`, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var p, n int64
			if err := rows.Scan(&p, &n); err != nil {
				t.Fatal(err)
			}
			f.parts[int(p)] = n
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		tables[q] = f
	}
	liveSessions := int64(d.count(t, `SELECT count(*) FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now()`))
	expiredSessions := int64(d.count(t, `SELECT count(*) FROM crdbwork_sessions WHERE heartbeat_at + expiry < now()`))
	tenants := map[string][2]int64{}
	for _, tn := range []string{"t1", "t2"} {
		tenants[tn] = [2]int64{
			int64(d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'alpha' AND tenant = $1 AND claim IS NULL`, tn)),
			int64(d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'alpha' AND tenant = $1 AND claim IS NULL AND vesting_at <= now()`, tn)),
		}
	}
	// alpha's unclaimed and due items by kind ("": none), kinds with
	// unclaimed items only (the views may or may not list a kind whose
	// items are all claimed or dead).
	kinds := map[string][2]int64{}
	for _, k := range []string{"mail", "sms", ""} {
		kinds[k] = [2]int64{
			int64(d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'alpha' AND coalesce(kind, '') = $1 AND claim IS NULL`, k)),
			int64(d.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'alpha' AND coalesce(kind, '') = $1 AND claim IS NULL AND vesting_at <= now()`, k)),
		}
	}
	if kinds["mail"][0] == kinds["mail"][1] || len(kinds) != 3 || kinds["sms"][0] == 0 || kinds[""][0] == 0 {
		t.Fatalf("the kinds built: alpha's (unclaimed, due) by kind %v; want three kinds, one with an item not due", kinds)
	}
	// The state is what the test meant to build: every state present.
	if a := tables["alpha"]; a.unclaimed != 10 || a.due != 7 || a.claimed != 2 || a.dead != 2 || a.waiting != 1 ||
		a.snoozed != 1 || a.cancelling != 1 || a.owned != 2 || a.unowned != 2 || liveSessions != 1 || expiredSessions != 1 {
		t.Fatalf("the state built: alpha %+v, %d live sessions, %d expired", a, liveSessions, expiredSessions)
	}

	status := readStatusViews(t, d)
	dash := readDashboardViews(t, d)
	gauges := readMetricsViews(t, d)
	for _, q := range queues {
		want := tables[q]
		for _, view := range []struct {
			name string
			got  fleetFigures
		}{{"status --json", status.queues[q]}, {"dashboard", dash.queues[q]}, {"metrics", gauges.queues[q]}} {
			got := view.got
			check := func(what string, g, w int64) {
				t.Helper()
				if g != -1 && g != w {
					t.Errorf("%s, queue %s: %s %d, the tables hold %d", view.name, q, what, g, w)
				}
			}
			check("unclaimed", got.unclaimed, want.unclaimed)
			check("due", got.due, want.due)
			check("claimed", got.claimed, want.claimed)
			check("dead", got.dead, want.dead)
			check("waiting", got.waiting, want.waiting)
			check("snoozed", got.snoozed, want.snoozed)
			check("cancelling", got.cancelling, want.cancelling)
			check("owned parts", got.owned, want.owned)
			check("unowned parts", got.unowned, want.unowned)
			if got.parts != nil {
				for p, n := range want.parts {
					check(fmt.Sprintf("unclaimed of part %d", p), got.parts[p], n)
				}
				for p, n := range got.parts {
					check(fmt.Sprintf("unclaimed of part %d", p), n, want.parts[p])
				}
			}
		}
	}
	for name, v := range map[string]fleetViews{"status --json": status, "dashboard": dash, "metrics": gauges} {
		if v.sessions != liveSessions || v.expired != expiredSessions {
			t.Errorf("%s: %d live and %d expired sessions, the tables hold %d and %d", name, v.sessions, v.expired, liveSessions, expiredSessions)
		}
	}
	for name, ts := range map[string]map[string][2]int64{"status --json": status.tenants, "dashboard": dash.tenants} {
		if !reflect.DeepEqual(ts, tenants) {
			t.Errorf("%s: alpha's tenants (unclaimed, due) %v, the tables hold %v", name, ts, tenants)
		}
	}
	for name, ks := range map[string]map[string][2]int64{"status --by-kind --json": status.kinds, "dashboard": dash.kinds, "metrics": gauges.kinds} {
		if !reflect.DeepEqual(ks, kinds) {
			t.Errorf("%s: alpha's kinds (unclaimed, due) %v, the tables hold %v", name, ks, kinds)
		}
	}
	for name, qs := range map[string]map[string]fleetFigures{"status --json": status.queues, "dashboard": dash.queues} {
		if len(qs) != len(queues) {
			t.Errorf("%s lists %d queues, want %v", name, len(qs), queues)
		}
	}
}

// fleetViews are the numbers of one view.
type fleetViews struct {
	queues            map[string]fleetFigures
	sessions, expired int64
	// tenants are alpha's tenants: unclaimed and due items by tenant.
	tenants map[string][2]int64
	// kinds are alpha's kinds with unclaimed items: unclaimed and due
	// items by kind ("": none).
	kinds map[string][2]int64
}

// readStatusViews reads crdbwork status --json.
func readStatusViews(t *testing.T, d *db) fleetViews {
	t.Helper()
	all := jsonOf(t, must(t, d.env, "status", "--json"))
	v := fleetViews{queues: map[string]fleetFigures{}, kinds: map[string][2]int64{}}
	for _, x := range jsonOf(t, must(t, d.env, "status", "--by-kind", "--json"))["queues"].([]any) {
		s := x.(map[string]any)
		if s["queue"] != "alpha" {
			continue
		}
		ks, _ := s["kinds"].([]any)
		for _, k := range ks {
			km := k.(map[string]any)
			if u, _ := km["unclaimed"].(float64); u > 0 {
				due, _ := km["due"].(float64)
				v.kinds[km["kind"].(string)] = [2]int64{int64(u), int64(due)}
			}
		}
	}
	ss, _ := all["sessions"].([]any)
	v.sessions = int64(len(ss))
	if n, _ := all["live_sessions"].(float64); int64(n) != v.sessions {
		t.Errorf("status --json: live_sessions %v, %d sessions listed", all["live_sessions"], v.sessions)
	}
	x, ok := all["expired_sessions"].(float64)
	if !ok {
		t.Fatalf("status --json: expired_sessions is %v", all["expired_sessions"])
	}
	v.expired = int64(x)
	n := func(m map[string]any, k string) int64 {
		x, ok := m[k].(float64)
		if !ok {
			t.Fatalf("status --json: %q is %v", k, m[k])
		}
		return int64(x)
	}
	for _, x := range all["queues"].([]any) {
		s := x.(map[string]any)
		f := unknownFigures()
		f.unclaimed, f.due, f.claimed = 0, 0, 0
		for _, tot := range s["queues"].([]any) {
			tm := tot.(map[string]any)
			f.unclaimed, f.due, f.claimed = n(tm, "unclaimed"), n(tm, "vested"), n(tm, "claimed")
		}
		f.dead, f.waiting, f.snoozed, f.cancelling = n(s, "dead"), n(s, "waiting"), n(s, "snoozed"), n(s, "cancelling")
		f.parts = map[int]int64{}
		for _, b := range s["backlog"].([]any) {
			bm := b.(map[string]any)
			if u := n(bm, "unclaimed"); u > 0 {
				f.parts[int(n(bm, "part"))] = u
			}
		}
		f.owned = 0
		for _, o := range s["part_owners"].([]any) {
			f.owned += n(o.(map[string]any), "count")
		}
		f.unowned = int64(len(expandRanges(t, s["unowned_parts"].(string))))
		v.queues[s["queue"].(string)] = f
		if s["queue"] == "alpha" {
			v.tenants = map[string][2]int64{}
			for _, x := range s["tenants"].([]any) {
				tm := x.(map[string]any)
				v.tenants[tm["tenant"].(string)] = [2]int64{n(tm, "unclaimed"), n(tm, "due")}
			}
		}
	}
	return v
}

// expandRanges reads a part list as status writes it ("0-3,8").
func expandRanges(t *testing.T, r string) []int {
	t.Helper()
	var out []int
	if r == "" {
		return nil
	}
	for _, x := range strings.Split(r, ",") {
		lo, hi, found := strings.Cut(x, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			t.Fatalf("part list %q: %v", r, err)
		}
		z := a
		if found {
			if z, err = strconv.Atoi(hi); err != nil {
				t.Fatalf("part list %q: %v", r, err)
			}
		}
		for p := a; p <= z; p++ {
			out = append(out, p)
		}
	}
	return out
}

// readDashboardViews reads the dashboard's overview and sessions pages.
func readDashboardViews(t *testing.T, d *db) fleetViews {
	t.Helper()
	h, err := dashboard.New(d.pool, dashboard.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %v, %s\n%s", path, err, resp.Status, b)
		}
		return string(b)
	}
	num := func(s string) int64 {
		t.Helper()
		s = strings.ReplaceAll(strings.TrimSpace(regexp.MustCompile(`<[^>]+>`).ReplaceAllString(s, "")), ",", "")
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("dashboard: %q is not a count", s)
		}
		return n
	}
	v := fleetViews{queues: map[string]fleetFigures{}}
	overview := get("/")
	rows := regexp.MustCompile(`(?s)<tr data-queue="([^"]+)">(.*?)</tr>`).FindAllStringSubmatch(overview, -1)
	cell := regexp.MustCompile(`(?s)<td data-k="([a-z]+)"[^>]*>(.*?)</td>`)
	for _, r := range rows {
		f := unknownFigures()
		for _, c := range cell.FindAllStringSubmatch(r[2], -1) {
			switch c[1] {
			case "unclaimed":
				f.unclaimed = num(c[2])
			case "due":
				f.due = num(c[2])
			case "claimed":
				f.claimed = num(c[2])
			case "dead":
				f.dead = num(c[2])
			}
		}
		v.queues[r[1]] = f
	}
	m := regexp.MustCompile(`id="total-sessions">(\d+)<`).FindStringSubmatch(overview)
	if m == nil {
		t.Fatalf("dashboard: no session count in the overview:\n%s", overview)
	}
	v.sessions, _ = strconv.ParseInt(m[1], 10, 64)
	if m := regexp.MustCompile(`id="total-expired"[^>]*>(\d+) expired<`).FindStringSubmatch(overview); m != nil {
		v.expired, _ = strconv.ParseInt(m[1], 10, 64)
	}
	// The part maps: owned and unowned parts of the queues with parts.
	sessions := get("/sessions")
	for _, pm := range regexp.MustCompile(`(?s)<section class="partmap" data-queue="([^"]+)">(.*?)</section>`).FindAllStringSubmatch(sessions, -1) {
		f, ok := v.queues[pm[1]]
		if !ok {
			t.Errorf("dashboard: a part map of %q, a queue the overview does not list", pm[1])
			continue
		}
		f.unowned = 0
		if u := regexp.MustCompile(`data-k="unowned">(\d+) owned by nobody`).FindStringSubmatch(pm[2]); u != nil {
			f.unowned, _ = strconv.ParseInt(u[1], 10, 64)
		}
		v.queues[pm[1]] = f
	}
	v.kinds = map[string][2]int64{}
	queuePage := get("/queue?name=alpha")
	for _, r := range regexp.MustCompile(`(?s)<tr data-kind="([^"]*)">(.*?)</tr>`).FindAllStringSubmatch(queuePage, -1) {
		cells := regexp.MustCompile(`(?s)<td>(.*?)</td>`).FindAllStringSubmatch(r[2], -1)
		if len(cells) < 3 {
			t.Fatalf("dashboard: kind row %q has %d cells", r[1], len(cells))
		}
		if u := num(cells[1][1]); u > 0 {
			v.kinds[r[1]] = [2]int64{u, num(cells[2][1])}
		}
	}
	v.tenants = map[string][2]int64{}
	tenants := get("/tenants?queue=alpha")
	for _, r := range regexp.MustCompile(`(?s)<tr data-tenant="([^"]+)">(.*?)</tr>`).FindAllStringSubmatch(tenants, -1) {
		cells := regexp.MustCompile(`(?s)<td [^>]*data-label="(unclaimed|due)"[^>]*>(.*?)</td>`).FindAllStringSubmatch(r[2], -1)
		if len(cells) != 2 {
			t.Fatalf("dashboard: tenant row %q has %d count cells", r[1], len(cells))
		}
		v.tenants[r[1]] = [2]int64{num(cells[0][2]), num(cells[1][2])}
	}
	return v
}

// readMetricsViews gathers the metrics collector's database gauges.
func readMetricsViews(t *testing.T, d *db) fleetViews {
	t.Helper()
	c := metrics.New(metrics.Options{DB: d.pool, QueryTimeout: await.Stretch(metrics.DefaultQueryTimeout), BacklogByKind: true})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.LastDatabaseError(); err != nil {
		t.Fatalf("metrics: %v", err)
	}
	v := fleetViews{queues: map[string]fleetFigures{}, expired: -1, kinds: map[string][2]int64{}}
	get := func(q string) fleetFigures {
		f, ok := v.queues[q]
		if !ok {
			f = unknownFigures()
			// A gauge left out is 0 (dead items: only queues that have
			// some; the others: queues with a row or items).
			f.unclaimed, f.due, f.claimed, f.dead, f.waiting, f.parts = 0, 0, 0, 0, 0, map[int]int64{}
		}
		return f
	}
	for _, fam := range fams {
		for _, m := range fam.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			val := int64(gaugeValue(m))
			q := labels["queue"]
			switch fam.GetName() {
			case "crdbwork_sessions_live":
				v.sessions = val
				continue
			case "crdbwork_sessions_expired":
				v.expired = val
				continue
			case "crdbwork_kind_backlog_items", "crdbwork_kind_backlog_due_items":
				if q == "alpha" {
					k := v.kinds[labels["kind"]]
					if fam.GetName() == "crdbwork_kind_backlog_items" {
						k[0] = val
					} else {
						k[1] = val
					}
					v.kinds[labels["kind"]] = k
				}
				continue
			case "crdbwork_backlog_items", "crdbwork_backlog_due_items", "crdbwork_claimed_items", "crdbwork_dead_items", "crdbwork_waiting_items":
			default:
				continue
			}
			f := get(q)
			switch fam.GetName() {
			case "crdbwork_backlog_items":
				f.unclaimed += val
				p, _ := strconv.Atoi(labels["part"])
				if val > 0 {
					f.parts[p] = val
				}
			case "crdbwork_backlog_due_items":
				f.due += val
			case "crdbwork_claimed_items":
				f.claimed = val
			case "crdbwork_dead_items":
				f.dead = val
			case "crdbwork_waiting_items":
				f.waiting = val
			}
			v.queues[q] = f
		}
	}
	for k, n := range v.kinds {
		if n[0] == 0 { // the views compared list kinds with unclaimed items
			delete(v.kinds, k)
		}
	}
	return v
}

func gaugeValue(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}
