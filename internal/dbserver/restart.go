package dbserver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStopped is returned (wrapped) by Restart, Halt and Resume after Stop.
var ErrStopped = errors.New("dbserver: the server was stopped")

// restartTimeout bounds a restart operation when ctx has no deadline.
const restartTimeout = 3 * time.Minute

// Restart restarts the running server in place, on the same port and data
// directory, as an operator's restart would: PostgreSQL with
// `pg_ctl restart -m fast` (open sessions are ended, the shutdown is clean,
// the server starts again at once); CockroachDB by stopping the process
// (SIGTERM, SIGKILL if it is not gone within 10 s) and starting it again on
// the same store and SQL port. Clients see their connections closed and can
// reconnect to the same URL when Restart returns. Restarts, halts and
// resumes of one server run one at a time.
func (s *Server) Restart(ctx context.Context) error {
	return s.restartOp(ctx, "restart", s.restart)
}

// Halt stops the server process and keeps its data, port and directory, so
// that Resume can start it again: PostgreSQL with `pg_ctl stop -m fast`,
// CockroachDB with SIGTERM (then SIGKILL). When it returns, the port refuses
// connections. Halting a halted server does nothing.
func (s *Server) Halt(ctx context.Context) error {
	return s.restartOp(ctx, "halt", s.halt)
}

// Resume starts a halted server again on the same port and data directory
// and waits until it accepts connections. Resuming a running server does
// nothing on CockroachDB and fails on PostgreSQL (pg_ctl finds it running).
func (s *Server) Resume(ctx context.Context) error {
	return s.restartOp(ctx, "resume", s.resume)
}

// RestartAfter halts the server, waits down (or until ctx ends) and resumes
// it: a database outage of a known length.
func (s *Server) RestartAfter(ctx context.Context, down time.Duration) error {
	if err := s.Halt(ctx); err != nil {
		return err
	}
	t := time.NewTimer(down)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		// Bring it back anyway: a halted server is no use to anyone.
		ctx = context.WithoutCancel(ctx)
	}
	return s.Resume(ctx)
}

func (s *Server) restartOp(ctx context.Context, what string, op func(context.Context) error) error {
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	if s.stopped {
		return fmt.Errorf("dbserver: %s %s server in %s: %w", what, s.kind, s.dir, ErrStopped)
	}
	if op == nil {
		return fmt.Errorf("dbserver: %s: not supported by this %s server", what, s.kind)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, restartTimeout)
		defer cancel()
	}
	begin := time.Now()
	if err := op(ctx); err != nil {
		return fmt.Errorf("dbserver: %s %s server in %s: %w", what, s.kind, s.dir, err)
	}
	s.logf("%s of %s server took %v", what, s.kind, time.Since(begin).Round(time.Millisecond))
	return nil
}
