package sql

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// The fleet's bounded reads (internal/fleet: crdbwork status, the
// dashboard and the metrics collector render one read model of the
// fleet). Each statement's text stands beside the method that runs it.

// fleetLiveSessions: $1 limit → the first limit live sessions by id, as
// coreStatements.LiveSessions reads them, each row with the number of live
// sessions (a window count over the live rows, taken before the limit).
// Both engines accept count(*) OVER (); the sessions table holds one row
// per worker process.
const fleetLiveSessions = `SELECT id, name, host, pid, created_at, heartbeat_at,
       (EXTRACT(EPOCH FROM expiry) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - created_at) * 1000000)::BIGINT,
       (EXTRACT(EPOCH FROM now() - heartbeat_at) * 1000000)::BIGINT,
       claimed, acked, failed, in_flight, count(*) OVER ()
FROM crdbwork_sessions WHERE heartbeat_at + expiry >= now() ORDER BY id LIMIT $1`

// FleetLiveSessions returns the first limit live sessions (heartbeat
// within their expiry, by the database clock), ordered by id, and the
// number of live sessions, all of them counted (fleetLiveSessions).
func (s *Store) FleetLiveSessions(ctx context.Context, db DB, limit int) ([]SessionRow, int64, error) {
	rows, err := db.Query(ctx, s.t.rewrite(fleetLiveSessions), limit)
	if err != nil {
		return nil, 0, err
	}
	var live int64
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SessionRow, error) {
		var r SessionRow
		var exp, age, since int64
		err := row.Scan(&r.ID, &r.Name, &r.Host, &r.PID, &r.CreatedAt, &r.HeartbeatAt, &exp, &age, &since,
			&r.Reported.Claimed, &r.Reported.Acked, &r.Reported.Failed, &r.Reported.InFlight, &live)
		r.Expiry, r.Age, r.SinceHeartbeat = time.Duration(exp)*time.Microsecond, time.Duration(age)*time.Microsecond, time.Duration(since)*time.Microsecond
		return r, err
	})
	if err != nil {
		return nil, 0, err
	}
	return out, live, nil
}
