package claim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
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

// A name the schema cannot store is refused with an error that
// applications can test for with the public sentinel, sql.ErrBadName.
func TestBadNameIsThePublicSentinel(t *testing.T) {
	t.Parallel()
	// New does no I/O: a pool that never connects is enough.
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, name := range []string{strings.Repeat("q", MaxQueueNameLength+1), "nul\x00", "\xff"} {
		_, err := New(pool, Options{Queue: name})
		if !errors.Is(err, crsql.ErrBadName) {
			t.Errorf("New with queue name %.20q: %v, want an error wrapping sql.ErrBadName", name, err)
		}
	}
}
