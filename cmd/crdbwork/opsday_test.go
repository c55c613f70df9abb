package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// opsDay is a database as an operator finds it in the morning: several
// queues being worked and items in every state.
type opsDay struct {
	*db
	// reports: drained by its worker overnight (three acked, one dead
	// permanently): only its ended ids and the dead item remain.
	reportsAcked, reportsDead uuid.UUID
	// emails: its worker holds one item (claimed) and goes on working.
	emailsClaimed uuid.UUID
	// pipeline: worked by hand: a prerequisite that died and its two
	// dependents (dead, "dependency died"), a waiting item, an item
	// snoozed too often (dead), one snoozed for an hour (scheduled), a
	// cancelled one, a queued binary payload.
	prereq, dependent, waiting, snoozedOut, snoozed, cancelled, binary uuid.UUID
}

// startWorker runs a worker on queue with handler h until the test ends.
func startWorker(t *testing.T, q *claim.Queue, h worker.Handler) {
	t.Helper()
	hb := await.Stretch(300 * time.Millisecond)
	w, err := worker.New(q, h, worker.Options{Concurrency: 2, Poll: 50 * time.Millisecond,
		Session: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := await.Recv(t, "the worker to stop", done); err != nil {
			t.Errorf("worker of %s: %v", q.Name(), err)
		}
	})
}

func newOpsDay(t *testing.T) *opsDay {
	t.Helper()
	ctx := context.Background()
	o := &opsDay{db: newDB(t, crsql.Tables{})}

	// reports: a worker drains it; "bad" fails permanently.
	reports := o.queue(t, "reports", crsql.Tables{})
	startWorker(t, reports, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if strings.Contains(string(it.Payload), "bad") {
			return nil, claim.Permanent(errors.New("malformed report\n\tat render (report.go:12)"))
		}
		return nil, nil
	})
	res, err := reports.Enqueue(ctx, claim.NewItem{Payload: []byte(`{"report":"sales"}`)}, claim.NewItem{Payload: []byte(`{"report":"stock"}`)},
		claim.NewItem{Payload: []byte(`{"report":"hr"}`)}, claim.NewItem{Payload: []byte(`{"report":"bad"}`)})
	if err != nil {
		t.Fatal(err)
	}
	o.reportsAcked, o.reportsDead = res.IDs[0], res.IDs[3]
	await.Until(t, "the reports worker to drain its queue", func() (bool, string) {
		items, dead := o.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'reports'`), o.count(t, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'reports'`)
		return items == 0 && dead == 1, fmt.Sprintf("%d items, %d dead", items, dead)
	})

	// emails: its worker holds "slow" until the test ends.
	emails := o.queue(t, "emails", crsql.Tables{})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	startWorker(t, emails, func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil, nil
	})
	res, err = emails.Enqueue(ctx, claim.NewItem{Payload: []byte("slow")})
	if err != nil {
		t.Fatal(err)
	}
	o.emailsClaimed = res.IDs[0]
	await.Until(t, "the emails worker to claim its item", func() bool {
		return o.count(t, `SELECT count(*) FROM crdbwork_items WHERE queue = 'emails' AND claim IS NOT NULL`) == 1
	})

	// pipeline, by hand.
	pipeline, err := claim.New(o.pool, claim.Options{Queue: "pipeline", MaxSnoozes: 1})
	if err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, o.pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	claimOne := func(what string) claim.Item {
		t.Helper()
		var got []claim.Item
		await.Until(t, "a claim of "+what, func() error {
			var err error
			got, err = pipeline.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
			if err == nil && len(got) == 0 {
				err = errors.New("nothing claimed")
			}
			return err
		})
		return got[0]
	}
	enq := func(it claim.NewItem) uuid.UUID {
		t.Helper()
		r, err := pipeline.Enqueue(ctx, it)
		if err != nil {
			t.Fatal(err)
		}
		return r.IDs[0]
	}
	o.prereq = enq(claim.NewItem{Payload: []byte("extract")})
	o.dependent = enq(claim.NewItem{Payload: []byte("transform"), After: []uuid.UUID{o.prereq}})
	enq(claim.NewItem{Payload: []byte("load"), After: []uuid.UUID{o.prereq}})
	if _, err := pipeline.Nack(ctx, claimOne("the prerequisite"), claim.Permanent(errors.New("source gone"))); err != nil {
		t.Fatal(err)
	}
	if st, err := queuemaint.For(pipeline).Reap(ctx); err != nil || st.DependencyDead != 2 {
		t.Fatalf("the reap of the dependents: %+v, %v; want 2 dead", st, err)
	}
	o.snoozedOut = enq(claim.NewItem{Payload: []byte("poll")})
	if _, err := pipeline.Snooze(ctx, claimOne("the poll"), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.Snooze(ctx, claimOne("the poll again"), time.Microsecond); err != nil {
		t.Fatal(err)
	}
	o.snoozed = enq(claim.NewItem{Payload: []byte("later")})
	if _, err := pipeline.Snooze(ctx, claimOne("the later one"), time.Hour); err != nil {
		t.Fatal(err)
	}
	pre2 := enq(claim.NewItem{Payload: []byte("extract 2"), Delay: time.Hour})
	o.waiting = enq(claim.NewItem{Payload: []byte("transform 2"), After: []uuid.UUID{pre2}})
	o.cancelled = enq(claim.NewItem{Payload: []byte("oops"), Delay: time.Hour})
	if _, err := pipeline.CancelItem(ctx, o.cancelled, claim.CancelOptions{By: "ops", Reason: "wrong year"}); err != nil {
		t.Fatal(err)
	}
	o.binary = enq(claim.NewItem{Payload: []byte{0xff, 0x00, 0x01}, Delay: time.Hour})
	return o
}

// An operator's morning, with the queues being worked: every command
// answers for a drained queue, every reason is a filter, an item is found
// wherever it is, the audit lists what was done, nothing is a false alarm,
// and destructive commands still ask first.
func TestOperatorsDay(t *testing.T) {
	t.Parallel()
	o := newOpsDay(t)
	e := o.env

	// "Did last night's reports run?": status lists the drained queue, with
	// its last activity, and answers for it.
	r := must(t, e, "status")
	if testing.Verbose() {
		for _, args := range [][]string{{"status"}, {"status", "--queue", "pipeline"}, {"dead", "--queue", "pipeline"}, {"item", o.reportsDead.String()}, {"item", o.emailsClaimed.String()}, {"item", o.binary.String()}, {"item", o.cancelled.String()}} {
			t.Logf("$ crdbwork %s\n%s", strings.Join(args, " "), must(t, e, args...).stdout)
		}
	}
	row := regexp.MustCompile(`(?m)^reports .*$`).FindString(r.stdout)
	if !strings.Contains(r.stdout, "3 queues on") || row == "" || !regexp.MustCompile(`\d+(ms|s|m\d+s) ago`).MatchString(row) {
		t.Errorf("status does not list the drained queue reports with its last activity:\n%s", r)
	}
	r = must(t, e, "status", "--queue", "reports")
	if !strings.Contains(r.stdout, "last activity: ") || !strings.Contains(r.stdout, "1 part, 1 dead item\n") ||
		strings.Contains(r.stdout, "owned by nobody") || !strings.Contains(r.stdout, `parts of "reports": not in use`) {
		t.Errorf("status --queue reports:\n%s", r)
	}
	if s := jsonOf(t, must(t, e, "status", "--queue", "reports", "--json")); s["known"] != true || s["last_ended"] == "" || s["unowned_parts"] != "" {
		t.Errorf("status --queue reports --json: known %v, last_ended %v, unowned_parts %q", s["known"], s["last_ended"], s["unowned_parts"])
	}
	must(t, e, "cancelled", "--queue", "reports")
	if r := must(t, e, "parts", "--queue", "emails"); strings.Contains(r.stdout, "owned by nobody") {
		t.Errorf("parts of a queue worked without parts raises an alarm:\n%s", r)
	}

	// Every reason is a filter; the docs' forms among them.
	count := func(args ...string) string {
		t.Helper()
		return strings.TrimSpace(must(t, e, append([]string{"dead", "--count"}, args...)...).stdout)
	}
	for _, c := range []struct {
		reason, want string
	}{
		{"dependency died", "2"},
		{"dependency died: " + o.prereq.String()[:8], "2"},
		{"dependency died: " + o.prereq.String(), "2"},
		{"snoozed too often", "1"},
		{"permanent", "1"},
		{"failed", "0"},
	} {
		if got := count("--queue", "pipeline", "--reason", c.reason); got != c.want {
			t.Errorf("dead --queue pipeline --reason %q --count: %s, want %s", c.reason, got, c.want)
		}
	}
	want(t, e, 2, []string{`invalid value "dependency died: …" for --reason`, `"snoozed too often"`}, "dead", "--queue", "pipeline", "--reason", "dependency died: …")
	if r := must(t, e, "requeue", "--queue", "pipeline", "--reason", "dependency died", "--dry-run"); !strings.Contains(r.stdout, "would requeue the 2 dead items") {
		t.Errorf("requeue --reason 'dependency died' --dry-run:\n%s", r)
	}

	// dead shows payloads as text.
	r = must(t, e, "dead", "--queue", "reports")
	if !strings.Contains(r.stdout, `{"report":"bad"}`) || strings.Contains(r.stdout, `\"`) || !strings.Contains(r.stdout, "1 dead item ") {
		t.Errorf("dead --queue reports does not show the payload as text:\n%s", r)
	}
	if d := jsonOf(t, must(t, e, "dead", "--queue", "reports", "--json")); !strings.Contains(fmt.Sprint(d["items"]), `payload_text:{"report":"bad"}`) {
		t.Errorf("dead --json has no payload_text: %v", d["items"])
	}

	// One item, wherever it is.
	for _, c := range []struct {
		id    uuid.UUID
		state string
		texts []string
	}{
		{o.reportsAcked, "acked", []string{`acked in queue "reports"`, "ended: acked"}},
		{o.reportsDead, "dead", []string{`dead in queue "reports"`, "permanent", "malformed report", "at render (report.go:12)", `"report": "bad"`}},
		{o.emailsClaimed, "claimed", []string{`claimed in queue "emails"`, "claimed by:", "session", "lease until", "attempts:    1 of 25", "slow"}},
		{o.prereq, "dead", []string{"permanent", "source gone", "extract"}},
		{o.dependent, "dead", []string{"dependency died: " + o.prereq.String(), "transform"}},
		{o.waiting, "waiting", []string{`waiting in queue "pipeline"`, "1 prerequisite not yet acked", "transform 2"}},
		{o.snoozedOut, "dead", []string{"snoozed too often"}},
		{o.snoozed, "scheduled", []string{"scheduled (snoozed)", "snoozed:     1 time", "due:"}},
		{o.cancelled, "cancelled", []string{`cancelled in queue "pipeline"`, "by ops: wrong year (before it ran)"}},
		{o.binary, "scheduled", []string{"3 bytes, not UTF-8 text", "ff 00 01"}},
	} {
		r := must(t, e, "item", c.id.String())
		for _, s := range c.texts {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("item %s (%s) does not say %q:\n%s", c.id, c.state, s, r.stdout)
			}
		}
		j := jsonOf(t, must(t, e, "item", "--json", c.id.String()))
		if j["state"] != c.state || j["id"] != c.id.String() {
			t.Errorf("item --json %s: state %v, want %s", c.id, j["state"], c.state)
		}
		h, ok := j["history"].([]any)
		if !ok || j["history_recorded"] != true || !strings.Contains(r.stdout, "history: ") {
			t.Errorf("item %s: history %v, recorded %v; want a recorded history:\n%s", c.id, j["history"], j["history_recorded"], r.stdout)
			continue
		}
		// The last attempt's outcome, where the state says it.
		last := map[string]string{"acked": "succeeded", "claimed": "running"}[c.state]
		if last != "" && (len(h) == 0 || h[len(h)-1].(map[string]any)["outcome"] != last) {
			t.Errorf("item --json %s (%s): history %v; want its last attempt %s", c.id, c.state, h, last)
		}
	}
	if j := jsonOf(t, must(t, e, "item", "--json", o.binary.String())); fmt.Sprint(j["item"].(map[string]any)["payload"]) != "map[base64:/wAB size:3]" {
		t.Errorf("item --json of a binary payload: %v", j["item"])
	}
	if j := jsonOf(t, must(t, e, "item", "--json", o.reportsDead.String())); !strings.Contains(fmt.Sprint(j["deaths"]), `text:{"report":"bad"}`) {
		t.Errorf("item --json of a dead item: deaths %v", j["deaths"])
	}
	want(t, e, 1, []string{"is not in the items, waiting items, dead items or any queue's ended ids"}, "item", uuid.NewString())
	want(t, e, 1, []string{`queue "emails"'s ended ids`}, "item", "--queue", "emails", o.reportsAcked.String())
	want(t, e, 2, []string{"is not an item id"}, "item", "nope")

	// deps on an item that is not waiting says where it is.
	r = must(t, e, "deps", "--queue", "pipeline", o.prereq.String())
	if !strings.Contains(r.stdout, `is not waiting: it is dead in queue "pipeline" (reason "permanent")`) || !strings.Contains(r.stdout, "no item waits for it") {
		t.Errorf("deps of the dead prerequisite:\n%s", r)
	}
	if j := jsonOf(t, must(t, e, "deps", "--queue", "pipeline", "--json", o.emailsClaimed.String())); j["state"] != "claimed" || j["state_queue"] != "emails" {
		t.Errorf("deps --json of the claimed email: %v", j)
	}

	// What was done today is in the audit list, filtered and paged.
	must(t, e, "pause", "--queue", "pipeline")
	must(t, e, "resume", "--queue", "pipeline")
	must(t, e, "pause", "--queue", "emails")
	r = must(t, e, "audit", "--queue", "pipeline")
	if !strings.Contains(r.stdout, "resume") || !strings.Contains(r.stdout, "pause") || strings.Contains(r.stdout, "emails") ||
		strings.Index(r.stdout, "resume") > strings.Index(r.stdout, "pause") {
		t.Errorf("audit --queue pipeline (newest first):\n%s", r)
	}
	page := jsonOf(t, must(t, e, "audit", "--action", "pause", "--limit", "1", "--since", "1h", "--json"))
	rows := page["rows"].([]any)
	if len(rows) != 1 || rows[0].(map[string]any)["queue"] != "emails" || page["next"] == "" {
		t.Fatalf("audit --action pause --limit 1: %v", page)
	}
	page = jsonOf(t, must(t, e, "audit", "--action", "pause", "--limit", "1", "--after", page["next"].(string), "--json"))
	if rows := page["rows"].([]any); len(rows) != 1 || rows[0].(map[string]any)["queue"] != "pipeline" || page["next"] != "" {
		t.Errorf("audit's second page: %v", page)
	}
	if r := must(t, e, "audit", "--actor", "nobody"); !strings.Contains(r.stdout, "no audit rows match") {
		t.Errorf("audit --actor nobody:\n%s", r)
	}
	want(t, e, 2, []string{"is not a cursor"}, "audit", "--after", "xyz")

	// Destructive commands still ask first, and change nothing.
	before := o.snapshot(t, "reports")
	want(t, e, 2, []string{"--yes"}, "purge", "--queue", "reports")
	want(t, e, 2, []string{"--yes"}, "requeue", "--queue", "pipeline", "--reason", "dependency died")
	if after := o.snapshot(t, "reports"); after != before {
		t.Errorf("a refused purge changed reports: %s, then %s", before, after)
	}
}
