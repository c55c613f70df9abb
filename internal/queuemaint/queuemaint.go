// Package queuemaint is the door through which package worker (and the
// crdbwork command and tests) reach the maintenance of a claim.Queue,
// which claim does not export: reaping expired leases and pruning, the
// tables' statistics, and what only a worker's claim loop needs. Users of
// claim never need it; the compiler keeps them out (internal/).
//
// Package claim registers its implementation when it is initialized, so
// For works for every *claim.Queue of a program that imports claim.
package queuemaint

import (
	"context"
	"fmt"
)

// ReapStats is claim.ReapStats, field for field (convert one to the
// other): what one Reap did.
type ReapStats struct {
	Released, Dead, Expired, Refused, Stuck int
	Pruned, DeadPruned, Cancelled           int
	Unblocked, DependencyDead               int
}

// Queue is the maintenance of one claim.Queue.
type Queue interface {
	// Reap ends the queue's cancelled items no handler will end, releases
	// its expired leases, moves its exhausted and expired items to the
	// dead items, sweeps its dependencies, forgets the ended ids past its
	// dedup window and deletes the dead items beyond its retention
	// (claim's documentation of ReapStats says what each counts).
	Reap(ctx context.Context) (ReapStats, error)
	// PrunesDue reports whether the steps of Reap that the queue's reap
	// turn's test of work leaves out (the exhausted items, the prunes of
	// ended ids, kept cancelled items, attempt errors and dead items, the
	// cross-queue edges) may have anything to do, in one statement: false
	// means that a Reap after a turn that found no work for the item
	// steps would do nothing.
	PrunesDue(ctx context.Context) (bool, error)
	// PruneDead applies the queue's retention to its dead items alone and
	// returns how many it deleted (at most 8,000 per bound per call).
	PruneDead(ctx context.Context) (int, error)
	// PruneEnded forgets the ended ids past the queue's dedup window alone
	// and returns how many it deleted (at most 8,000 per call).
	PruneEnded(ctx context.Context) (int, error)
	// RefreshStatistics analyzes, on PostgreSQL, the queue's tables whose
	// statistics say they are empty while they hold a backlog, and
	// returns the tables it analyzed.
	RefreshStatistics(ctx context.Context) ([]string, error)
	// CancelChannel is the notification channel of the queue's cancel
	// requests.
	CancelChannel() string
	// ClaimsSequenced reports whether the queue's claims are sequenced, as
	// it last read (no I/O).
	ClaimsSequenced() bool
}

var of func(q any) (Queue, bool)

// Register is called by package claim, once, when it is initialized.
func Register(f func(q any) (Queue, bool)) { of = f }

// For returns the maintenance of q, a *claim.Queue. It panics on anything
// else (a programming error of crdbwork's own packages).
func For(q any) Queue {
	if of != nil {
		if m, ok := of(q); ok {
			return m
		}
	}
	panic(fmt.Sprintf("queuemaint: %T is not a *claim.Queue", q))
}
