package workertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
	"github.com/crdbwork/crdbwork/worker/workertest"
)

type greeting struct {
	Name string `json:"name"`
}

func (greeting) Kind() string { return "greet" }

// A handler of kinds (worker.Kinds) runs under Work as under a worker: the
// kind's handler gets its typed arguments and its Record commits; an item
// whose payload does not decode, or of an unknown kind, ends dead with the
// reason that names its kind, at its first attempt; with UnknownWait it is
// snoozed without using its attempt.
func TestKindsUnderWork(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[greeting]) (worker.Record, error) {
		return record(claim.Item{ID: job.ID, Payload: []byte(job.Args.Name)}), nil
	})
	h := kinds.Handler()
	it, err := claim.ArgsItem(greeting{Name: "ada"})
	if err != nil {
		t.Fatal(err)
	}
	if res := work(t, pool, h, it, workertest.Options{}); res.Outcome != claim.Acked ||
		count(t, pool, `SELECT count(*) FROM results WHERE item_id = $1 AND greeting = 'Hello, ada!'`, res.Item.ID) != 1 {
		t.Fatalf("a greet item: %+v", res)
	}
	res := work(t, pool, h, claim.NewItem{Kind: "greet", Payload: []byte(`{"name": 7}`), MaxAttempts: 5}, workertest.Options{})
	var ae *claim.ArgsError
	if res.Outcome != claim.Dead || !errors.As(res.Err, &ae) || !errors.Is(res.Err, claim.ErrBadArgs) || res.State.Reason != "bad arguments: greet" {
		t.Fatalf("bad arguments: outcome %v, err %v, state %+v; want dead, reason \"bad arguments: greet\"", res.Outcome, res.Err, res.State)
	}
	res = work(t, pool, h, claim.NewItem{Kind: "farewell", Payload: []byte(`{}`), MaxAttempts: 5}, workertest.Options{})
	if res.Outcome != claim.Dead || res.State.Reason != "unknown kind: farewell" {
		t.Fatalf("unknown kind: outcome %v, err %v, state %+v; want dead, reason \"unknown kind: farewell\"", res.Outcome, res.Err, res.State)
	}
	kinds.UnknownWait = time.Hour
	res = work(t, pool, kinds.Handler(), claim.NewItem{Kind: "farewell", Payload: []byte(`{}`)}, workertest.Options{})
	if res.Outcome != claim.Snoozed || !res.State.Queued || res.State.Attempts != 0 || res.State.Snoozes != 1 {
		t.Fatalf("unknown kind with a wait: outcome %v, state %+v; want snoozed, queued, no attempt used", res.Outcome, res.State)
	}
}
