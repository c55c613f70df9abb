package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/metrics"
)

// metricsServer serves /metrics for --metrics-addr.
type metricsServer struct {
	collector *metrics.Collector
	srv       *http.Server
	addr      string
}

// serveMetrics listens on addr and serves the crdbwork collector (reading
// the database gauges through db) and the Go runtime's metrics at /metrics.
// A bad or busy address is an exit-2 error.
func serveMetrics(addr string, db claim.DB, out *cli.Console) (*metricsServer, error) {
	c := metrics.New(metrics.Options{DB: db, Tables: tables})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, cli.Failf(2, "--metrics-addr %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m := &metricsServer{collector: c, addr: l.Addr().String(),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	go func() {
		if err := m.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			out.Errorf("demo: serving metrics on %s: %v", m.addr, err)
		}
	}()
	out.Errorf("demo: serving metrics on http://%s/metrics", m.addr)
	return m, nil
}

// close stops the server.
func (m *metricsServer) close() {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.srv.Shutdown(ctx)
}
