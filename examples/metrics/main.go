// Command metrics is the metrics example of docs/operations.md: a worker
// whose counters, histograms and database gauges are served to Prometheus at
// /metrics.
//
//	DATABASE_URL='postgresql://root@localhost:26257/app?sslmode=disable' go run ./examples/metrics
package main

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/metrics"
	crsql "github.com/crdbwork/crdbwork/sql"
	"github.com/crdbwork/crdbwork/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	l, err := net.Listen("tcp", "127.0.0.1:9464")
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, os.Getenv("DATABASE_URL"), l); err != nil {
		log.Fatal(err)
	}
}

// run works queue "emails" until ctx ends, serving /metrics on l.
func run(ctx context.Context, url string, l net.Listener) error {
	opts := worker.Options{Parts: 16}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	// The server ends a transaction left idle longer than the session
	// expiry: a frozen worker cannot keep its items locked.
	if err := worker.ConfigurePool(cfg, opts); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := crsql.Check(ctx, pool, crsql.Tables{}); err != nil {
		return err
	}
	// With DB set, the collector also reads the backlog, claimed and dead
	// items and the oldest due item's age at scrape time (cached for 5 s).
	m := metrics.New(metrics.Options{DB: pool})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector())

	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		return err
	}
	opts.Observer = m // handler durations and ack batch sizes
	w, err := worker.New(q, handle, opts)
	if err != nil {
		return err
	}
	m.AddWorker(w) // its counters, read at scrape time

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	runErr := w.Run(ctx)
	if err := srv.Close(); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}

func handle(ctx context.Context, it claim.Item) (worker.Record, error) {
	return nil, nil // nothing to record
}
