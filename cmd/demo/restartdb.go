package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/crdbwork/crdbwork/internal/cli"
	"github.com/crdbwork/crdbwork/internal/dbserver"
)

// dbRestarter restarts the embedded database server every so often while
// the workers run (demo run --restart-db-every): a real fault, the server
// going away and coming back on the same port with the same data.
type dbRestarter struct {
	srv   *dbserver.Server
	every time.Duration
	down  time.Duration // 0: a fast restart; else stop, wait down, start
	out   *cli.Console

	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex
	restarts int
	failed   error
}

// startRestarter starts restarting srv each time it has been up for every.
func startRestarter(srv *dbserver.Server, every, down time.Duration, out *cli.Console) *dbRestarter {
	r := &dbRestarter{srv: srv, every: every, down: down, out: out, stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *dbRestarter) run() {
	defer close(r.done)
	// The interval counts from the end of the previous restart, not on a
	// ticker: a restart can take longer than the interval on a busy
	// machine, and a ticker would then restart the server again as soon as
	// it is up, leaving it down for the whole run. The server is up at least
	// r.every between restarts.
	t := time.NewTimer(r.every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		begin := time.Now()
		var err error
		if r.down > 0 {
			err = r.srv.RestartAfter(ctx, r.down)
		} else {
			err = r.srv.Restart(ctx)
		}
		cancel()
		r.mu.Lock()
		if err != nil {
			r.failed = err
			r.mu.Unlock()
			r.out.Errorf("demo: restarting the embedded database server failed: %v", err)
			return
		}
		r.restarts++
		n := r.restarts
		r.mu.Unlock()
		r.out.Errorf("demo: restarted the embedded %s server (restart %d, took %s)", r.srv.Kind(), n, round(time.Since(begin)))
		t.Reset(r.every)
	}
}

// finish stops restarting, waits for a restart under way, and returns the
// number of restarts done and the error of a restart that failed.
func (r *dbRestarter) finish() (int, error) {
	if r == nil {
		return 0, nil
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.restarts, r.failed
}

// count returns the restarts so far (0 for nil).
func (r *dbRestarter) count() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.restarts
}

// startupRetryable reports a start-up error that a database restart
// explains: the server refused the connection, was shutting down or
// starting up, ended the connection as it shut down (57P01
// admin_shutdown: a fast shutdown or restart terminates every session;
// 57P02 crash_shutdown), or dropped the connection.
func startupRetryable(err error) bool {
	msg := err.Error()
	for _, s := range []string{"cannot reach the database", "57P01", "57P02", "57P03", "shutting down", "starting up",
		"connection refused", "conn closed", "unexpected EOF", "connection reset", "broken pipe"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// retryStartup runs start until it succeeds, fails for a reason other than
// a database restart, ctx ends, or wait has passed.
func retryStartup(ctx context.Context, wait time.Duration, start func() error) error {
	deadline := time.Now().Add(wait)
	for {
		err := start()
		if err == nil || wait <= 0 || !startupRetryable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
