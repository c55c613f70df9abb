package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// An id that died twice is listed twice by `dead`, each death with its key;
// `requeue ID` refuses while the id is live and keeps the dead items,
// `requeue ID --death` takes the death given, and `requeue --all` requeues
// each dead id once and counts the live ones it skipped.
func TestDeadListsEveryDeath(t *testing.T) {
	t.Parallel()
	_, env, pool := migrated(t)
	ctx := context.Background()
	id := makeDead(t, pool, "q2", 1)[0]
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, dedup_window) VALUES ('q2', INTERVAL '0 seconds')
		ON CONFLICT (name) DO UPDATE SET dedup_window = excluded.dedup_window`); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "q2"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("second life")}); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(sess.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d, %v", len(got), err)
	}
	if _, err := q.Nack(ctx, got[0], claim.Permanent(errors.New("second death"))); err != nil {
		t.Fatal(err)
	}

	var dead struct {
		Total int `json:"total"`
		Items []struct {
			ID        string `json:"id"`
			Death     string `json:"death"`
			LastError string `json:"last_error"`
		} `json:"items"`
	}
	jsonOut(t, op(t, time.Minute, env, "dead", "--queue", "q2", "--json"), &dead)
	if dead.Total != 2 || len(dead.Items) != 2 || dead.Items[0].ID != id.String() || dead.Items[1].ID != id.String() ||
		dead.Items[0].Death == dead.Items[1].Death || dead.Items[0].LastError != "second death" {
		t.Fatalf("dead --json: %+v; want both deaths of %s, the newest first, each with its key", dead, id)
	}
	newest, oldest := dead.Items[0].Death, dead.Items[1].Death
	if r := op(t, time.Minute, env, "dead", "--queue", "q2"); r.code != 0 || !strings.Contains(r.stdout, "DEATH") ||
		!strings.Contains(r.stdout, newest) || !strings.Contains(r.stdout, oldest) {
		t.Errorf("dead: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Live again: refused, nothing moves.
	if _, err := q.Enqueue(ctx, claim.NewItem{ID: id, Payload: []byte("third life")}); err != nil {
		t.Fatal(err)
	}
	wantExit(t, op(t, time.Minute, env, "requeue", id.String(), "--queue", "q2"), 1, "items table")
	var all struct {
		Requeued int `json:"requeued"`
		Live     int `json:"live"`
	}
	jsonOut(t, op(t, time.Minute, env, "requeue", "--all", "--queue", "q2", "--yes", "--json"), &all)
	if all.Requeued != 0 || all.Live != 1 {
		t.Errorf("requeue --all with the id live: %+v, want 0 requeued, 1 live", all)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id); n != 2 {
		t.Fatalf("%d deaths after refused requeues, want 2", n)
	}

	// Ended: the older death by its key, then the other with --all.
	if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	wantExit(t, op(t, time.Minute, env, "requeue", id.String(), "--death", "not-a-uuid", "--queue", "q2"), 2, "not a death key")
	wantExit(t, op(t, time.Minute, env, "requeue", "--all", "--death", oldest, "--queue", "q2"), 2, "not --all")
	wantExit(t, op(t, time.Minute, env, "requeue", id.String(), "--death", uuid.New().String(), "--queue", "q2"), 1, "has no death")
	if r := op(t, time.Minute, env, "requeue", id.String(), "--death", oldest, "--queue", "q2"); r.code != 0 {
		t.Fatalf("requeue --death: exit status %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1 AND death = $2`, id, newest); n != 1 ||
		countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE id = $1`, id) != 1 {
		t.Fatal("requeue --death did not take exactly the death given")
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_items WHERE id = $1 AND payload = 'poison'`, id); n != 1 {
		t.Fatal("the requeued item is not the older death's")
	}
	if ok, err := cancelFound(q.CancelItem(ctx, id, claim.CancelOptions{})); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	jsonOut(t, op(t, time.Minute, env, "requeue", "--all", "--queue", "q2", "--yes", "--json"), &all)
	if all.Requeued != 1 || all.Live != 0 {
		t.Errorf("requeue --all: %+v, want 1 requeued", all)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM crdbwork_dead_items WHERE queue = 'q2'`); n != 0 {
		t.Errorf("%d dead items of q2 left, want 0", n)
	}
}
