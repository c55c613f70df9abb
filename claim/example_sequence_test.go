package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// A sequenced queue runs each key's items one at a time, in enqueue order:
// here two accounts' ledger entries. The first claim hands out the head of
// each key; the next entry of a key comes once its head is acked.
func ExampleQueue_UpdateSettings_sequenced() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	s, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	// README:begin sequence
	q, err := claim.New(pool, claim.Options{Queue: "ledger"})
	if err != nil {
		log.Fatal(err)
	}
	// Before the first enqueue, and once every worker runs crdbwork 0.5+.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		log.Fatal(err)
	}
	_, err = q.Enqueue(ctx,
		claim.NewItem{Key: "account-1", Payload: []byte("deposit 100")},
		claim.NewItem{Key: "account-1", Payload: []byte("withdraw 30")},
		claim.NewItem{Key: "account-2", Payload: []byte("deposit 5")},
	)
	if err != nil {
		log.Fatal(err)
	}
	c := q.Claimer(s.ID())
	first, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range first { // one item per key: each key's first
		fmt.Printf("%s: %s\n", it.Key, it.Payload)
		if err := q.Ack(ctx, it, nil); err != nil {
			log.Fatal(err)
		}
	}
	next, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range next { // account-1's next entry, now that its first is acked
		fmt.Printf("%s: %s\n", it.Key, it.Payload)
	}
	// README:end sequence

	// Unordered output:
	// account-1: deposit 100
	// account-2: deposit 5
	// account-1: withdraw 30
}

// In a queue that holds on a death, a dead head blocks its key until it is
// requeued (it then runs first), deleted or released. BlockedKeys lists
// the blocked keys with the item that blocks each.
func ExampleQueue_UpdateSettings_sequenceHold() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	s, err := session.Start(ctx, pool, session.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	q, err := claim.New(pool, claim.Options{Queue: "ledger"})
	if err != nil {
		log.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Sequenced: claim.On}); err != nil {
		log.Fatal(err)
	}
	_, err = q.Enqueue(ctx,
		claim.NewItem{Key: "account-1", Payload: []byte("deposit 100")},
		claim.NewItem{Key: "account-1", Payload: []byte("withdraw 30")},
	)
	if err != nil {
		log.Fatal(err)
	}

	// README:begin hold
	// A dead head holds its key until it is requeued, deleted or released.
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{SequenceHold: claim.On}); err != nil {
		log.Fatal(err)
	}
	c := q.Claimer(s.ID())
	first, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range first { // "deposit 100" fails for good: it dies
		if _, err := q.Nack(ctx, it, claim.Permanent(errors.New("bank offline"))); err != nil {
			log.Fatal(err)
		}
	}
	blocked, err := q.BlockedKeys(ctx, 100) // account-1, held by its dead head
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range blocked {
		fmt.Printf("%s: %s (%s)\n", b.Key, b.Kind, b.LastError)
		if b.Kind == claim.BlockedDead {
			// Run it again, first: the key goes on after it.
			if _, err := q.Requeue(ctx, claim.RequeueOptions{ID: b.ID}); err != nil {
				log.Fatal(err)
			}
		}
	}
	// README:end hold
	again, err := c.Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, it := range again {
		fmt.Printf("%s: %s\n", it.Key, it.Payload)
	}
	// Output:
	// account-1: dead (bank offline)
	// account-1: deposit 100
}
