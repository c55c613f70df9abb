package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
	"github.com/crdbwork/crdbwork/metrics"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// setup returns a pool on a fresh database of the test with the schema.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return testschema.New(t)
}

// queryTimeout is the collector's bound on one read of the database
// gauges, stretched with the machine's load: the tests assert
// database_up = 1 while the database is up, which a loaded machine's slow
// read past the default 3 s would make 0.
func queryTimeout() time.Duration { return await.Stretch(metrics.DefaultQueryTimeout) }

// scrape fetches url and parses the Prometheus text exposition format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the scrape: %v", err)
	}
	return fams
}

// value returns the value of the series of name whose labels include want,
// and whether there is one.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := value(fams, name, labels)
	if !ok {
		t.Fatalf("no series %s%v in the scrape", name, labels)
	}
	return v
}

// histogramSum returns the sample sum of a histogram series.
func histogramSum(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		ok := true
		for _, l := range m.Label {
			if v, set := want[l.GetName()]; set && v != l.GetValue() {
				ok = false
			}
		}
		if ok && m.Histogram != nil {
			sum += m.Histogram.GetSampleSum()
		}
	}
	return sum
}

// TestScrape runs a worker with the collector as its observer, serves
// /metrics over real HTTP, and checks the scraped values against what
// happened and what the database holds.
func TestScrape(t *testing.T) {
	t.Parallel()
	const n, failing, parts = 300, 7, 4
	pool := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "mq", parts); err != nil {
		t.Fatal(err)
	}
	producer, err := claim.New(pool, claim.Options{Queue: "mq"})
	if err != nil {
		t.Fatal(err)
	}
	items := make([]claim.NewItem, 0, n+failing)
	for i := range n {
		items = append(items, claim.NewItem{Payload: []byte("ok"), Key: fmt.Sprint(i)})
	}
	for range failing {
		items = append(items, claim.NewItem{Payload: []byte("fail")})
	}
	if _, err := producer.Enqueue(ctx, items...); err != nil {
		t.Fatal(err)
	}
	// Items that are not due for an hour: backlog, but not due, and not
	// the oldest due item.
	if _, err := producer.Enqueue(ctx, claim.NewItem{Payload: []byte("later"), Delay: time.Hour},
		claim.NewItem{Payload: []byte("later"), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}

	c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, QueryTimeout: queryTimeout()})
	c.AddQueue(producer)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()

	// Before any worker: the whole backlog is due and waiting.
	before := scrape(t, srv.URL)
	if got := mustValue(t, before, "crdbwork_items_enqueued_total", map[string]string{"queue": "mq"}); got != n+failing+2 {
		t.Errorf("enqueued_total = %v, want %d", got, n+failing+2)
	}
	var backlog, due float64
	for p := range parts {
		backlog += mustValue(t, before, "crdbwork_backlog_items", map[string]string{"queue": "mq", "part": fmt.Sprint(p)})
		due += mustValue(t, before, "crdbwork_backlog_due_items", map[string]string{"queue": "mq", "part": fmt.Sprint(p)})
	}
	if backlog != n+failing+2 || due != n+failing {
		t.Errorf("backlog %v (due %v), want %d (due %d)", backlog, due, n+failing+2, n+failing)
	}
	if age := mustValue(t, before, "crdbwork_oldest_unclaimed_age_seconds", map[string]string{"queue": "mq"}); age <= 0 || age > 60 {
		t.Errorf("oldest due item's age = %vs, want more than 0 and less than a minute", age)
	}
	if up := mustValue(t, before, "crdbwork_database_up", nil); up != 1 {
		t.Errorf("database_up = %v, want 1 (%v)", up, c.LastDatabaseError())
	}

	handler := func(ctx context.Context, it claim.Item) (worker.Record, error) {
		if string(it.Payload) == "fail" {
			return nil, claim.Permanent(errors.New("bad item"))
		}
		time.Sleep(time.Millisecond) // the handler's work, which the duration histogram must show
		return func(ctx context.Context, tx pgx.Tx) error { return nil }, nil
	}
	wq, err := claim.New(pool, claim.Options{Queue: "mq"})
	if err != nil {
		t.Fatal(err)
	}
	// An expiry stretched with the machine's load: the scrape counts the
	// sessions started and lost, and a loaded machine must not lose one.
	w, err := worker.New(wq, handler, worker.Options{Parts: parts, Concurrency: 8, Observer: c,
		Partition: partition.Tuning{Poll: 50 * time.Millisecond}, Session: session.Tuning{Expiry: await.Stretch(session.DefaultExpiry)}})
	if err != nil {
		t.Fatal(err)
	}
	c.AddWorker(w)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	await.Until(t, "the due items to be handled", func() (bool, string) {
		st := w.Stats()
		return st.Acked+st.Dead == n+failing, fmt.Sprintf("%d acked, %d dead, of %d", st.Acked, st.Dead, n+failing)
	}, await.Within(2*time.Minute))
	// During the run: the worker's counters are in the scrape.
	during := scrape(t, srv.URL)
	if got := mustValue(t, during, "crdbwork_sessions_started_total", map[string]string{"queue": "mq"}); got != 1 {
		t.Errorf("sessions_started_total = %v, want 1", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	after := scrape(t, srv.URL)
	q := map[string]string{"queue": "mq"}
	for name, want := range map[string]float64{
		"crdbwork_items_acked_total":      n,
		"crdbwork_items_dead_total":       failing,
		"crdbwork_items_claimed_total":    n + failing,
		"crdbwork_dead_items":             failing,
		"crdbwork_claimed_items":          0,
		"crdbwork_handlers_in_flight":     0,
		"crdbwork_sessions_lost_total":    0,
		"crdbwork_sessions_started_total": 1,
	} {
		if got := mustValue(t, after, name, q); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := mustValue(t, after, "crdbwork_parts_acquired_total", q); got != parts {
		t.Errorf("parts_acquired_total = %v, want %d (one session took every part)", got, parts)
	}
	if got := mustValue(t, after, "crdbwork_handler_duration_seconds", map[string]string{"queue": "mq", "outcome": "acked"}); got != n {
		t.Errorf("handler runs acked = %v, want %d", got, n)
	}
	if got := mustValue(t, after, "crdbwork_handler_duration_seconds", map[string]string{"queue": "mq", "outcome": "dead"}); got != failing {
		t.Errorf("handler runs dead = %v, want %d", got, failing)
	}
	if sum := histogramSum(after, "crdbwork_handler_duration_seconds", map[string]string{"outcome": "acked"}); sum < float64(n)*0.001 {
		t.Errorf("acked handlers took %vs in all, want at least %vs (each sleeps 1ms)", sum, float64(n)*0.001)
	}
	// Every acked item was in exactly one ack transaction.
	if sum := histogramSum(after, "crdbwork_ack_batch_size", q); sum != n {
		t.Errorf("ack batch sizes sum to %v, want %d", sum, n)
	}
	if batches := mustValue(t, after, "crdbwork_ack_batch_size", q); batches < 1 || batches > n {
		t.Errorf("%v ack transactions for %d items", batches, n)
	}
	// The two delayed items are all that is left, not due.
	backlog, due = 0, 0
	for p := range parts {
		if v, ok := value(after, "crdbwork_backlog_items", map[string]string{"queue": "mq", "part": fmt.Sprint(p)}); ok {
			backlog += v
		}
		if v, ok := value(after, "crdbwork_backlog_due_items", map[string]string{"queue": "mq", "part": fmt.Sprint(p)}); ok {
			due += v
		}
	}
	if backlog != 2 || due != 0 {
		t.Errorf("after the run: backlog %v (due %v), want 2 (due 0)", backlog, due)
	}
	if age := mustValue(t, after, "crdbwork_oldest_unclaimed_age_seconds", q); age != 0 {
		t.Errorf("oldest due item's age = %v with nothing due, want 0", age)
	}
}

// TestDatabaseDown checks that a failing database read shows as
// database_up 0 and an error count, and that the process metrics are still
// served.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, QueryTimeout: queryTimeout()})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	if up := mustValue(t, scrape(t, srv.URL), "crdbwork_database_up", nil); up != 1 {
		t.Fatalf("database_up = %v before the failure, want 1", up)
	}
	pool.Close()
	fams := scrape(t, srv.URL)
	if up := mustValue(t, fams, "crdbwork_database_up", nil); up != 0 {
		t.Errorf("database_up = %v with the pool closed, want 0", up)
	}
	if n := mustValue(t, fams, "crdbwork_database_read_errors_total", nil); n != 1 {
		t.Errorf("database_read_errors_total = %v, want 1", n)
	}
	if c.LastDatabaseError() == nil {
		t.Error("LastDatabaseError is nil after a failed read")
	}
}

// TestDatabaseGaugesEveryQueue checks which series the database gauges
// have for queues in different states: a stored queue with no items has
// every part's backlog at 0, its claimed items and oldest age at 0, and no
// dead series; a queue without a stored row has the parts that hold items;
// a queue with dead items only has a dead series and nothing else.
func TestDatabaseGaugesEveryQueue(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	if err := partition.SetParts(ctx, pool, crsql.Tables{}, "stored", 3); err != nil {
		t.Fatal(err)
	}
	plain, err := claim.New(pool, claim.Options{Queue: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	first := uuid.New()
	// The third waits for the first (dependencies): a waiting item, not in
	// the backlog.
	if _, err := plain.Enqueue(ctx, claim.NewItem{ID: first, Payload: []byte("a")}, claim.NewItem{Payload: []byte("b"), Delay: time.Hour},
		claim.NewItem{Payload: []byte("c"), After: []uuid.UUID{first}}); err != nil {
		t.Fatal(err)
	}
	deadOnly, err := claim.New(pool, claim.Options{Queue: "deadonly"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deadOnly.Enqueue(ctx, claim.NewItem{Payload: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	s, err := session.Start(ctx, pool, session.Options{Tuning: session.Tuning{Heartbeat: 500 * time.Millisecond, Expiry: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	its, err := deadOnly.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
	if err != nil || len(its) != 1 {
		t.Fatalf("Claim = %d, %v", len(its), err)
	}
	if o, err := deadOnly.Nack(ctx, its[0], claim.Permanent(errors.New("bad"))); err != nil || o != claim.Dead {
		t.Fatalf("Nack = %v, %v; want Dead", o, err)
	}

	c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, QueryTimeout: queryTimeout()})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	fams := scrape(t, srv.URL)
	if up := mustValue(t, fams, "crdbwork_database_up", nil); up != 1 {
		t.Fatalf("database_up = %v (%v)", up, c.LastDatabaseError())
	}
	series := func(name string) map[string]float64 {
		out := map[string]float64{}
		if f := fams[name]; f != nil {
			for _, m := range f.Metric {
				key := "" // label values, in label-name order (part, queue)
				for _, l := range m.Label {
					key += l.GetValue() + "/"
				}
				out[key] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	for name, want := range map[string]map[string]float64{
		"crdbwork_backlog_items":                {"0/plain/": 2, "0/stored/": 0, "1/stored/": 0, "2/stored/": 0},
		"crdbwork_backlog_due_items":            {"0/plain/": 1, "0/stored/": 0, "1/stored/": 0, "2/stored/": 0},
		"crdbwork_claimed_items":                {"plain/": 0, "stored/": 0},
		"crdbwork_dead_items":                   {"deadonly/": 1},
		"crdbwork_waiting_items":                {"plain/": 1, "stored/": 0},
		"crdbwork_sessions_live":                {"": 1},
		"crdbwork_sessions_expired":             {"": 0},
		"crdbwork_oldest_unclaimed_age_seconds": {"plain/": -1, "stored/": 0},
	} {
		got := series(name)
		if name == "crdbwork_oldest_unclaimed_age_seconds" {
			// plain's one due item waits: more than 0, less than a minute.
			if a := got["plain/"]; a > 0 && a < 60 {
				got["plain/"] = -1
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
