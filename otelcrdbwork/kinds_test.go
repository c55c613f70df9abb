package otelcrdbwork_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

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
// an item without a kind has none. Every item ends.
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
	hb := await.Stretch(100 * time.Millisecond)
	w, err := worker.New(q, kinds.Handler(), worker.Options{Concurrency: 2, Poll: 20 * time.Millisecond, Middleware: tr.Middleware,
		Session: session.Tuning{Heartbeat: hb, Expiry: 20 * hb}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Until(t, "every item ended", func() (bool, string) {
		st := w.Stats()
		return st.Acked+st.Dead == 4, fmt.Sprintf("%d acked, %d dead, of 4", st.Acked, st.Dead)
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
}

func must(it claim.NewItem, err error) claim.NewItem {
	if err != nil {
		panic(err)
	}
	return it
}
