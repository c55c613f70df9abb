package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A refusal for lack of a privilege is exit 2 in one line, found through
// Failf's message (which keeps the error it was made from) and any
// wrapping; other errors keep their codes.
func TestReportMapsPermissionRefusals(t *testing.T) {
	denied := &pgconn.PgError{Code: PermissionDenied, Message: "permission denied for table crdbwork_queues"}
	wrapped := Failf(1, "updating the queue: %v", fmt.Errorf("claim: pausing %q: %w", "emails", denied))
	for _, c := range []struct {
		name    string
		explain func(*pgconn.PgError) string
		err     error
		code    int
		line    string
	}{
		{"explained", func(e *pgconn.PgError) string { return "denied: " + e.Message + "\nsecond line" }, wrapped, 2,
			"x: denied: permission denied for table crdbwork_queues second line\n"},
		{"the server's message", nil, wrapped, 2, "x: permission denied: permission denied for table crdbwork_queues (SQLSTATE 42501)\n"},
		{"not a refusal", nil, Failf(1, "boom: %v", &pgconn.PgError{Severity: "ERROR", Code: "23505", Message: "dup"}), 1, "x: boom: ERROR: dup (SQLSTATE 23505)\n"},
		{"plain", nil, errors.New("plain"), 1, "x: plain\n"},
	} {
		var stdout, stderr bytes.Buffer
		p := Program{Name: "x", ExplainPermission: c.explain}
		if code := p.Report(NewConsole(&stdout, &stderr), c.err); code != c.code || stderr.String() != c.line {
			t.Errorf("%s: exit %d, %q; want %d, %q", c.name, code, stderr.String(), c.code, c.line)
		}
	}
	if e := Failf(2, "no error here: %d", 3).(*ExitError); e.Err != nil || !strings.Contains(e.Msg, "3") {
		t.Errorf("Failf without an error argument: %+v", e)
	}
}
