package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/metrics"
	"github.com/crdbwork/crdbwork/session"
	"github.com/crdbwork/crdbwork/worker"
)

type orderArgs struct {
	Order int `json:"order"`
}

func (orderArgs) Kind() string { return "order" }

type refundArgs struct {
	Order int  `json:"order"`
	Fail  bool `json:"fail,omitempty"`
}

func (refundArgs) Kind() string { return "refund" }

// byKind returns the series of name of queue by their kind label: the
// gauges' values, the histograms' sample counts (by "kind/outcome").
func byKind(fams map[string]*dto.MetricFamily, name, queue string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["queue"] != queue {
			continue
		}
		if m.Histogram != nil {
			out[labels["kind"]+"/"+labels["outcome"]] = float64(m.Histogram.GetSampleCount())
			continue
		}
		out[labels["kind"]] = m.GetGauge().GetValue()
	}
	return out
}

// A worker of two registered kinds runs items of both, one without a kind
// (Kinds.Default) and one of a kind it did not register: the handler
// histogram counts each run by its kind and outcome, the unregistered kind
// as OtherKind, never by its own name; the gauges by kind match the rows
// of the items table before and after the run (the items due in an hour
// stay).
func TestHandlerAndBacklogByKind(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	var items []claim.NewItem
	add := func(n int, a claim.Args, delay time.Duration) {
		for i := range n {
			it, err := claim.ArgsItem(a)
			if err != nil {
				t.Fatal(err)
			}
			it.Delay, it.Key = delay, fmt.Sprintf("%s-%d-%v", a.Kind(), i, delay)
			items = append(items, it)
		}
	}
	add(5, orderArgs{Order: 1}, 0)
	add(2, refundArgs{Order: 1}, 0)
	add(1, refundArgs{Order: 2, Fail: true}, 0)
	add(2, orderArgs{Order: 3}, time.Hour)
	add(1, refundArgs{Order: 3}, time.Hour)
	items = append(items,
		claim.NewItem{Kind: "invoice", Payload: []byte(`{}`)}, claim.NewItem{Kind: "invoice", Payload: []byte(`{}`)},
		claim.NewItem{Kind: "invoice", Payload: []byte(`{}`), Delay: time.Hour},
		claim.NewItem{Payload: []byte("plain")}, claim.NewItem{Payload: []byte("plain"), Delay: time.Hour})
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}

	c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, QueryTimeout: queryTimeout(), BacklogByKind: true})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()

	// checkBacklog compares the gauges by kind with the rows, and with
	// what the test enqueued.
	checkBacklog := func(when string, wantBacklog, wantDue map[string]float64) {
		t.Helper()
		fams := scrape(t, srv.URL)
		if up := mustValue(t, fams, "crdbwork_database_up", nil); up != 1 {
			t.Fatalf("%s: database_up = %v (%v)", when, up, c.LastDatabaseError())
		}
		rows, due := map[string]float64{}, map[string]float64{}
		r, err := pool.Query(ctx, `SELECT COALESCE(kind, ''), count(*), count(*) FILTER (WHERE vesting_at <= now())
			FROM crdbwork_items WHERE queue = 'shop' AND claim IS NULL GROUP BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var kind string
			var n, d int64
			if err := r.Scan(&kind, &n, &d); err != nil {
				t.Fatal(err)
			}
			rows[kind], due[kind] = float64(n), float64(d)
		}
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
		gotBacklog, gotDue := byKind(fams, "crdbwork_kind_backlog_items", "shop"), byKind(fams, "crdbwork_kind_backlog_due_items", "shop")
		if !maps.Equal(gotBacklog, rows) || !maps.Equal(gotBacklog, wantBacklog) {
			t.Errorf("%s: kind_backlog_items = %v; the rows hold %v, want %v", when, gotBacklog, rows, wantBacklog)
		}
		// Unclaimed and due: the rows' due count is by this statement's
		// clock, the gauge's by the snapshot's: none is due within the
		// hour, so both agree.
		if !maps.Equal(gotDue, due) || !maps.Equal(gotDue, wantDue) {
			t.Errorf("%s: kind_backlog_due_items = %v; the rows hold %v, want %v", when, gotDue, due, wantDue)
		}
	}
	checkBacklog("before the worker",
		map[string]float64{"order": 7, "refund": 4, "invoice": 3, "": 2},
		map[string]float64{"order": 5, "refund": 3, "invoice": 2, "": 1})

	kinds := worker.NewKinds()
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[orderArgs]) (worker.Record, error) {
		time.Sleep(time.Millisecond) // the handler's work, which the histogram's sum must show
		return nil, nil
	})
	worker.AddKind(kinds, func(ctx context.Context, job worker.Job[refundArgs]) (worker.Record, error) {
		if job.Args.Fail {
			return nil, claim.Permanent(errors.New("refused"))
		}
		return nil, nil
	})
	kinds.Default = func(ctx context.Context, it claim.Item) (worker.Record, error) { return nil, nil }
	w, err := worker.New(q, kinds.Handler(), worker.Options{Concurrency: 4, Observer: c, NoWake: true, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Expiry: await.Stretch(session.DefaultExpiry)}})
	if err != nil {
		t.Fatal(err)
	}
	c.AddWorker(w)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	const runs = 5 + 3 + 2 + 1
	await.Until(t, "every due item's run in the histogram", func() (bool, string) {
		n := 0.0
		for _, v := range byKind(scrape(t, srv.URL), "crdbwork_handler_duration_seconds", "shop") {
			n += v
		}
		return n == runs, fmt.Sprintf("%v runs of %d", n, runs)
	}, await.Within(2*time.Minute))
	stop()
	if err := await.Recv(t, "the worker to stop", done); err != nil {
		t.Fatal(err)
	}

	fams := scrape(t, srv.URL)
	want := map[string]float64{
		"order/acked": 5, "refund/acked": 2, "refund/dead": 1,
		metrics.OtherKind + "/dead": 2, // invoice: no handler registered, dead at once
		"/acked":                    1, // no kind: Kinds.Default
	}
	if got := byKind(fams, "crdbwork_handler_duration_seconds", "shop"); !maps.Equal(got, want) {
		t.Errorf("handler_duration_seconds samples by kind/outcome = %v, want %v", got, want)
	}
	if sum := histogramSum(fams, "crdbwork_handler_duration_seconds", map[string]string{"kind": "order"}); sum < 5*0.001 {
		t.Errorf("the order runs took %vs in all, want at least 0.005s (each sleeps 1ms)", sum)
	}
	checkBacklog("after the run",
		map[string]float64{"order": 2, "refund": 1, "invoice": 1, "": 1},
		map[string]float64{"order": 0, "refund": 0, "invoice": 0, "": 0})
}

// A queue of more kinds than the gauges list on their own: the 20 with the
// most unclaimed items have a series each, the rest one OtherKind series
// with their sum, so that the series by kind add up to the queue's
// backlog; a kind a producer named "(other)" is counted in it, not in a
// second series of the same labels (which would fail the scrape). With
// BacklogByKind false (the default) there is no series by kind.
func TestBacklogByKindIsBounded(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q, err := claim.New(pool, claim.Options{Queue: "many"})
	if err != nil {
		t.Fatal(err)
	}
	// Kind kNN has NN items, 1 to 22, and "(other)" 10: the 20 listed are
	// k04..k22 and "(other)" (253 + 10 items in all).
	var items []claim.NewItem
	for k := 1; k <= 22; k++ {
		for range k {
			items = append(items, claim.NewItem{Kind: fmt.Sprintf("k%02d", k), Payload: []byte("x")})
		}
	}
	for range 10 {
		items = append(items, claim.NewItem{Kind: metrics.OtherKind, Payload: []byte("x")})
	}
	if _, err := q.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	for _, byKindOn := range []bool{true, false} {
		c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, QueryTimeout: queryTimeout(), BacklogByKind: byKindOn})
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
		fams := scrape(t, srv.URL)
		srv.Close()
		if up := mustValue(t, fams, "crdbwork_database_up", nil); up != 1 {
			t.Fatalf("BacklogByKind %v: database_up = %v (%v)", byKindOn, up, c.LastDatabaseError())
		}
		got := byKind(fams, "crdbwork_kind_backlog_items", "many")
		want := map[string]float64{metrics.OtherKind: 10 + 1 + 2 + 3}
		for k := 4; k <= 22; k++ {
			want[fmt.Sprintf("k%02d", k)] = float64(k)
		}
		if !byKindOn {
			want = map[string]float64{}
		}
		if !maps.Equal(got, want) {
			t.Errorf("BacklogByKind %v: kind_backlog_items = %v, want %v", byKindOn, got, want)
		}
		if len(got) > metrics.MaxKinds+1 {
			t.Errorf("BacklogByKind %v: %d series by kind, want at most %d", byKindOn, len(got), metrics.MaxKinds+1)
		}
		if due := byKind(fams, "crdbwork_kind_backlog_due_items", "many"); !maps.Equal(due, want) {
			t.Errorf("BacklogByKind %v: kind_backlog_due_items = %v, want %v (every item is due)", byKindOn, due, want)
		}
	}
}
