package metrics_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/metrics"
	"github.com/crdbwork/crdbwork/session"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

// A worker of two kinds, with the Collector as its Observer: the handler
// histogram counts runs by kind (a kind the worker did not register as
// metrics.OtherKind), and the database gauges show the backlog by kind.
func ExampleCollector_kinds() {
	url, drop := testdb.ExampleURL()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		log.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "jobs"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := q.Enqueue(ctx,
		claim.NewItem{Kind: "send_mail", Payload: []byte(`{}`)},
		claim.NewItem{Kind: "send_mail", Payload: []byte(`{}`)},
		claim.NewItem{Kind: "resize", Payload: []byte(`{}`)},
		claim.NewItem{Kind: "resize", Payload: []byte(`{}`), Delay: time.Hour}, // stays in the backlog
		claim.NewItem{Kind: "send_sms", Payload: []byte(`{}`)}); err != nil {   // no handler: dead at once
		log.Fatal(err)
	}

	c := metrics.New(metrics.Options{DB: pool, CacheFor: time.Nanosecond, BacklogByKind: true})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	kinds := worker.NewKinds()
	for _, kind := range []string{"send_mail", "resize"} {
		kinds.Handle(kind, func(context.Context, claim.Item) (worker.Record, error) { return nil, nil })
	}
	w, err := worker.New(q, kinds.Handler(), worker.Options{Observer: c, Poll: 20 * time.Millisecond,
		Session: session.Tuning{Heartbeat: 100 * time.Millisecond, Expiry: 2 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	c.AddWorker(w)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	// series returns "name{kind=…,outcome=…} value" lines of the metrics
	// by kind, and the handler runs counted.
	series := func() (lines []string, runs uint64) {
		families, err := reg.Gather()
		if err != nil {
			log.Fatal(err)
		}
		for _, f := range families {
			switch f.GetName() {
			case "crdbwork_handler_duration_seconds", "crdbwork_kind_backlog_items":
			default:
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if h := m.GetHistogram(); h != nil {
					runs += h.GetSampleCount()
					lines = append(lines, fmt.Sprintf("%s{kind=%q,outcome=%q} %d", f.GetName(), labels["kind"], labels["outcome"], h.GetSampleCount()))
					continue
				}
				lines = append(lines, fmt.Sprintf("%s{kind=%q} %v", f.GetName(), labels["kind"], m.GetGauge().GetValue()))
			}
		}
		slices.Sort(lines)
		return lines, runs
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, runs := series(); runs == 4 {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("the handler runs were not all counted")
		}
	}
	stop()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	// send_mail's items are all acked: no series; send_sms's is dead: 0.
	lines, _ := series()
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// crdbwork_handler_duration_seconds{kind="(other)",outcome="dead"} 1
	// crdbwork_handler_duration_seconds{kind="resize",outcome="acked"} 1
	// crdbwork_handler_duration_seconds{kind="send_mail",outcome="acked"} 2
	// crdbwork_kind_backlog_items{kind="resize"} 1
	// crdbwork_kind_backlog_items{kind="send_sms"} 0
}
