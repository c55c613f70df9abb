package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestMetrics runs the example, enqueues items and scrapes /metrics until
// the acks show, then stops it.
func TestMetrics(t *testing.T) {
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := crsql.Apply(ctx, pool, crsql.Tables{}); err != nil {
		t.Fatal(err)
	}
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, make([]claim.NewItem, 50)...); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(wctx, pool.Config().ConnString(), l) }()
	acked := regexp.MustCompile(`(?m)^crdbwork_items_acked_total\{queue="emails"\} (\S+)$`)
	for {
		resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if m := acked.FindSubmatch(body); m != nil {
				if n, _ := strconv.ParseFloat(string(m[1]), 64); n == 50 {
					break
				}
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the example stopped early: %v", err)
		case <-ctx.Done():
			t.Fatal("no 50 acks in the scrape within 2 minutes")
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
