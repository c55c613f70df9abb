package otelcrdbwork_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/otelcrdbwork"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// Handler durations by kind with OpenTelemetry metrics: a Metrics is the
// worker's Observer. The example reads the meter in memory; a program
// gives the MeterProvider of its exporter.
func ExampleNewMetrics() {
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
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))

	// README:begin otel-metrics
	m, err := otelcrdbwork.NewMetrics(otelcrdbwork.MetricsOptions{MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "jobs"})
	if err != nil {
		log.Fatal(err)
	}
	kinds := worker.NewKinds()
	kinds.Handle("send_mail", func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil })
	w, err := worker.New(q, kinds.Handler(), worker.Options{Observer: m, // messaging.process.duration by kind
		Poll: 20 * time.Millisecond, Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	// README:end otel-metrics
	if _, err := q.Enqueue(ctx, claim.NewItem{Kind: "send_mail", Payload: []byte(`{}`)},
		claim.NewItem{Kind: "send_sms", Payload: []byte(`{}`)}); err != nil { // no handler: dead at once
		log.Fatal(err)
	}

	runs := func() (lines []string, n uint64) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			log.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				if h, ok := mt.Data.(metricdata.Histogram[float64]); ok && mt.Name == "messaging.process.duration" {
					for _, dp := range h.DataPoints {
						kind, _ := dp.Attributes.Value("crdbwork.kind")
						outcome, _ := dp.Attributes.Value("crdbwork.outcome")
						lines = append(lines, fmt.Sprintf("%s kind=%s outcome=%s: %d", mt.Name, kind.AsString(), outcome.AsString(), dp.Count))
						n += dp.Count
					}
				}
			}
		}
		slices.Sort(lines)
		return lines, n
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, n := runs(); n == 2 || time.Now().After(deadline) {
			break
		}
	}
	stop()
	<-ran
	lines, _ := runs()
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// messaging.process.duration kind=(other) outcome=dead: 1
	// messaging.process.duration kind=send_mail outcome=acked: 1
}
