package main

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// crdbwork deps shows a waiting item's prerequisites of another queue
// with that queue, and, from the prerequisite's queue, the items of other
// queues that wait for it.
func TestDepsCommandAcrossQueues(t *testing.T) {
	t.Parallel()
	d := newDB(t, crsql.Tables{})
	ctx := context.Background()
	qa, err := claim.New(d.pool, claim.Options{Queue: "fetch"})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := claim.New(d.pool, claim.Options{Queue: "publish"})
	if err != nil {
		t.Fatal(err)
	}
	other, dep := uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: other, Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Enqueue(ctx, claim.NewItem{ID: dep, Payload: []byte("d"), AfterIn: []claim.Prereq{{Queue: "fetch", ID: other}}}); err != nil {
		t.Fatal(err)
	}
	j := jsonOf(t, must(t, d.env, "deps", "--queue", "publish", "--json", dep.String()))
	prereqs, _ := j["prereqs"].([]any)
	if j["waiting"] != true || len(prereqs) != 1 {
		t.Fatalf("deps --json of the dependent: %v", j)
	}
	if p := prereqs[0].(map[string]any); p["id"] != other.String() || p["queue"] != "fetch" || p["state"] != "queued" {
		t.Errorf("deps --json: the prerequisite %v; want fetch's, queued", p)
	}
	if r := must(t, d.env, "deps", "--queue", "publish", dep.String()); !strings.Contains(r.stdout, "after "+other.String()+"  queued  (queue \"fetch\")") {
		t.Errorf("deps of the dependent:\n%s", r)
	}
	ja := jsonOf(t, must(t, d.env, "deps", "--queue", "fetch", "--json", other.String()))
	in, _ := ja["dependents_in"].([]any)
	if deps, _ := ja["dependents"].([]any); len(deps) != 0 || len(in) != 1 || in[0].(map[string]any)["queue"] != "publish" || in[0].(map[string]any)["id"] != dep.String() {
		t.Errorf("deps --json of the prerequisite: %v; want the dependent of publish in dependents_in alone", ja)
	}
	if r := must(t, d.env, "deps", "--queue", "fetch", other.String()); !strings.Contains(r.stdout, "1 item waits for it") || !strings.Contains(r.stdout, dep.String()+"  (queue \"publish\")") {
		t.Errorf("deps of the prerequisite:\n%s", r)
	}
}
