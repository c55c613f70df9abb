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
	"github.com/crdbwork/crdbwork/internal/await"
	"github.com/crdbwork/crdbwork/internal/testdb"
	"github.com/crdbwork/crdbwork/internal/testschema"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestMetrics runs the example, enqueues items and scrapes /metrics until
// the acks show, then stops it.
func TestMetrics(t *testing.T) {
	pool := testschema.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), await.Stretch(2*time.Minute))
	defer cancel()
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
	await.Until(t, "50 acks in the scrape of /metrics", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the example stopped early: %v", err)
		default:
		}
		resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := acked.FindSubmatch(body)
		if m == nil {
			return false, "no crdbwork_items_acked_total of queue emails"
		}
		n, _ := strconv.ParseFloat(string(m[1]), 64)
		return n == 50, "crdbwork_items_acked_total " + string(m[1])
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
