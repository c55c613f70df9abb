package claim_test

import (
	"context"
	"math"
	"reflect"
	"testing"

	"github.com/crdbwork/crdbwork/claim"
)

// TestTenantLimitsStored sets, replaces, reads and removes tenants' own
// limits, per queue, and refuses limits that cannot be stored without
// writing anything.
func TestTenantLimitsStored(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	q := newQueue(t, pool, claim.Options{Queue: "q"})
	other := newQueue(t, pool, claim.Options{Queue: "other"})
	for tenant, l := range map[string]claim.Limit{"a": {MaxInFlight: 3}, "b": {Rate: 2.5}, "free": {}} {
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{tenant: &l}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"a": &claim.Limit{MaxInFlight: 4, Rate: 1}}}); err != nil {
		t.Fatal(err)
	}
	if err := other.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"a": &claim.Limit{MaxInFlight: 9}}}); err != nil {
		t.Fatal(err)
	}
	got, err := readTenantLimits(q.Settings(ctx))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]claim.Limit{"a": {MaxInFlight: 4, Rate: 1}, "b": {Rate: 2.5}, "free": {}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("TenantLimits = %v, want %v", got, want)
	}
	// A nil Limit removes the tenant's own limit; removing it again
	// (nothing to remove) is no error.
	for range 2 {
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{"b": nil}}); err != nil {
			t.Fatalf("removing b's limit: %v", err)
		}
		if got, err := readTenantLimits(q.Settings(ctx)); err != nil || len(got) != 2 {
			t.Fatalf("TenantLimits after removing b = %v, %v; want a and free", got, err)
		}
	}
	for _, bad := range []struct {
		tenant string
		l      claim.Limit
	}{{"", claim.Limit{MaxInFlight: 1}}, {"x", claim.Limit{MaxInFlight: -1}}, {"x", claim.Limit{Rate: math.NaN()}},
		{"x", claim.Limit{Rate: math.Inf(1)}}, {"x", claim.Limit{Rate: -0.5}}, {"x", claim.Limit{MaxInFlight: 1 << 41}}} {
		if err := q.UpdateSettings(ctx, claim.SettingsUpdate{TenantLimits: map[string]*claim.Limit{bad.tenant: &bad.l}}); err == nil {
			t.Errorf("SetTenantLimit(%q, %+v) = nil, want an error", bad.tenant, bad.l)
		}
	}
	got, err = readTenantLimits(q.Settings(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if want := (map[string]claim.Limit{"a": {MaxInFlight: 4, Rate: 1}, "free": {}}); !reflect.DeepEqual(got, want) {
		t.Fatalf("TenantLimits after removal and bad input = %v, want %v", got, want)
	}
	if o, err := readTenantLimits(other.Settings(ctx)); err != nil || !reflect.DeepEqual(o, map[string]claim.Limit{"a": {MaxInFlight: 9}}) {
		t.Fatalf("the other queue's limits = %v, %v", o, err)
	}
}
