package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork sequence shows and sets a queue's sequencing, in text and JSON,
// refuses an unknown queue and a bad argument, and says when sequenced
// items are left after "off"; the library sees what it set.
func TestSequence(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	d.enqueue(t, "orders", 1)
	q := d.queue(t, "orders", crsql.Tables{})
	if r := must(t, d.env, "sequence", "--queue", "orders"); !strings.Contains(r.stdout, `"orders" is not sequenced`) {
		t.Errorf("sequence:\n%s", r)
	}
	m := jsonOf(t, must(t, d.env, "sequence", "on", "--queue", "orders", "--json"))
	if m["sequenced"] != true || m["was_sequenced"] != false || m["sequenced_items"] != false {
		t.Errorf("sequence on: %v", m)
	}
	if info, err := readSequencing(q.Settings(ctx)); err != nil || !info.On {
		t.Errorf("after sequence on: %+v, %v", info, err)
	}
	if r := must(t, d.env, "sequence", "on", "--queue", "orders"); !strings.Contains(r.stdout, "already sequenced") {
		t.Errorf("sequence on again:\n%s", r)
	}
	if _, err := q.Enqueue(ctx, claim.NewItem{Key: "k", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// status shows the sequencing, in text and JSON.
	if r := must(t, d.env, "status", "--queue", "orders"); !strings.Contains(r.stdout, "sequenced true") {
		t.Errorf("status of a sequenced queue:\n%s", r)
	}
	if st := jsonOf(t, must(t, d.env, "status", "--queue", "orders", "--json")); st["settings"].(map[string]any)["sequenced"] != true ||
		st["settings"].(map[string]any)["sequenced_items"] != true {
		t.Errorf("status --json of a sequenced queue: settings %v", st["settings"])
	}
	if r := must(t, d.env, "status"); !regexp.MustCompile(`(?m)^orders .*sequenced$`).MatchString(r.stdout) {
		t.Errorf("status of every queue does not mark orders sequenced:\n%s", r)
	}
	r := must(t, d.env, "sequence", "off", "--queue", "orders")
	if !strings.Contains(r.stdout, "is now not sequenced") || !strings.Contains(r.stdout, "still holds sequenced items") {
		t.Errorf("sequence off with a sequenced item left:\n%s", r)
	}
	if info, err := readSequencing(q.Settings(ctx)); err != nil || info.On || !info.Items {
		t.Errorf("after sequence off: %+v, %v", info, err)
	}
	r = must(t, d.env, "status", "--queue", "orders")
	if strings.Contains(r.stdout, "sequenced true") || !strings.Contains(r.stdout, "sequenced items remain") {
		t.Errorf("status after sequence off, with a sequenced item left:\n%s", r)
	}
	if st := jsonOf(t, must(t, d.env, "status", "--queue", "orders", "--json")); st["settings"].(map[string]any)["sequenced"] != false ||
		st["settings"].(map[string]any)["sequenced_items"] != true {
		t.Errorf("status --json after sequence off: settings %v", st["settings"])
	}
	want(t, d.env, 2, []string{"say on, off, hold, advance, blocked or release"}, "sequence", "maybe", "--queue", "orders")
	want(t, d.env, 2, []string{`unknown queue "ordrs"`, `did you mean "orders"?`}, "sequence", "on", "--queue", "ordrs")
	if n := d.count(t, `SELECT count(*) FROM crdbwork_queues WHERE name = 'ordrs'`); n != 0 {
		t.Errorf("sequence on an unknown queue stored a row")
	}
	m = jsonOf(t, must(t, d.env, "sequence", "on", "--queue", "fresh", "--create", "--json"))
	if m["sequenced"] != true {
		t.Errorf("sequence on --create: %v", m)
	}
}

// crdbwork sequence hold / advance / blocked / release: a dead head holds
// its key in a hold queue, blocked lists it (and a head waiting for its
// retry), release lets the key go on, advance releases every held key;
// each in text and JSON, with bad flags refused.
func TestSequenceHoldBlockedRelease(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	must(t, d.env, "sequence", "on", "--queue", "ledger", "--create")
	m := jsonOf(t, must(t, d.env, "sequence", "hold", "--queue", "ledger", "--json"))
	if m["on_death"] != "hold" || m["was"] != "advance" {
		t.Errorf("sequence hold: %v", m)
	}
	if r := must(t, d.env, "sequence", "--queue", "ledger"); !strings.Contains(r.stdout, "on a death a key holds") {
		t.Errorf("sequence shows no hold:\n%s", r)
	}
	q := d.queue(t, "ledger", crsql.Tables{})
	if info, err := readSequencing(q.Settings(ctx)); err != nil || !info.Hold {
		t.Fatalf("after sequence hold: %+v, %v", info, err)
	}
	if st := jsonOf(t, must(t, d.env, "status", "--queue", "ledger", "--json")); st["settings"].(map[string]any)["sequence_on_death"] != "hold" {
		t.Errorf("status --json of a hold queue: settings %v", st["settings"])
	}
	if r := must(t, d.env, "status", "--queue", "ledger"); !strings.Contains(r.stdout, "(on a death: hold)") {
		t.Errorf("status of a hold queue:\n%s", r)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Key: "acct-1", Payload: []byte("1")}, claim.NewItem{Key: "acct-1", Payload: []byte("2")},
		claim.NewItem{Key: "acct-2", Payload: []byte("3")}, claim.NewItem{Key: "acct-2", Payload: []byte("4")})
	if err != nil {
		t.Fatal(err)
	}
	var sid uuid.UUID
	if err := d.pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id`).Scan(&sid); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(sid).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %d items, %v", len(got), err)
	}
	for _, it := range got {
		// acct-2's head retries in an hour, not at the default back-off: it
		// must still wait when the test claims again below, however long
		// the commands in between take on a busy machine.
		cause := claim.RetryAfter(time.Hour, errors.New("insufficient funds"))
		if it.Key == "acct-1" {
			cause = claim.Permanent(errors.New("insufficient funds"))
		}
		if _, err := q.Nack(ctx, it, cause); err != nil {
			t.Fatal(err)
		}
	}
	r := must(t, d.env, "sequence", "blocked", "--queue", "ledger")
	if !strings.Contains(r.stdout, `key "acct-1": held by dead item `+res.IDs[0].String()+" (permanent") ||
		!strings.Contains(r.stdout, `key "acct-2": head `+res.IDs[2].String()+" waits for its retry") ||
		!strings.Contains(r.stdout, "insufficient funds") {
		t.Errorf("sequence blocked:\n%s", r)
	}
	bl := jsonOf(t, must(t, d.env, "sequence", "blocked", "--queue", "ledger", "--json", "--limit", "1"))
	if rows := bl["blocked"].([]any); len(rows) != 1 || rows[0].(map[string]any)["kind"] != "dead" || rows[0].(map[string]any)["id"] != res.IDs[0].String() {
		t.Errorf("sequence blocked --json --limit 1: %v", bl)
	}
	want(t, d.env, 2, []string{"release needs --key"}, "sequence", "release", "--queue", "ledger")
	want(t, d.env, 2, []string{"--key is for release"}, "sequence", "blocked", "--queue", "ledger", "--key", "x")
	want(t, d.env, 2, []string{"--limit is for blocked"}, "sequence", "hold", "--queue", "ledger", "--limit", "3")
	rel := jsonOf(t, must(t, d.env, "sequence", "release", "--queue", "ledger", "--key", "acct-1", "--json"))
	if ids := rel["released"].([]any); len(ids) != 1 || ids[0] != res.IDs[0].String() {
		t.Errorf("sequence release --json: %v", rel)
	}
	if r := must(t, d.env, "sequence", "release", "--queue", "ledger", "--key", "acct-1"); !strings.Contains(r.stdout, "was not held") {
		t.Errorf("sequence release of a free key:\n%s", r)
	}
	if r := must(t, d.env, "sequence", "blocked", "--queue", "ledger"); strings.Contains(r.stdout, "acct-1") {
		t.Errorf("acct-1 still blocked after release:\n%s", r)
	}
	// A second death, released by advance.
	next, err := q.Claimer(sid).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil || len(next) != 1 || next[0].ID != res.IDs[1] {
		t.Fatalf("after release: %v, %v; want acct-1's second item", next, err)
	}
	if _, err := q.Nack(ctx, next[0], claim.Permanent(errors.New("no"))); err != nil {
		t.Fatal(err)
	}
	if r := must(t, d.env, "sequence", "advance", "--queue", "ledger"); !strings.Contains(r.stdout, "now lets a key advance") ||
		!strings.Contains(r.stdout, "released 1 dead item") {
		t.Errorf("sequence advance:\n%s", r)
	}
	if r := must(t, d.env, "sequence", "advance", "--queue", "ledger"); !strings.Contains(r.stdout, "already lets a key advance") {
		t.Errorf("sequence advance again:\n%s", r)
	}
}
