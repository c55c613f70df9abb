package worker

import (
	"context"
	"time"

	"go.uber.org/zap"
)

// statisticsPause is how long a session leaves the tables' statistics
// alone after it analyzed a table or the check failed: the ANALYZE settles
// them (or the role may not analyze: the server warns and nothing changes).
// statisticsTimeout bounds the check and its ANALYZE (it samples 30,000
// rows: a fraction of a second here on a million, seconds on a slow disk).
const (
	statisticsPause   = time.Minute
	statisticsTimeout = 30 * time.Second
)

// checkStatistics runs the check of the queue's tables' statistics
// (refreshStatistics) on a goroutine of its own, one check at a time: when
// the session starts, then when the maintenance loop takes the queue's
// reap turn (about every queueReapHeartbeats heartbeats for the whole
// fleet, rather than for each session) and the session claimed items
// since the last check or reaps the queue (signalled on due), until the
// session ends. It is not on the maintenance loop: a check and its ANALYZE
// may take up to statisticsTimeout, during which the lease extensions,
// limit reads, cancels and reaps must go on (an item whose lease is not
// extended loses its claim while its handler runs). It uses one connection
// of the pool while it runs (PoolConns counts it).
func (r *sessionRun) checkStatistics(due <-chan struct{}) {
	ctx := r.sess.Context()
	var next time.Time // the check is due (zero: at once)
	for {
		r.refreshStatistics(ctx, &next)
		select {
		case <-ctx.Done():
			return
		case <-due:
		}
	}
}

// refreshStatistics has PostgreSQL analyze the queue's tables when its
// statistics say they are empty while they hold a backlog
// (queuemaint.Queue.RefreshStatistics), unless the session did so, or failed
// to, less than statisticsPause ago (next).
func (r *sessionRun) refreshStatistics(ctx context.Context, next *time.Time) {
	if time.Now().Before(*next) {
		return
	}
	if hook := r.w.opts.Testing.OnStatistics; hook != nil {
		hook(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, statisticsTimeout)
	defer cancel()
	done, err := r.w.maint.RefreshStatistics(sctx)
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		r.log.Debug("refreshing the tables' statistics failed", zap.Error(err))
	case len(done) > 0:
		r.log.Info("analyzed tables whose statistics said they were empty", zap.Strings("tables", done))
	default:
		return
	}
	*next = time.Now().Add(statisticsPause)
}
