package partition

import (
	"context"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/session"
)

// Session is what a Rebalancer needs of the session it runs beside: its id,
// its lifetime and its membership of the queue. *session.Session implements
// it; tests can give the rebalancer a fake that never loses itself and runs
// no heartbeat loop (as CockroachDB's sqlliveness.Session lets its
// consumers take an always-alive session).
//
// The rebalancer still needs the database (New's DB) for the queue's parts,
// members and owners: the session's id must be the id of a row of the
// sessions table (Tables.Sessions) that the database counts live, since
// the parts and membership rows reference that row by foreign key and only
// live sessions share the parts.
type Session interface {
	// ID returns the session's id: its row's id in the sessions table.
	ID() uuid.UUID
	// Context returns a context cancelled when the session ends (is lost
	// or closed). Run returns once it is done.
	Context() context.Context
	// Err returns nil while the session is live and an error once it has
	// ended. Run returns that error, except one wrapping session.ErrClosed
	// (a graceful end), for which it returns nil.
	Err() error
	// Join makes the session a member of queue (a row of the session
	// queues table), idempotently: only a queue's members share its parts.
	// It should fail with an error wrapping session.ErrLost when the
	// session's row is gone.
	Join(ctx context.Context, queue string) error
}

// *session.Session is the Session of production.
var _ Session = (*session.Session)(nil)
