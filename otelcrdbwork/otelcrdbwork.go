// Package otelcrdbwork traces crdbwork queues with OpenTelemetry: a
// producer's trace context travels in the items it enqueues, the worker's
// handler span links to it, and claims, acks, nacks and releases are spans
// with the queue, part and attempt.
//
// It is a module of its own (github.com/crdbwork/crdbwork/otelcrdbwork), so
// that programs which do not trace never import OpenTelemetry: the library
// has only the small hooks this package plugs into, claim.Options.Hooks and
// worker.Options.Middleware.
//
//	tr := otelcrdbwork.New(otelcrdbwork.Options{})
//	q, err := claim.New(pool, claim.Options{Queue: "mail", Hooks: tr})
//	w, err := worker.New(q, handle, worker.Options{Middleware: tr.Middleware})
//
// # Spans
//
//   - "send <queue>" (kind Producer) around every enqueue (Queue.Enqueue,
//     EnqueueTx, Buffer.Enqueue), a child of the caller's span. Its context
//     is written into each item's Headers (claim.NewItem.Headers) with the
//     propagator (W3C traceparent, tracestate and baggage by default).
//   - "process <queue>" (kind Consumer) around every handler run, with the
//     item's id, part, attempt, priority and kind (claim.NewItem.Kind; no
//     attribute for an item without one). By default it starts a new
//     trace and LINKS to the producer's span; with Options.ChildOfProducer it
//     is the producer span's child instead. Links are the default because an
//     item's attempts may run minutes or hours after the enqueue and after
//     one another (delays, backoff, 25 attempts): as children they would
//     stretch the producer's trace over all of that, and a sampler that
//     keeps or drops whole traces would decide for the worker's work by
//     the producer's request. This is what OpenTelemetry's messaging
//     conventions recommend for consumers that do not run in the
//     producer's call. Baggage is carried over either way.
//   - "claim <queue>" (kind Client) for every claim that returned items or
//     failed (empty claims of an idle worker, and claims cut short by the
//     end of their context as a worker stops, make no span unless
//     Options.EmptyClaims), linked to the producer span of every claimed
//     item; "ack <queue>" for every ack transaction (items acked together
//     share one), "nack <queue>" and "release <queue>". They carry the
//     items' ids, parts, attempts and kinds (single values when there is
//     one item, lists otherwise; the kinds only when an item has one). The
//     send span of one item carries its kind too.
//
// Attributes follow OpenTelemetry's messaging conventions where one fits
// (messaging.system "crdbwork", messaging.destination.name, messaging.
// operation.type and .name, messaging.message.id, messaging.batch.
// message_count) and are named crdbwork.* otherwise (crdbwork.part,
// crdbwork.attempt, crdbwork.max_attempts, crdbwork.priority, crdbwork.
// parts, crdbwork.attempts, crdbwork.item_ids, crdbwork.kind, crdbwork.
// kinds). The kind is an attribute of spans, never part of a span's name:
// names stay one per queue and operation, as the conventions ask, and
// tracing backends group and filter by the attribute.
//
// Items enqueued by code without the hook (or by the SQL function
// crdbwork_enqueue without headers) have no trace context: their process
// spans start new traces without links.
//
// # Metrics
//
// NewMetrics returns a worker.Observer that records handler durations
// (messaging.process.duration, by queue, outcome and kind) and ack batch
// sizes with OpenTelemetry instruments (see Metrics):
//
//	m, err := otelcrdbwork.NewMetrics(otelcrdbwork.MetricsOptions{})
//	w, err := worker.New(q, handle, worker.Options{Observer: m, Middleware: tr.Middleware})
package otelcrdbwork

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// ScopeName is the instrumentation scope of the tracer the package uses.
const ScopeName = "github.com/crdbwork/crdbwork/otelcrdbwork"

// Options configure New. The zero value is valid.
type Options struct {
	// TracerProvider makes the tracer. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes trace context into items' headers and reads it
	// back. Default: W3C trace context and baggage
	// (propagation.TraceContext and propagation.Baggage), whatever the
	// global propagator is, so that producers and workers agree without
	// configuration.
	Propagator propagation.TextMapPropagator
	// ChildOfProducer makes the handler's span a child of the producer's
	// span (in the producer's trace) rather than the root of a new trace
	// that links to it. See the package documentation for why links are
	// the default.
	ChildOfProducer bool
	// EmptyClaims records claims that returned no item (an idle worker
	// claims every poll interval), and those its context cut short.
	// Default: only claims that returned items or failed with their
	// context alive make spans.
	EmptyClaims bool
}

// Tracing implements claim.Hooks (enqueue and step spans) and, with its
// Middleware method, worker.Options.Middleware (handler spans). It is safe
// for concurrent use; one value may serve many queues and workers.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	opts   Options
}

var _ claim.Hooks = (*Tracing)(nil)

// New returns a Tracing with opts.
func New(opts Options) *Tracing {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := opts.Propagator
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracing{tracer: tp.Tracer(ScopeName), prop: prop, opts: opts}
}

// Attribute keys beside OpenTelemetry's messaging conventions.
const (
	keySystem      = attribute.Key("messaging.system")
	keyDestination = attribute.Key("messaging.destination.name")
	keyOpType      = attribute.Key("messaging.operation.type")
	keyOpName      = attribute.Key("messaging.operation.name")
	keyMessageID   = attribute.Key("messaging.message.id")
	keyBatchCount  = attribute.Key("messaging.batch.message_count")
	keyPart        = attribute.Key("crdbwork.part")
	keyAttempt     = attribute.Key("crdbwork.attempt")
	keyMaxAttempts = attribute.Key("crdbwork.max_attempts")
	keyPriority    = attribute.Key("crdbwork.priority")
	keyParts       = attribute.Key("crdbwork.parts")
	keyAttempts    = attribute.Key("crdbwork.attempts")
	keyItemIDs     = attribute.Key("crdbwork.item_ids")
	keyAdded       = attribute.Key("crdbwork.added")
	keyKind        = attribute.Key("crdbwork.kind")
	keyKinds       = attribute.Key("crdbwork.kinds")
)

// Enqueue implements claim.Hooks: a producer span around the enqueue,
// whose context goes into a copy of every item's headers.
func (t *Tracing) Enqueue(ctx context.Context, queue string, items []claim.NewItem, next claim.EnqueueFunc) (claim.Enqueued, error) {
	attrs := []attribute.KeyValue{keySystem.String("crdbwork"), keyDestination.String(queue),
		keyOpType.String("send"), keyOpName.String("enqueue")}
	if len(items) > 1 {
		attrs = append(attrs, keyBatchCount.Int(len(items)))
	} else if len(items) == 1 && items[0].Kind != "" {
		attrs = append(attrs, keyKind.String(items[0].Kind))
	}
	ctx, span := t.tracer.Start(ctx, "send "+queue, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()
	cp := make([]claim.NewItem, len(items))
	for i, it := range items {
		h := make(map[string]string, len(it.Headers)+3)
		maps.Copy(h, it.Headers)
		t.prop.Inject(ctx, propagation.MapCarrier(h))
		it.Headers = h
		cp[i] = it
	}
	res, err := next(ctx, cp)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return res, err
	}
	if len(res.IDs) == 1 {
		span.SetAttributes(keyMessageID.String(res.IDs[0].String()))
	}
	span.SetAttributes(keyAdded.Int(res.Added()))
	return res, nil
}

// Step implements claim.Hooks: a span per claim, ack transaction, nack and
// release. The span is made when the step ends, with its start time, so
// that empty claims cost nothing unless Options.EmptyClaims.
func (t *Tracing) Step(ctx context.Context, s *claim.Step) func(error) {
	start := time.Now()
	return func(err error) {
		// An empty claim, or one cut short by its context (a worker that
		// stops), is no event of the queue's.
		if s.Kind == claim.StepClaim && len(s.Items) == 0 && (err == nil || ctx.Err() != nil) && !t.opts.EmptyClaims {
			return
		}
		opType := "settle"
		if s.Kind == claim.StepClaim {
			opType = "receive"
		}
		attrs := []attribute.KeyValue{keySystem.String("crdbwork"), keyDestination.String(s.Queue),
			keyOpType.String(opType), keyOpName.String(string(s.Kind))}
		attrs = append(attrs, itemAttrs(s.Items)...)
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(start), trace.WithAttributes(attrs...)}
		if s.Kind == claim.StepClaim {
			for _, it := range s.Items {
				if sc := t.producer(ctx, it); sc.IsValid() {
					opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
				}
			}
		}
		_, span := t.tracer.Start(ctx, string(s.Kind)+" "+s.Queue, opts...)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// itemAttrs describes the items of a step: their number, and their ids,
// parts, attempts and kinds (single values for one item, lists for more;
// the kind only when an item has one).
func itemAttrs(items []claim.Item) []attribute.KeyValue {
	switch len(items) {
	case 0:
		return []attribute.KeyValue{keyBatchCount.Int(0)}
	case 1:
		it := items[0]
		attrs := []attribute.KeyValue{keyMessageID.String(it.ID.String()), keyPart.Int(it.Part), keyAttempt.Int(it.Attempt)}
		if it.Kind != "" {
			attrs = append(attrs, keyKind.String(it.Kind))
		}
		return attrs
	}
	ids, parts, attempts, kinds := make([]string, len(items)), make([]int, len(items)), make([]int, len(items)), make([]string, len(items))
	anyKind := false
	for i, it := range items {
		ids[i], parts[i], attempts[i], kinds[i] = it.ID.String(), it.Part, it.Attempt, it.Kind
		anyKind = anyKind || it.Kind != ""
	}
	attrs := []attribute.KeyValue{keyBatchCount.Int(len(items)), keyItemIDs.StringSlice(ids),
		keyParts.IntSlice(parts), keyAttempts.IntSlice(attempts)}
	if anyKind {
		attrs = append(attrs, keyKinds.StringSlice(kinds))
	}
	return attrs
}

// producer returns the span context the producer wrote into it's headers
// (invalid if none).
func (t *Tracing) producer(ctx context.Context, it claim.Item) trace.SpanContext {
	if len(it.Headers) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(it.Headers)))
}

// Middleware wraps a handler (worker.Options.Middleware): each run is a
// "process <queue>" span linked to (or, with Options.ChildOfProducer, a
// child of) the producer's span, with the producer's baggage in the
// handler's context. A handler error or panic marks the span as failed (the
// panic goes on to the worker, which recovers it).
func (t *Tracing) Middleware(next worker.Handler) worker.Handler {
	return func(ctx context.Context, it claim.Item) (rec worker.Record, err error) {
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			keySystem.String("crdbwork"), keyDestination.String(it.Queue), keyOpType.String("process"),
			keyOpName.String("process"), keyMessageID.String(it.ID.String()), keyPart.Int(it.Part),
			keyAttempt.Int(it.Attempt), keyMaxAttempts.Int(it.MaxAttempts), keyPriority.Int(it.Priority))}
		if it.Kind != "" {
			opts = append(opts, trace.WithAttributes(keyKind.String(it.Kind)))
		}
		if len(it.Headers) > 0 {
			pctx := t.prop.Extract(ctx, propagation.MapCarrier(it.Headers))
			sc := trace.SpanContextFromContext(pctx)
			if t.opts.ChildOfProducer {
				ctx = pctx
			} else {
				// The producer's baggage, not its span: the handler's
				// span starts a trace of its own.
				ctx = trace.ContextWithSpanContext(pctx, trace.SpanContextFromContext(ctx))
				if sc.IsValid() {
					opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
				}
			}
		}
		if !t.opts.ChildOfProducer {
			opts = append(opts, trace.WithNewRoot())
		}
		ctx, span := t.tracer.Start(ctx, "process "+it.Queue, opts...)
		defer func() {
			if p := recover(); p != nil {
				span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", p))
				span.End()
				panic(p)
			}
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}()
		return next(ctx, it)
	}
}
