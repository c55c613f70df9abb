package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ExitError is an error with an exit status and a one-line message.
type ExitError struct {
	// Code is the exit status.
	Code int
	// Msg is the message.
	Msg string
	// Hint is printed after the message, like "run `demo run -h` for help".
	Hint string
	// Raw prints Msg as is (it may span lines on purpose).
	Raw bool
	// Err is the error the message was made from, if any (Unwrap): Report
	// looks into it for a refusal for lack of a privilege.
	Err error
}

func (e *ExitError) Error() string { return e.Msg }

// Unwrap returns the error the message was made from (nil: none).
func (e *ExitError) Unwrap() error { return e.Err }

// Failf returns an ExitError with the status code and a formatted message;
// the first error among args is kept as its Err.
func Failf(code int, format string, args ...any) error {
	e := &ExitError{Code: code, Msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			e.Err = err
			break
		}
	}
	return e
}

// PermissionDenied is the SQLSTATE of a statement refused because the
// user lacks a privilege (insufficient_privilege).
const PermissionDenied = "42501"

// Permission returns the refusal for lack of a privilege in err's chain
// (SQLSTATE 42501), if there is one.
func Permission(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == PermissionDenied {
		return pgErr, true
	}
	return nil, false
}

// ExitCode is a result that is not an error: the command already printed
// what it had to say (for example a summary showing lost items).
type ExitCode int

func (c ExitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// Report prints err on one line, after the program's name, and returns the
// exit status: 0 for nil and ErrHelp, the ExitCode or ExitError's code, 1
// for any other error.
func (p Program) Report(out *Console, err error) int {
	if err == nil || errors.Is(err, ErrHelp) {
		return 0
	}
	var code ExitCode
	if errors.As(err, &code) {
		return int(code)
	}
	if pgErr, ok := Permission(err); ok {
		// A refused user is exit 2, in one line naming the table and
		// the privileges (the help's promise).
		msg := ""
		if p.ExplainPermission != nil {
			msg = p.ExplainPermission(pgErr)
		}
		if msg == "" {
			msg = fmt.Sprintf("permission denied: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
		}
		out.ErrorLine(p.Name + ": " + OneLine(msg))
		return 2
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		ee = &ExitError{Code: 1, Msg: err.Error()}
	}
	msg := ee.Msg
	if !ee.Raw {
		msg = OneLine(msg)
	}
	if ee.Hint != "" {
		msg += "; " + ee.Hint
	}
	out.ErrorLine(p.Name + ": " + msg)
	return ee.Code
}

// OneLine folds a multi-line message onto one line, dropping repeated
// lines (pgx repeats one error per connection attempt).
func OneLine(s string) string {
	var out []string
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || seen[l] {
			continue
		}
		seen[l] = true
		out = append(out, l)
	}
	return strings.Join(out, " ")
}

// PrintJSON writes v as one JSON object on one line of stdout.
func PrintJSON(out *Console, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return Failf(1, "encoding JSON: %v", err)
	}
	out.WriteStdout(append(b, '\n'))
	return nil
}
