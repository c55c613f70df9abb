package otelcrdbwork

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/worker"
)

// MetricsOptions configure NewMetrics. The zero value is valid.
type MetricsOptions struct {
	// MeterProvider makes the meter. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Metrics records a worker's handler runs and ack transactions with
// OpenTelemetry instruments: give it to worker.Options.Observer (it is a
// worker.KindObserver). It is safe for concurrent use; one value may serve
// many workers.
//
//   - messaging.process.duration (histogram, seconds; OpenTelemetry's
//     messaging conventions): how long each handler ran (not the ack, nack
//     or release after it), with messaging.system "crdbwork",
//     messaging.operation.name "process", messaging.destination.name (the
//     queue), crdbwork.outcome (acked, retried, dead, released, unsettled,
//     dropped, snoozed, cancelled), error.type (the outcome, for a run that
//     failed: retried, dead, dropped, unsettled) and crdbwork.kind: the
//     item's kind if the worker's worker.Kinds registered it,
//     worker.OtherKind for any other, no attribute for an item without a
//     kind (worker.HandlerRun.MetricKind) — bounded, as kinds are whatever
//     producers write. The spans (Tracing) carry every kind as it is.
//   - crdbwork.ack.batch_size (histogram, items): the items of each ack
//     transaction, with messaging.system and messaging.destination.name.
//
// For the database's backlog by kind, use package metrics' gauges (or
// crdbwork status --by-kind): they are read from the database, not from
// this process's work.
type Metrics struct {
	duration  metric.Float64Histogram
	ackBatch  metric.Int64Histogram
	sysAttr   attribute.KeyValue
	procAttrs attribute.KeyValue
}

var _ worker.KindObserver = (*Metrics)(nil)

// Attribute keys of the metrics beside those of the spans.
const (
	keyOutcome   = attribute.Key("crdbwork.outcome")
	keyErrorType = attribute.Key("error.type")
)

// durationBuckets are the bucket boundaries, in seconds, of
// messaging.process.duration: those the messaging conventions advise for
// their durations, and longer ones, as a handler may run for minutes.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 300}

// NewMetrics returns a Metrics whose instruments come from opts'
// MeterProvider, or the error of their creation.
func NewMetrics(opts MetricsOptions) (*Metrics, error) {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	duration, err := meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of crdbwork handler runs (the ack, nack or release after them not included)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, fmt.Errorf("otelcrdbwork: the handler duration histogram: %w", err)
	}
	ackBatch, err := meter.Int64Histogram("crdbwork.ack.batch_size", metric.WithUnit("{item}"),
		metric.WithDescription("Items per crdbwork ack transaction (group commit)."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
	if err != nil {
		return nil, fmt.Errorf("otelcrdbwork: the ack batch histogram: %w", err)
	}
	return &Metrics{duration: duration, ackBatch: ackBatch, sysAttr: keySystem.String("crdbwork"),
		procAttrs: keyOpName.String("process")}, nil
}

// KindHandlerDone implements worker.KindObserver: one handler run.
func (m *Metrics) KindHandlerDone(run worker.HandlerRun) {
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, m.sysAttr, m.procAttrs, keyDestination.String(run.Queue), keyOutcome.String(run.Outcome.String()))
	if kind := run.MetricKind(); kind != "" {
		attrs = append(attrs, keyKind.String(kind))
	}
	switch run.Outcome {
	case claim.Retried, claim.Dead, claim.Dropped, claim.Unsettled:
		attrs = append(attrs, keyErrorType.String(run.Outcome.String()))
	}
	m.duration.Record(context.Background(), run.Took.Seconds(), metric.WithAttributes(attrs...))
}

// HandlerDone implements worker.Observer: a run without a kind. A worker
// calls KindHandlerDone instead.
func (m *Metrics) HandlerDone(queue string, d time.Duration, outcome claim.Outcome) {
	m.KindHandlerDone(worker.HandlerRun{Queue: queue, Took: d, Outcome: outcome})
}

// AckBatch implements worker.Observer: one ack transaction of n items.
func (m *Metrics) AckBatch(queue string, n int) {
	m.ackBatch.Record(context.Background(), int64(n), metric.WithAttributes(m.sysAttr, keyDestination.String(queue)))
}
