package otelcrdbwork_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/otelcrdbwork"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

type mailArgs struct {
	To string `json:"to"`
}

func (mailArgs) Kind() string { return "send_mail" }

type resizeArgs struct {
	Width int `json:"width"`
}

func (resizeArgs) Kind() string { return "resize" }

// Items of two kinds a worker's Kinds registered, one of a kind it did not
// (dead at once) and one without a kind, each enqueued alone: the send,
// process and claim spans carry each item's kind as crdbwork.kind (or,
// for a claim of several items, crdbwork.kinds beside crdbwork.item_ids);
// an item without a kind has none. The worker's Observer, a Metrics,
// records each run in messaging.process.duration with its kind if
// registered, worker.OtherKind if not, none without a kind. Every item
// ends.
func TestSpansCarryTheKind(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tr := otelcrdbwork.New(otelcrdbwork.Options{TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))})
	q, err := claim.New(pool, claim.Options{Queue: "kinds", Hooks: tr})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // item id → kind
	for _, it := range []claim.NewItem{
		must(claim.ArgsItem(mailArgs{To: "ada@example.com"})),
		must(claim.ArgsItem(resizeArgs{Width: 200})),
		{Kind: "invoice", Payload: []byte(`{}`)},
		{Payload: []byte("no kind")},
	} {
		res, err := q.Enqueue(ctx, it)
		if err != nil {
			t.Fatal(err)
		}
		want[res.IDs[0].String()] = it.Kind
	}
	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[mailArgs]) (worker.Record, error) { return nil, nil })
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[resizeArgs]) (worker.Record, error) { return nil, nil })
	kinds.Default = func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	reader := sdkmetric.NewManualReader()
	m, err := otelcrdbwork.NewMetrics(otelcrdbwork.MetricsOptions{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	hb := await.Stretch(100 * time.Millisecond)
	w, err := worker.New(q, kinds.Handler(), worker.Options{Concurrency: 2, Poll: 20 * time.Millisecond, Middleware: tr.Middleware,
		Observer: m, Session: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Until(t, "every item ended and its run recorded", func() (bool, string) {
		st := w.Stats()
		runs := 0
		for _, n := range processRuns(t, reader) {
			runs += n
		}
		return st.Acked+st.Dead == 4 && runs == 4, fmt.Sprintf("%d acked, %d dead, of 4; %d runs recorded", st.Acked, st.Dead, runs)
	})
	stop()
	if err := await.Recv(t, "the worker to stop", done); err != nil {
		t.Fatal(err)
	}

	spans := rec.Ended()
	// kindsOf maps each span's item ids to its kinds ("-" for no
	// attribute).
	kindsOf := func(name string) map[string]string {
		got := map[string]string{}
		for _, s := range spanNamed(t, spans, name) {
			if ids, ok := attr(s, "crdbwork.item_ids"); ok {
				ks, _ := attr(s, "crdbwork.kinds")
				for i, id := range ids.AsStringSlice() {
					k := "-"
					if l := ks.AsStringSlice(); i < len(l) && l[i] != "" {
						k = l[i]
					}
					got[id] = k
				}
				continue
			}
			id, _ := attr(s, "messaging.message.id")
			k := "-"
			if v, ok := attr(s, "crdbwork.kind"); ok {
				k = v.AsString()
			}
			got[id.AsString()] = k
		}
		return got
	}
	wantAttr := map[string]string{}
	for id, k := range want {
		if k == "" {
			k = "-"
		}
		wantAttr[id] = k
	}
	for _, name := range []string{"send kinds", "process kinds", "claim kinds"} {
		if got := kindsOf(name); !maps.Equal(got, wantAttr) {
			t.Errorf("%s spans: kinds by item %v, want %v", name, got, wantAttr)
		}
	}
	wantRuns := map[string]int{"send_mail acked -": 1, "resize acked -": 1, worker.OtherKind + " dead dead": 1, "- acked -": 1}
	if got := processRuns(t, reader); !maps.Equal(got, wantRuns) {
		t.Errorf("messaging.process.duration runs by kind, outcome and error.type: %v, want %v", got, wantRuns)
	}
}

func must(it claim.NewItem, err error) claim.NewItem {
	if err != nil {
		panic(err)
	}
	return it
}

// processRuns returns the runs recorded in messaging.process.duration by
// "kind outcome error.type" ("-" for an attribute not set).
func processRuns(t *testing.T, reader *sdkmetric.ManualReader) map[string]int {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != "messaging.process.duration" {
				continue
			}
			h, ok := mt.Data.(metricdata.Histogram[float64])
			if !ok {
				t.Fatalf("messaging.process.duration is a %T", mt.Data)
			}
			for _, dp := range h.DataPoints {
				key := ""
				for _, k := range []string{"crdbwork.kind", "crdbwork.outcome", "error.type"} {
					v, ok := dp.Attributes.Value(attribute.Key(k))
					if !ok {
						key += " -"
						continue
					}
					key += " " + v.AsString()
				}
				if q, _ := dp.Attributes.Value("messaging.destination.name"); q.AsString() != "kinds" {
					t.Errorf("a run of queue %q", q.AsString())
				}
				out[key[1:]] += int(dp.Count)
			}
		}
	}
	return out
}
