package claim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/crdbwork/crdbwork/claim"
)

// Many request handlers enqueue one item each, at the same time: through a
// Buffer their items share statements (group commit) instead of costing one
// round trip and one commit each, and each caller still learns whether its
// own item committed.
func ExampleBuffer() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "emails"})
	if err != nil {
		log.Fatal(err)
	}
	buf, err := claim.NewBuffer(q, claim.BufferOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// What each request handler does.
	enqueue := func(address string) error {
		it := claim.NewItem{Payload: []byte(address)}
		for {
			res, err := buf.Enqueue(ctx, it)
			if errors.Is(err, claim.ErrOutcomeUnknown) {
				it.ID = res.IDs[0] // the same id again: added once, whatever happened
				continue
			}
			return err
		}
	}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := enqueue(fmt.Sprintf("user%d@example.com", i)); err != nil {
				log.Print(err)
			}
		}()
	}
	wg.Wait()
	// A bad item fails alone, at once.
	_, err = buf.Enqueue(ctx, claim.NewItem{Payload: make([]byte, 2<<20)})
	fmt.Println("too large:", errors.Is(err, claim.ErrPayloadTooLarge))
	// Close flushes what still waits.
	if err := buf.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("items:", exampleCount(ctx, pool, `SELECT count(*) FROM crdbwork_items`))
	fmt.Println("fewer statements than items:", buf.Stats().Flushes < 100)
	// Output:
	// too large: true
	// items: 100
	// fewer statements than items: true
}
