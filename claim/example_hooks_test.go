package claim_test

import (
	"context"
	"fmt"
	"log"
	"maps"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/session"
)

// requestIDKey is the context key of a request id.
type requestIDKey struct{}

// requestHooks copies the request id of the producer's context into every
// item's headers, and prints the steps it is told of.
type requestHooks struct{ claim.NoHooks }

func (requestHooks) Enqueue(ctx context.Context, queue string, items []claim.NewItem, next claim.EnqueueFunc) (claim.Enqueued, error) {
	id, _ := ctx.Value(requestIDKey{}).(string)
	cp := make([]claim.NewItem, len(items))
	for i, it := range items {
		it.Headers = maps.Clone(it.Headers) // never the caller's map
		if it.Headers == nil {
			it.Headers = map[string]string{}
		}
		it.Headers["request-id"] = id
		cp[i] = it
	}
	return next(ctx, cp)
}

func (requestHooks) Step(ctx context.Context, s *claim.Step) func(error) {
	return func(err error) { fmt.Printf("%s of %d item(s) in %s: error %v\n", s.Kind, len(s.Items), s.Queue, err) }
}

// Hooks see every enqueue of a queue (here: to pass a request id on in the
// items' headers, as package otelcrdbwork passes trace context) and every
// claim, ack, nack and release.
func ExampleHooks() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "emails", Hooks: requestHooks{}})
	if err != nil {
		log.Fatal(err)
	}
	reqCtx := context.WithValue(ctx, requestIDKey{}, "req-42")
	if _, err := q.Enqueue(reqCtx, claim.NewItem{Payload: []byte("ada@example.com")}); err != nil {
		log.Fatal(err)
	}
	s, err := session.Start(ctx, pool, session.Options{Name: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)
	items, err := q.Claimer(s.ID()).Claim(ctx, claim.ClaimRequest{Max: 10})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("request-id:", items[0].Headers["request-id"])
	if err := q.Ack(ctx, items[0], nil); err != nil {
		log.Fatal(err)
	}
	// Output:
	// claim of 1 item(s) in emails: error <nil>
	// request-id: req-42
	// ack of 1 item(s) in emails: error <nil>
}
