package otelcrdbwork_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/otelcrdbwork"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.New(t)
	if err := crsql.Apply(context.Background(), pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	return pool
}

// seen is what a handler saw of its context.
type seen struct {
	span    trace.SpanContext
	baggage string
}

// runWorker runs a worker on q with tr's middleware and handle until
// stop says so (checked as the wait for a condition polls), then stops
// it gracefully.
func runWorker(t *testing.T, q *claim.Queue, tr *otelcrdbwork.Tracing, handle worker.Handler, stop func(w *worker.Worker) bool) *worker.Worker {
	t.Helper()
	w, err := worker.New(q, handle, worker.Options{
		Concurrency: 2, Poll: 20 * time.Millisecond, Middleware: tr.Middleware,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	t.Cleanup(func() { // a failed wait below: stop the worker all the same
		if !stopped {
			cancel()
			<-done
		}
	})
	await.Until(t, "the worker to finish its items", func() (bool, string) { return stop(w), fmt.Sprintf("%+v", w.Stats()) })
	cancel()
	stopped = true
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	return w
}

func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// A producer's span, an enqueue in it, a worker that runs the item: the
// enqueue's span is the producer span's child; the handler's span starts a
// trace of its own that links to the enqueue's span (so to the producer's
// trace id), has the item's queue, part and attempt, and is the handler's
// context (with the producer's baggage); claim and ack are spans with the
// item's attributes, the claim linked to the producer too.
func TestHandlerSpanLinksToProducer(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: tp})
	q, err := claim.New(pool, claim.Options{Queue: "traced", Hooks: tr})
	if err != nil {
		t.Fatal(err)
	}

	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		t.Fatal(err)
	}
	pctx, producer := tp.Tracer("test").Start(baggage.ContextWithBaggage(ctx, bag), "request")
	res, err := q.Enqueue(pctx, claim.NewItem{Payload: []byte("x"), Key: "k1"})
	producer.End()
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var got []seen
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, seen{span: trace.SpanContextFromContext(ctx), baggage: baggage.FromContext(ctx).Member("tenant").Value()})
		return nil, nil
	}
	runWorker(t, q, tr, handle, func(w *worker.Worker) bool { return w.Stats().Acked == 1 })

	spans := rec.Ended()
	sends := spanNamed(t, spans, "send traced")
	procs := spanNamed(t, spans, "process traced")
	claims := spanNamed(t, spans, "claim traced")
	acks := spanNamed(t, spans, "ack traced")
	if len(sends) != 1 || len(procs) != 1 || len(claims) != 1 || len(acks) != 1 {
		t.Fatalf("spans: %d send, %d process, %d claim, %d ack; want 1 each (all: %d)", len(sends), len(procs), len(claims), len(acks), len(spans))
	}
	send, proc := sends[0], procs[0]
	ptrace := producer.SpanContext().TraceID()
	if send.SpanContext().TraceID() != ptrace || send.Parent().SpanID() != producer.SpanContext().SpanID() || send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("send span: trace %s parent %s kind %v; want trace %s, parent the producer's span, kind producer",
			send.SpanContext().TraceID(), send.Parent().SpanID(), send.SpanKind(), ptrace)
	}
	if v, _ := attr(send, "messaging.message.id"); v.AsString() != res.IDs[0].String() {
		t.Errorf("send span message id %q, want %s", v.AsString(), res.IDs[0])
	}
	// The handler span: a new trace, linked to the send span.
	if proc.SpanContext().TraceID() == ptrace || proc.Parent().IsValid() {
		t.Errorf("process span is in the producer's trace or has a parent (%s, %v): want a new root", proc.SpanContext().TraceID(), proc.Parent())
	}
	if l := proc.Links(); len(l) != 1 || l[0].SpanContext.TraceID() != ptrace || l[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span links %+v; want one, to the send span of trace %s", l, ptrace)
	}
	if proc.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("process span kind %v, want consumer", proc.SpanKind())
	}
	for key, want := range map[string]int64{"crdbwork.part": 0, "crdbwork.attempt": 1} {
		if v, ok := attr(proc, key); !ok || v.AsInt64() != want {
			t.Errorf("process span %s = %v (set %v), want %d", key, v.Emit(), ok, want)
		}
	}
	if v, _ := attr(proc, "messaging.destination.name"); v.AsString() != "traced" {
		t.Errorf("process span queue %q", v.AsString())
	}
	if len(got) != 1 || got[0].span.SpanID() != proc.SpanContext().SpanID() || got[0].baggage != "acme" {
		t.Errorf("the handler saw %+v; want the process span %s and baggage tenant=acme", got, proc.SpanContext().SpanID())
	}
	// Claim and ack spans.
	for _, s := range []sdktrace.ReadOnlySpan{claims[0], acks[0]} {
		if v, _ := attr(s, "messaging.message.id"); v.AsString() != res.IDs[0].String() {
			t.Errorf("%s: message id %q, want %s", s.Name(), v.AsString(), res.IDs[0])
		}
		if v, ok := attr(s, "crdbwork.attempt"); !ok || v.AsInt64() != 1 {
			t.Errorf("%s: attempt %v", s.Name(), v.Emit())
		}
		if _, ok := attr(s, "crdbwork.part"); !ok {
			t.Errorf("%s: no part", s.Name())
		}
		if s.Status().Code == codes.Error {
			t.Errorf("%s: status %v", s.Name(), s.Status())
		}
	}
	if l := claims[0].Links(); len(l) != 1 || l[0].SpanContext.TraceID() != ptrace {
		t.Errorf("claim span links %+v; want one to trace %s", l, ptrace)
	}
}

// With ChildOfProducer, the handler's span is the enqueue span's child, in
// the producer's trace. A failing handler marks its span failed and its
// nack makes a span.
func TestHandlerSpanChildOfProducerAndFailures(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: tp, ChildOfProducer: true})
	q, err := claim.New(pool, claim.Options{Queue: "child", Hooks: tr, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pctx, producer := tp.Tracer("test").Start(ctx, "request")
	if _, err := q.Enqueue(pctx, claim.NewItem{Payload: []byte("x"), MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	producer.End()
	var mu sync.Mutex
	runs := 0
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		mu.Lock()
		defer mu.Unlock()
		runs++
		if it.Attempt == 1 {
			return nil, errors.New("first attempt fails")
		}
		return nil, nil
	}
	runWorker(t, q, tr, handle, func(w *worker.Worker) bool { return w.Stats().Acked == 1 })

	spans := rec.Ended()
	send := spanNamed(t, spans, "send child")
	procs := spanNamed(t, spans, "process child")
	nacks := spanNamed(t, spans, "nack child")
	if len(send) != 1 || len(procs) != 2 || len(nacks) != 1 {
		t.Fatalf("spans: %d send, %d process, %d nack; want 1, 2, 1", len(send), len(procs), len(nacks))
	}
	failed := 0
	for _, p := range procs {
		if p.SpanContext().TraceID() != producer.SpanContext().TraceID() || p.Parent().SpanID() != send[0].SpanContext().SpanID() {
			t.Errorf("process span: trace %s parent %s; want the producer's trace, parent the send span", p.SpanContext().TraceID(), p.Parent().SpanID())
		}
		a, _ := attr(p, "crdbwork.attempt")
		if p.Status().Code == codes.Error {
			failed++
			if a.AsInt64() != 1 {
				t.Errorf("the failed run was attempt %d, want 1", a.AsInt64())
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d failed process spans, want 1", failed)
	}
	if v, _ := attr(nacks[0], "crdbwork.attempt"); v.AsInt64() != 1 {
		t.Errorf("nack span attempt %d, want 1", v.AsInt64())
	}
}

// Empty claims of an idle worker make no spans, unless EmptyClaims; items
// enqueued without the hook run in new traces without links.
func TestEmptyClaimsAndItemsWithoutContext(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: tp})
	plain, err := claim.New(pool, claim.Options{Queue: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Enqueue(ctx, claim.NewItem{Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "plain", Hooks: tr})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	idleSince := time.Time{}
	runWorker(t, q, tr, handle, func(w *worker.Worker) bool {
		if w.Stats().Acked < 1 {
			return false
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		// Several idle polls (20 ms each) after the item was acked.
		return time.Since(idleSince) > 300*time.Millisecond
	})
	spans := rec.Ended()
	procs := spanNamed(t, spans, "process plain")
	if len(procs) != 1 || len(procs[0].Links()) != 0 || procs[0].Parent().IsValid() {
		t.Fatalf("process spans %d (links %v); want one root without links", len(procs), procs)
	}
	if claims := spanNamed(t, spans, "claim plain"); len(claims) != 1 {
		t.Errorf("%d claim spans; want 1 (empty claims make none)", len(claims))
	}

	rec2 := tracetest.NewSpanRecorder()
	tr2 := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec2)), EmptyClaims: true})
	q2, err := claim.New(pool, claim.Options{Queue: "idle", Hooks: tr2})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, q2, tr2, handle, func(*worker.Worker) bool { return len(spanNamed(t, rec2.Ended(), "claim idle")) >= 2 })
}

// A claim cut short by the end of its context (a worker stopping while it
// polls) makes no span; one that fails with its context alive does, with
// the error, and so does a cut-short one with EmptyClaims.
func TestClaimCutShortByItsContextMakesNoSpan(t *testing.T) {
	for _, c := range []struct {
		name     string
		empty    bool
		cancel   bool
		wantSpan bool
	}{
		{"context ended", false, true, false},
		{"failed, context alive", false, false, true},
		{"context ended, EmptyClaims", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tr := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), EmptyClaims: c.empty})
			ctx, cancel := context.WithCancel(context.Background())
			end := tr.Step(ctx, &claim.Step{Kind: claim.StepClaim, Queue: "q"})
			err := errors.New("connection reset")
			if c.cancel {
				cancel()
				err = context.Canceled
			}
			end(err)
			cancel()
			spans := spanNamed(t, rec.Ended(), "claim q")
			if got := len(spans) == 1; got != c.wantSpan {
				t.Fatalf("%d claim spans; want a span: %v", len(spans), c.wantSpan)
			}
			if c.wantSpan && spans[0].Status().Code != codes.Error {
				t.Errorf("span status %v; want an error", spans[0].Status())
			}
		})
	}
}
