package claim

import (
	"testing"

	"github.com/crdbwork/crdbwork/internal/store"
)

// The bounds and the reason claim documents are the ones the store checks
// and writes: claim states them as values (its documentation shows them),
// the store is where they are enforced.
func TestBoundsAreTheStores(t *testing.T) {
	t.Parallel()
	if MaxKeyLength != store.MaxKeyLength || MaxQueueNameLength != store.MaxQueueNameLength {
		t.Errorf("claim's bounds (key %d, queue name %d) differ from the store's (%d, %d)", MaxKeyLength, MaxQueueNameLength, store.MaxKeyLength, store.MaxQueueNameLength)
	}
	if ReasonRefused != store.ReasonRefused {
		t.Errorf("ReasonRefused = %q, the store writes %q", ReasonRefused, store.ReasonRefused)
	}
}
