package attempt

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/crdbwork/crdbwork/internal/retry"
)

// Transient reports whether err is a failure of the database or of the way
// to it — one that says nothing about the item or its result, so the same
// statement may well succeed when tried again: a lost or refused connection,
// a timeout, a server shutting down or out of resources, serialization
// failures that outlasted their retries. A statement error about the data
// (a constraint, a type, a syntax error) is not transient, nor is an error
// that is not the database's at all.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if retry.Retryable(err) || errors.Is(err, retry.ErrCommitUnknown) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "53"),  // insufficient resources
			strings.HasPrefix(pgErr.Code, "57P"), // operator intervention: shutdown, crash, cannot connect now
			pgErr.Code == "57014",                // query canceled (a statement timeout)
			pgErr.Code == "40003",                // CockroachDB: statement completion unknown
			pgErr.Code == "XXUUU":                // CockroachDB: unexpected internal error, often a node restart
			return true
		}
		return false
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.As(err, &netErr), errors.As(err, &connectErr),
		pgconn.Timeout(err), pgconn.SafeToRetry(err):
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "closed pool") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe")
}
