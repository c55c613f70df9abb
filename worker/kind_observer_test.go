package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/worker"
)

// runLog is an Observer that records what it is told; with kinds, a
// KindObserver (kindRunLog).
type runLog struct {
	mu    sync.Mutex
	done  []string // HandlerDone: "queue outcome"
	kinds []string // KindHandlerDone: "queue kind registered outcome"
	took  []time.Duration
}

func (l *runLog) HandlerDone(queue string, d time.Duration, outcome claim.Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = append(l.done, queue+" "+outcome.String())
}

func (l *runLog) AckBatch(string, int) {}

func (l *runLog) runs() (done, kinds []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(slices.Values(l.done)), slices.Sorted(slices.Values(l.kinds))
}

type kindRunLog struct{ runLog }

func (l *kindRunLog) KindHandlerDone(run worker.HandlerRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kinds = append(l.kinds, fmt.Sprintf("%s %q %v %s", run.Queue, run.Kind, run.Registered, run.Outcome))
	l.took = append(l.took, run.Took)
}

var _ worker.KindObserver = (*kindRunLog)(nil)

// A KindObserver is told each handler run's kind, and whether the worker's
// Kinds registered it (through a Middleware that derives the context too):
// two registered kinds, items without a kind (Kinds.Default), an
// unregistered kind (dead, not registered), a registered kind whose
// arguments do not decode (dead, registered) and a retried run; it is never
// told HandlerDone. An Observer without KindHandlerDone, on another queue
// of the same kinds, is told every run with HandlerDone as before. Every
// item ends.
func TestKindObserverIsToldEachRunsKind(t *testing.T) {
	t.Parallel()
	_, pool := wakeSetup(t)
	ctx := context.Background()
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) {
		if job.Args.Note == "fail once" && job.Attempt == 1 {
			return nil, errors.New("the first attempt fails")
		}
		return nil, nil
	})
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[refundArgs]) (worker.Record, error) {
		return nil, nil
	})
	kinds.Default = func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	type key struct{}
	middleware := func(next worker.Handler) worker.Handler {
		return func(ctx context.Context, it claim.Item) (worker.Record, error) {
			return next(context.WithValue(ctx, key{}, it.ID), it)
		}
	}
	enqueue := func(q *claim.Queue, args ...claim.Args) {
		t.Helper()
		var items []claim.NewItem
		for _, a := range args {
			it, err := claim.ArgsItem(a)
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, it)
		}
		items = append(items,
			claim.NewItem{Payload: []byte("no kind")},
			claim.NewItem{Kind: "invoice", Payload: []byte(`{}`), MaxAttempts: 5},
			claim.NewItem{Kind: "order", Payload: []byte(`{"order": "seven"}`), MaxAttempts: 5})
		if _, err := q.Enqueue(ctx, items...); err != nil {
			t.Fatal(err)
		}
	}
	opts := func(obs worker.Observer) worker.Options {
		return worker.Options{Concurrency: 4, NoWake: true, Poll: 20 * time.Millisecond, Session: longSession(),
			Observer: obs, Middleware: middleware}
	}

	withKinds, plain := &kindRunLog{}, &runLog{}
	qk := newQueue(t, pool, claim.Options{Queue: "kinds", BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	qp := newQueue(t, pool, claim.Options{Queue: "plain", BackoffBase: time.Millisecond, BackoffMax: 10 * time.Millisecond})
	enqueue(qk, orderArgs{Order: 1}, orderArgs{Order: 2, Note: "fail once"}, refundArgs{Order: 1, Amount: 3}, refundArgs{Order: 2, Amount: 4})
	enqueue(qp, orderArgs{Order: 1}, refundArgs{Order: 1, Amount: 3})
	rk := startOn(t, qk, kinds.Handler(), opts(withKinds))
	rp := startOn(t, qp, kinds.Handler(), opts(plain))
	await.Until(t, "every item ended and every run reported", func() (bool, string) {
		n := count(t, pool, `SELECT count(*) FROM crdbwork_items`)
		done, _ := plain.runs()
		_, k := withKinds.runs()
		return n == 0 && len(done) >= 5 && len(k) >= 8, fmt.Sprintf("%d items left, %d runs told HandlerDone on plain, %d told KindHandlerDone on kinds", n, len(done), len(k))
	})
	rk.Stop(t)
	rp.Stop(t)

	done, byKind := withKinds.runs()
	wantKinds := []string{
		`kinds "" true acked`,
		`kinds "invoice" false dead`,
		`kinds "order" true acked`, `kinds "order" true acked`, `kinds "order" true dead`, `kinds "order" true retried`,
		`kinds "refund" true acked`, `kinds "refund" true acked`,
	}
	if !slices.Equal(byKind, wantKinds) {
		t.Errorf("KindHandlerDone was told\n%q\nwant\n%q", byKind, wantKinds)
	}
	if len(done) != 0 {
		t.Errorf("the KindObserver was told HandlerDone too: %q", done)
	}
	for _, d := range withKinds.took {
		if d <= 0 {
			t.Errorf("a run took %v", d)
		}
	}
	done, byKind = plain.runs()
	wantDone := []string{"plain acked", "plain acked", "plain acked", "plain dead", "plain dead"}
	if !slices.Equal(done, wantDone) || len(byKind) != 0 {
		t.Errorf("the plain Observer was told HandlerDone %q and KindHandlerDone %q, want HandlerDone %q", done, byKind, wantDone)
	}
}

// MetricKind labels a run with its kind when it is registered or none,
// and with OtherKind otherwise.
func TestHandlerRunMetricKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		run  worker.HandlerRun
		want string
	}{
		{worker.HandlerRun{Kind: "order", Registered: true}, "order"},
		{worker.HandlerRun{Kind: "order"}, worker.OtherKind},
		{worker.HandlerRun{}, ""},
		{worker.HandlerRun{Registered: true}, ""},
	} {
		if got := c.run.MetricKind(); got != c.want {
			t.Errorf("%+v.MetricKind() = %q, want %q", c.run, got, c.want)
		}
	}
}
