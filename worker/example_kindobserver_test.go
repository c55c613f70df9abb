package worker_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

// README:begin kind-observer
// runsByKind is a worker.KindObserver: it counts handler runs by kind and
// outcome, the kinds the worker did not register as one, "(other)"
// (run.MetricKind), so that producers' input cannot grow it without bound.
type runsByKind struct {
	mu   sync.Mutex
	runs map[string]int
}

func (o *runsByKind) KindHandlerDone(run worker.HandlerRun) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs[fmt.Sprintf("%q %s", run.MetricKind(), run.Outcome)]++
}

// HandlerDone and AckBatch make it a worker.Observer; a worker calls
// KindHandlerDone instead of HandlerDone.
func (o *runsByKind) HandlerDone(string, time.Duration, claim.Outcome) {}
func (o *runsByKind) AckBatch(string, int)                             {}

// README:end kind-observer

// An Observer that is also a KindObserver is told the kind of each
// handler run, and whether the worker's Kinds registered it.
func ExampleKindObserver() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "jobs"})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range []claim.NewItem{
		{Kind: "send_mail", Payload: []byte(`{"to": "ada@example.com"}`)},
		{Kind: "send_mail", Payload: []byte(`{"to": "bob@example.com"}`)},
		{Kind: "resize", Payload: []byte(`{"image": "cat.png"}`)},
		{Kind: "send_sms", Payload: []byte(`{}`)}, // no handler: dead at once
	} {
		if _, err := q.Enqueue(ctx, it); err != nil {
			log.Fatal(err)
		}
	}
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[SendMail]) (worker.Record, error) { return nil, nil })
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[Resize]) (worker.Record, error) { return nil, nil })
	obs := &runsByKind{runs: map[string]int{}}
	w, err := worker.New(q, kinds.Handler(), worker.Options{Observer: obs, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 700 * time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	told := func() (n int) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		for _, c := range obs.runs {
			n += c
		}
		return n
	}
	for deadline := time.Now().Add(time.Minute); told() < 4; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatalf("told of %d runs of 4", told())
		}
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	for _, k := range slices.Sorted(maps.Keys(obs.runs)) {
		fmt.Println(k, obs.runs[k])
	}
	// Output:
	// "(other)" dead 1
	// "resize" acked 1
	// "send_mail" acked 2
}
