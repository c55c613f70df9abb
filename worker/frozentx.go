package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/session"
)

// ConfigurePool prepares the configuration of a worker's pool for workers
// with Options opts: every connection starts with
// idle_in_transaction_session_timeout set to the session expiry
// (opts.Session.Expiry, default session.DefaultExpiry), sent as a startup
// parameter, so it costs no round trip. Call it before
// pgxpool.NewWithConfig:
//
//	cfg, err := pgxpool.ParseConfig(url)
//	...
//	if err := worker.ConfigurePool(cfg, opts); err != nil { ... }
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// Without it, a worker process frozen while one of its transactions is
// open (SIGSTOP, a paused VM, a network cut without a reset) keeps that
// transaction's row locks for as long as the server keeps its connection
// (hours, with TCP keepalive), and no peer can delete its expired session
// meanwhile, nor any other expired session of the database: its items and
// parts do not move. See session.ConfigurePool for the details and the
// bound. Run checks the setting once and logs a warning when it is
// missing or longer than the expiry.
func ConfigurePool(cfg *pgxpool.Config, opts Options) error {
	if err := session.ConfigurePool(cfg, session.Options{Tuning: opts.Session}); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// idleTimeoutCheck bounds the one read of the setting per Run.
const idleTimeoutCheck = 5 * time.Second

// checkIdleTimeout reads the idle_in_transaction_session_timeout of one of
// the pool's connections and logs a warning when it is 0 (none) or longer
// than the session expiry: a frozen process's open transaction would then
// hold its locks, and its peers' reapers of expired sessions, for longer
// than the expiry. It reports what it found: "" when the setting is in
// bounds, the warning otherwise. A failed read is logged at debug level
// only (it changes nothing about the work).
func (w *Worker) checkIdleTimeout(ctx context.Context, expiry time.Duration, log *zap.Logger) string {
	ctx, cancel := context.WithTimeout(ctx, idleTimeoutCheck)
	defer cancel()
	var v string
	if err := w.db.QueryRow(ctx, store.IdleInTransactionTimeout).Scan(&v); err != nil {
		log.Debug("could not read idle_in_transaction_session_timeout", zap.Error(err))
		return ""
	}
	d, err := session.ParseSetting(v)
	if err != nil {
		log.Debug("could not read idle_in_transaction_session_timeout", zap.Error(err))
		return ""
	}
	if d > 0 && d <= expiry {
		return ""
	}
	msg := fmt.Sprintf("the pool's connections have idle_in_transaction_session_timeout %q, which is 0 or longer than the session expiry %v: "+
		"a worker process frozen while a transaction is open (SIGSTOP, a paused VM, a cut network) keeps its locks until the server ends its connection, "+
		"and no peer can reap any expired session meanwhile; configure the pool with worker.ConfigurePool", v, expiry)
	log.Warn(msg)
	return msg
}
