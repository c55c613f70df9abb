package denied

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The refusals of both engines, as their messages say them (PostgreSQL 15
// and CockroachDB), wrapped or not; other errors are not refusals.
func TestOf(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want Refusal
	}{
		{"permission denied for table crdbwork_reaps", Refusal{Kind: "table", Name: "crdbwork_reaps"}},
		{"permission denied for relation crdbwork_items", Refusal{Kind: "table", Name: "crdbwork_items"}},
		{"permission denied for schema work", Refusal{Kind: "schema", Name: "work"}},
		{"must be owner of table crdbwork_items", Refusal{Kind: "table", Name: "crdbwork_items", Owner: true}},
		{"user w does not have INSERT privilege on relation crdbwork_reaps", Refusal{Kind: "relation", Name: "crdbwork_reaps", User: "w", Privilege: "INSERT"}},
		{"something else entirely", Refusal{}},
	} {
		pgErr := &pgconn.PgError{Code: Code, Message: c.msg}
		got, ok := Of(fmt.Errorf("claiming: %w", pgErr))
		c.want.Err = pgErr
		if !ok || got != c.want {
			t.Errorf("Of(%q) = %+v, %v; want %+v", c.msg, got, ok, c.want)
		}
	}
	for _, err := range []error{nil, errors.New("permission denied for table x"), &pgconn.PgError{Code: "42P01", Message: "permission denied for table x"}} {
		if r, ok := Of(err); ok {
			t.Errorf("Of(%v) = %+v, true; want false", err, r)
		}
	}
}
