package otelcrdbwork_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/otelcrdbwork"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Trace a queue: the producer's enqueue carries its trace context in the
// item, and the worker's handler span links to it. The example records
// spans in memory; a program gives the TracerProvider of its exporter.
func ExampleNew() {
	ctx := context.Background()
	url, drop := testdb.ExampleURL()
	defer drop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	// README:begin tracing
	tracing := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: tp})
	q, err := claim.New(pool, claim.Options{Queue: "mail", Hooks: tracing})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		// ctx carries the "process mail" span, linked to the producer's.
		return nil, nil
	}
	w, err := worker.New(q, handle, worker.Options{Middleware: tracing.Middleware,
		Poll: 20 * time.Millisecond, Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: time.Second}})
	if err != nil {
		log.Fatal(err)
	}

	// A producer, in its own span: the enqueue's span is its child, and
	// its context goes into the item's headers.
	reqCtx, request := tp.Tracer("app").Start(ctx, "POST /signup")
	if _, err := q.Enqueue(reqCtx, claim.NewItem{Payload: []byte("welcome ada")}); err != nil {
		log.Fatal(err)
	}
	request.End()
	// README:end tracing

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	for deadline := time.Now().Add(time.Minute); w.Stats().Acked < 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-ran

	for _, s := range spans.Ended() {
		switch s.Name() {
		case "send mail", "process mail", "claim mail", "ack mail":
			linked := len(s.Links()) == 1 && s.Links()[0].SpanContext.TraceID() == request.SpanContext().TraceID()
			inTrace := s.SpanContext().TraceID() == request.SpanContext().TraceID()
			fmt.Printf("%s: in the request's trace %v, linked to it %v\n", s.Name(), inTrace, linked)
		}
	}
	// Output:
	// send mail: in the request's trace true, linked to it false
	// claim mail: in the request's trace false, linked to it true
	// process mail: in the request's trace false, linked to it true
	// ack mail: in the request's trace false, linked to it false
}
