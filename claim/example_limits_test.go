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
func ExampleQueue_UpdateSettings_tenantLimits() {
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
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy}); err != nil {
		log.Fatal(err)
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"acme": &claim.Limit{MaxInFlight: 4, Rate: 1}}}); err != nil {
		log.Fatal(err)
	}
	tenants, err := readTenantLimits(q.Settings(ctx))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("acme: %+v\n", tenants["acme"])
	// Output:
	// acme: {MaxInFlight:4 Rate:1}
}
