package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// What happened to an item (River's JobGet, pg-boss's getJobById): Item
// finds it in any state, here acked, with each attempt's outcome and error.
// An id the queue does not have (or has forgotten: Retention.HistoryWindow)
// is ErrItemNotFound.
func ExampleQueue_Item() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "invoices", BackoffBase: 1})
	if err != nil {
		log.Fatal(err)
	}
	res, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte("invoice 1042")})
	if err != nil {
		log.Fatal(err)
	}
	s, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	for attempt := 1; attempt <= 2; {
		items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 1})
		if err != nil {
			log.Fatal(err)
		}
		if len(items) == 0 {
			continue // its retry's backoff
		}
		if attempt == 1 {
			_, err = q.Nack(ctx, items[0], errors.New("the mail server timed out"))
		} else {
			err = q.Ack(ctx, items[0], nil)
		}
		if err != nil {
			log.Fatal(err)
		}
		attempt++
	}

	it, err := q.Item(ctx, res.IDs[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(it.State, "after", it.Attempts, "attempts")
	for _, a := range it.History {
		fmt.Println(strings.TrimSpace(fmt.Sprintf("attempt %d: %s %s", a.Number, a.Outcome, a.Error)))
	}
	_, err = q.Item(ctx, s.ID()) // not an item's id
	fmt.Println(errors.Is(err, claim.ErrItemNotFound))
	// Output:
	// acked after 2 attempts
	// attempt 1: failed the mail server timed out
	// attempt 2: succeeded
	// true
}

// Listing the items in one state (River's JobList, pg-boss's findJobs):
// Items with a State pages through them by keyset, optionally of one key
// or tenant.
func ExampleItemQuery_state() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	for i := range 5 {
		if _, err := q.Enqueue(ctx, claim.NewItem{Payload: []byte(fmt.Sprint("mail ", i)), Key: fmt.Sprint("user-", i%2)}); err != nil {
			log.Fatal(err)
		}
	}
	query := claim.ItemQuery{State: claim.StateQueued, Key: "user-0", Limit: 2}
	for page := 1; ; page++ {
		p, err := q.Items(ctx, query)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("page", page, "items", len(p.Items))
		if p.Next == "" {
			break
		}
		query.After = p.Next
	}
	// Output:
	// page 1 items 2
	// page 2 items 1
}
