package claim

import (
	"context"

	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// The maintenance of a Queue (reaping, pruning, statistics, what only a
// worker's claim loop reads) is not part of its API: package worker runs
// it through internal/queuemaint, which this registers.
func init() {
	queuemaint.Register(func(q any) (queuemaint.Queue, bool) {
		cq, ok := q.(*Queue)
		if !ok || cq == nil {
			return nil, false
		}
		return maintenance{cq}, true
	})
}

// maintenance is a Queue's queuemaint.Queue.
type maintenance struct{ q *Queue }

func (m maintenance) Reap(ctx context.Context) (queuemaint.ReapStats, error) {
	st, err := m.q.reapQueue(ctx)
	return queuemaint.ReapStats(st), err
}

func (m maintenance) PrunesDue(ctx context.Context) (bool, error) { return m.q.prunesDue(ctx) }

func (m maintenance) PruneDead(ctx context.Context) (int, error) { return m.q.pruneDeadItems(ctx) }

func (m maintenance) PruneEnded(ctx context.Context) (int, error) { return m.q.pruneEndedIDs(ctx) }

func (m maintenance) RefreshStatistics(ctx context.Context) ([]string, error) {
	return m.q.refreshStatistics(ctx)
}

func (m maintenance) CancelChannel() string { return m.q.cancelChannel() }

func (m maintenance) ClaimsSequenced() bool { return m.q.claimsSequenced() }
