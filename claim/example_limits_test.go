package claim_test

import (
	"context"
	"fmt"
	"log"

	"github.com/crdbwork/crdbwork/claim"
)

// Limit a queue to 20 items in flight and 50 started per second across all
// its workers, every tenant to 4 in flight, and one tenant to 1 item per
// second. The workers read the stored limits by themselves.
func ExampleQueue_SetTenantLimit() {
	ctx := context.Background()
	pool, done := examplePool(ctx)
	defer done()
	q, err := claim.New(pool, claim.Options{Queue: "reports"})
	if err != nil {
		log.Fatal(err)
	}
	s, err := q.Settings(ctx)
	if err != nil {
		log.Fatal(err)
	}
	s.MaxInFlight, s.Rate, s.TenantMaxInFlight = 20, 50, 4
	if err := q.Configure(ctx, s); err != nil {
		log.Fatal(err)
	}
	if err := q.SetTenantLimit(ctx, "acme", claim.Limit{MaxInFlight: 4, Rate: 1}); err != nil {
		log.Fatal(err)
	}
	tenants, err := q.TenantLimits(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("acme: %+v\n", tenants["acme"])
	// Output:
	// acme: {MaxInFlight:4 Rate:1}
}
