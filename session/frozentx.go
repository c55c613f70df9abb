package session

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// IdleInTransactionParam is the server setting ConfigurePool sets:
// idle_in_transaction_session_timeout, on PostgreSQL (9.6 and later) and
// CockroachDB alike.
const IdleInTransactionParam = "idle_in_transaction_session_timeout"

// MinReapTimeout is the least ReapTimeout a session gets by default.
const MinReapTimeout = 250 * time.Millisecond

// ErrReapTimeout is wrapped by the error of a ReapWithin that did not
// finish within its bound. Deleting the expired sessions normally takes
// milliseconds; a deletion that waits is, most likely, waiting on the row
// locks of a transaction that an expired session's process left open — a
// process frozen (SIGSTOP, a paused VM, a half-open connection) between
// the statements of a transaction, whose connection the server keeps open
// (see ConfigurePool). The reaper gives up and tries again at its next
// turn, so it never sits on a pool connection for as long as the freeze
// lasts.
var ErrReapTimeout = errors.New("deleting the expired sessions did not finish in time")

// ConfigurePool prepares a pool configuration for crdbwork sessions whose
// Options are opts: every connection of the pool starts with the server
// setting idle_in_transaction_session_timeout set to the session expiry
// (a startup parameter, sent with the connection's handshake: it costs no
// round trip, on any transaction). Call it before pgxpool.NewWithConfig.
// A timeout the configuration already sets (in the URL, say
// "options=-c idle_in_transaction_session_timeout=2s", or in
// ConnConfig.RuntimeParams) is kept if it is not 0 and not longer than the
// expiry.
//
// Why: a worker process frozen while one of its transactions is open — an
// ack that has deleted its items but not yet committed, when the process
// is stopped (SIGSTOP), its VM paused, or its network cut without a reset
// — leaves the transaction open on the server, holding its row locks, for
// as long as the server keeps the connection: with TCP keepalive, often
// two hours. Deleting the frozen process's expired session touches the
// rows it locked (its claims and parts hang off the session row), so every
// peer's reaper of expired sessions waits on those locks, and no expired
// session of the database is reaped meanwhile: the frozen session's items
// and parts do not move. With the timeout, the server ends such a
// transaction (and its connection) once it has waited on its client for
// the expiry; the peers then reap the session and its items end within
// their bound: the expiry, plus the expiry of idle time, plus a reap
// interval. No crdbwork transaction waits on its client that long, but a
// claim.Record (or BatchRecord) that keeps an ack transaction idle longer
// than the expiry between its statements has it ended too.
//
// PostgreSQL has the setting since 9.6 and takes it as a startup
// parameter. CockroachDB has it since v20.2 (cockroach#52938, "sql:
// implement idle_in_transaction_session_timeout": sessions idle in an
// open or aborted transaction past the threshold are terminated; its docs
// recommend it, rather than transaction_timeout, against a transaction
// that holds locks and never ends: docs#19330), and takes any settable
// session variable as a startup parameter since v2.1 (cockroach#31021:
// "provide initial/default values for any customizable session variable
// in the client connection URL"); not run against a CockroachDB server
// here. Package worker checks the setting once per Run and logs a warning
// when it is missing or longer than the expiry.
func ConfigurePool(cfg *pgxpool.Config, opts Options) error {
	if cfg == nil || cfg.ConnConfig == nil {
		return errors.New("session: ConfigurePool: nil pool configuration (make one with pgxpool.ParseConfig)")
	}
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	params := cfg.ConnConfig.RuntimeParams
	if params == nil {
		params = map[string]string{}
		cfg.ConnConfig.RuntimeParams = params
	}
	if cur, ok := params[IdleInTransactionParam]; ok {
		if d, err := ParseSetting(cur); err == nil && d > 0 && d <= o.Expiry {
			return nil
		}
	}
	params[IdleInTransactionParam] = strconv.FormatInt(max(1, o.Expiry.Milliseconds()), 10)
	return nil
}

// settingUnits are the time units of PostgreSQL settings (and CockroachDB
// intervals), longest suffix first where one ends another.
var settingUnits = []struct {
	suffix string
	unit   time.Duration
}{{"min", time.Minute}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"µs", time.Microsecond},
	{"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}

// ParseSetting reads a time setting as the server shows it: a number of
// milliseconds ("1500"), a number with a unit ("1500ms", "5s", "2min",
// "1h", "1d"), or an interval ("00:00:05", "00:00:01.5"). "0" is 0: no
// timeout.
func ParseSetting(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if strings.Count(s, ":") == 2 {
		parts := strings.SplitN(s, ":", 3)
		h, err1 := strconv.ParseInt(parts[0], 10, 64)
		m, err2 := strconv.ParseInt(parts[1], 10, 64)
		sec, err3 := strconv.ParseFloat(parts[2], 64)
		if err1 != nil || err2 != nil || err3 != nil || h < 0 || m < 0 || sec < 0 {
			return 0, fmt.Errorf("session: unreadable time setting %q", s)
		}
		return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec*float64(time.Second)), nil
	}
	unit := time.Millisecond
	num := s
	for _, u := range settingUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, unit = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.unit
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("session: unreadable time setting %q", s)
	}
	return time.Duration(v * float64(unit)), nil
}

// ReapWithin is Reap bounded by d: when deleting every expired session at
// once has not finished within d (it waits on the locks of a transaction
// left open by a frozen process, most likely), it deletes the expired
// sessions one at a time instead, each bounded by d, in random order, for
// at most 2·d in all: the sessions whose rows are not locked are deleted,
// those that stay are tried again at the next reap. It does the same when
// the database refuses the delete for something about a row it changes
// (a refusal: a claim whose release would write an item past the
// schema's bounds, say): one session's row never keeps the others of the
// database, whatever their queues, from being reaped; the refused ones are
// named in the error. It returns how many it
// deleted and, when some expired session could not be deleted in time, an
// error wrapping ErrReapTimeout that names them and the likely cause. The
// connection of an abandoned statement is closed (pgx cancels the
// statement), which ends its wait on the server too. d <= 0: Reap, with no
// bound but ctx's.
func ReapWithin(ctx context.Context, db crsql.DB, t crsql.Tables, d time.Duration) (int64, error) {
	if d <= 0 {
		return Reap(ctx, db, t)
	}
	st := store.New(t)
	n, err := execWithin(ctx, d, func(ctx context.Context) (int64, error) { return st.SessionsReap(ctx, db) })
	switch {
	case err == nil:
		return n, nil
	case store.IsRefusal(err):
		// The delete of one expired session is refused for something
		// about a row it changes (the release of one of its claims would
		// write an item past the schema's bounds; a constraint; a
		// trigger): one at a time too, so that the others go.
	case ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded):
		return 0, fmt.Errorf("session: reaping expired sessions: %w", store.Classify(err))
	}
	// One at a time: the expired sessions whose rows are not locked go.
	lctx, cancel := context.WithTimeout(ctx, d)
	ids, lerr := st.SessionsExpiredIDs(lctx, db)
	cancel()
	if lerr != nil {
		return 0, reapTimeoutError(d, nil, fmt.Errorf("%w (then listing the expired sessions: %w)", err, lerr))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	var deleted int64
	var blocked, refused []uuid.UUID
	var last, lastRefusal error
	until := time.Now().Add(2 * d)
	for i, id := range ids {
		if ctx.Err() != nil {
			return deleted, fmt.Errorf("session: reaping expired sessions: %w", ctx.Err())
		}
		if time.Now().After(until) {
			blocked = append(blocked, ids[i:]...)
			break
		}
		k, err := execWithin(ctx, d, func(ctx context.Context) (int64, error) {
			reaped, err := st.SessionsReapOne(ctx, db, id)
			if reaped {
				return 1, err
			}
			return 0, err
		})
		switch {
		case store.IsRefusal(err):
			refused, lastRefusal = append(refused, id), err
			continue
		case err != nil:
			blocked, last = append(blocked, id), err
			continue
		}
		deleted += k
	}
	if len(refused) > 0 {
		err := fmt.Errorf("session: reaping expired sessions: the database refused to delete %d expired session(s) %v for something about a row "+
			"their delete changes (the release of a claim that would write an item past the schema's bounds, a constraint, a trigger); "+
			"they stay until that row is gone (a queue's reaper ends such an item, dead as refused, once its lease runs out), and every other "+
			"expired session was deleted: %w", len(refused), refused, lastRefusal)
		if len(blocked) > 0 {
			err = errors.Join(err, reapTimeoutError(d, blocked, last))
		}
		return deleted, err
	}
	if len(blocked) == 0 {
		return deleted, nil
	}
	if last == nil {
		last = err
	}
	return deleted, reapTimeoutError(d, blocked, last)
}

// execWithin runs exec (a statement that returns how many rows it
// deleted), retried on transient errors, for at most d.
func execWithin(ctx context.Context, d time.Duration, exec func(ctx context.Context) (int64, error)) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var n int64
	err := retry.Do(rctx, nil, func(ctx context.Context) error {
		var err error
		n, err = exec(ctx)
		return err
	})
	if err != nil && rctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return n, err
}

// reapTimeoutError is the error of a reap that left expired sessions
// (blocked, if known) because it could not delete them within d.
func reapTimeoutError(d time.Duration, blocked []uuid.UUID, last error) error {
	which := "expired sessions"
	if len(blocked) > 0 {
		which = fmt.Sprintf("%d expired session(s) %v", len(blocked), blocked)
	}
	return fmt.Errorf("session: reaping expired sessions: %w within %v: %s left; most likely a transaction of such a session's process, "+
		"frozen while it was open, holds locks on that session's rows; give the workers' connections an %s no longer than the session expiry "+
		"(session.ConfigurePool, worker.ConfigurePool) so that the server ends it (last error: %v)",
		ErrReapTimeout, d, which, IdleInTransactionParam, last)
}
