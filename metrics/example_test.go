package metrics_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/metrics"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// A producer's process: its queue's counters and the database's backlog,
// gathered as a Prometheus scrape would (a worker is added with AddWorker
// and given the collector as worker.Options.Observer).
func ExampleCollector() {
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
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}

	c := metrics.New(metrics.Options{DB: pool})
	c.AddQueue(q)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("a")}, claim.NewItem{Payload: []byte("b")}); err != nil {
		log.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "crdbwork_items_enqueued_total", "crdbwork_backlog_items", "crdbwork_database_up":
			for _, m := range f.GetMetric() {
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
				fmt.Println(f.GetName(), v)
			}
		}
	}
	// Output:
	// crdbwork_backlog_items 2
	// crdbwork_database_up 1
	// crdbwork_items_enqueued_total 2
}
