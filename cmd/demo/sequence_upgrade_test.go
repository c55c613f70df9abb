package main

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

// TestSequenceHoldUnderPreviousReleaseWorkers: on a database at this
// schema, a sequenced queue holds on a death, and a key's head died under
// this code (the key is held). The previous release's workers (schema
// version 5: sequenced claims without the hold test) run the held key's
// later items (the key advances: docs/sequences.md, "Rolling upgrades"),
// one at a time and in order; the hold stays listed until this code
// requeues the dead head, which an old worker then runs once. Every item
// runs exactly once; no old worker exits.
func TestSequenceHoldUnderPreviousReleaseWorkers(t *testing.T) {
	t.Parallel()
	old := previousDemo(t)
	url := testschema.NewURL(t)
	f := newFleet(t, url)
	f.demoTables()
	ctx := context.Background()
	q, err := claim.New(f.pool, claim.Options{Queue: upgradeQueue})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		t.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
		t.Fatal(err)
	}
	var items []claim.NewItem
	for i := range 4 {
		items = append(items, claim.NewItem{Key: "k", Payload: []byte{byte('0' + i)}})
	}
	items = append(items, claim.NewItem{Key: "j", Payload: []byte("5")}, claim.NewItem{Key: "j", Payload: []byte("6")})
	res, err := q.Enqueue(ctx, items...)
	if err != nil {
		t.Fatal(err)
	}
	// k's head dies under this code: k is held.
	var sid uuid.UUID
	if err := f.pool.QueryRow(ctx, `INSERT INTO crdbwork_sessions (expiry) VALUES (INTERVAL '1 hour') RETURNING id`).Scan(&sid); err != nil {
		t.Fatal(err)
	}
	got, err := q.Claimer(sid).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(got) != 1 || got[0].ID != res.IDs[0] {
		t.Fatalf("claim of k's head: %v, %v", got, err)
	}
	if out, err := q.Nack(ctx, got[0], claim.Permanent(errors.New("poison"))); err != nil || out != claim.Dead {
		t.Fatalf("nack: %v, %v", out, err)
	}
	if _, err := f.pool.Exec(ctx, `DELETE FROM crdbwork_sessions WHERE id = $1`, sid); err != nil {
		t.Fatal(err)
	}
	f.start(old, "old-1")
	f.start(old, "old-2")
	rest := res.IDs[1:]
	ran := func(ids []uuid.UUID) int {
		return f.count(`SELECT count(*) FROM demo_results WHERE item_id = ANY($1)`, ids)
	}
	f.waitFor("the old workers to run every item but the dead head", func() bool { return ran(rest) == len(rest) })
	// They ran k's later items in order, one at a time (by their acks).
	if n := f.count(`SELECT count(*) FROM crdbwork_ended AS a, crdbwork_ended AS b
		WHERE a.queue = $1 AND b.queue = $1 AND a.id = $2 AND b.id = $3 AND a.ended_at < b.ended_at`, upgradeQueue, res.IDs[1], res.IDs[3]); n != 1 {
		t.Errorf("k's items 1 and 3 were not acked in order")
	}
	blocked, err := q.BlockedKeys(ctx, 10)
	if err != nil || len(blocked) != 1 || blocked[0].ID != res.IDs[0] || blocked[0].Kind != claim.BlockedDead {
		t.Fatalf("BlockedKeys after the old workers advanced = %+v, %v; want k, still held by its dead head", blocked, err)
	}
	if ok, err := requeuedOne(q.Requeue(ctx, claim.RequeueOptions{ID: res.IDs[0]})); err != nil || !ok {
		t.Fatalf("requeue: %v, %v", ok, err)
	}
	f.waitFor("an old worker to run the requeued head", func() bool { return ran(res.IDs[:1]) == 1 })
	f.checkAlive()
	if n := f.count(`SELECT count(DISTINCT item_id) FROM demo_results WHERE item_id = ANY($1)`, res.IDs); n != len(res.IDs) || ran(res.IDs) != len(res.IDs) {
		t.Fatalf("%d distinct items of %d ran, %d result rows", n, len(res.IDs), ran(res.IDs))
	}
	if n := f.count(`SELECT count(*) FROM crdbwork_items`) + f.count(`SELECT count(*) FROM crdbwork_dead_items`); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}
