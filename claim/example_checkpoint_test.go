package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/queuemaint"
)

// Save a checkpoint and a progress for a claimed item: a retry hands both
// to the next attempt, and the stale copy of the first claim can no longer
// overwrite them.
func ExampleQueue_SaveCheckpoint() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, items, closeSession := claimEmailsWith(ctx, pool, claim.Options{Queue: "emails", BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}, "ada@example.com")
	defer closeSession()
	first := items[0]

	if err := q.SaveCheckpoint(ctx, first, []byte("smtp session 7, 2 of 3 parts sent")); err != nil {
		log.Fatal(err)
	}
	if err := q.ReportProgress(ctx, first, claim.Progress{Done: 2, Total: 3}); err != nil {
		log.Fatal(err)
	}
	if _, err := q.Nack(ctx, first, errors.New("connection reset")); err != nil {
		log.Fatal(err)
	}

	// The next attempt (here claimed by the same session, once the retry's
	// backoff has passed) gets both.
	var next claim.Item
	for next.ID != first.ID {
		got, err := q.Claimer(first.Session).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil {
			log.Fatal(err)
		}
		if len(got) == 1 {
			next = got[0]
		}
	}
	fmt.Printf("attempt %d resumes from %q at %v\n", next.Attempt, next.Checkpoint, next.Progress)
	err := q.SaveCheckpoint(ctx, first, []byte("stale"))
	fmt.Println("the first attempt's save is refused:", errors.Is(err, claim.ErrClaimLost))
	// Output:
	// attempt 2 resumes from "smtp session 7, 2 of 3 parts sent" at 2/3 (67%)
	// the first attempt's save is refused: true
}

// Keep a queue's dead items for a week, at most 10,000 of them: every worker
// session's reaper deletes the older ones, and the oldest beyond the count.
func ExampleQueue_UpdateSettings_retention() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	r, err := readRetention(q.Settings(ctx))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("default: %v, at most %d\n", r.DeadMaxAge, r.DeadMaxCount)

	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Retention: &claim.Retention{DeadMaxAge: 7 * 24 * time.Hour, DeadMaxCount: 10_000}}); err != nil {
		log.Fatal(err)
	}
	if r, err = readRetention(q.Settings(ctx)); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("set: %v, at most %d\n", r.DeadMaxAge, r.DeadMaxCount)

	// A reap (every worker session runs them) applies it; PruneDead alone
	// does the same.
	pruned, err := queuemaint.For(q).PruneDead(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pruned:", pruned)
	// Output:
	// default: 720h0m0s, at most 100000
	// set: 168h0m0s, at most 10000
	// pruned: 0
}
