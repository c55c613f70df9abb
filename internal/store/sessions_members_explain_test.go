package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestStatementPlansMembers seeds 50,000 sessions (a seventh of them expired)
// working 500 queues (each session joined one queue; each queue's 16 parts
// owned by some of its members), ANALYZEs, and EXPLAINs the membership
// statements. QueueMembers must find a queue's members by index (the
// membership table's primary key, the parts table's unique (queue, part)
// index, the sessions table's primary key), never by reading a whole
// table: its cost follows the queue's members, not the database's
// sessions. On PostgreSQL it checks both the custom and the generic plan.
// It also checks what QueueMembers returns: the live sessions that joined
// the queue or own one of its parts, in id order.
func TestStatementPlansMembers(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	seed := []string{
		// Sessions s1..s50000: every seventh expired.
		`INSERT INTO crdbwork_sessions (id, expiry, heartbeat_at, name)
		 SELECT gen_random_uuid(), INTERVAL '1 hour',
		        CASE WHEN g % 7 = 0 THEN now() - INTERVAL '2 hours' ELSE now() END, 's' || g::TEXT
		 FROM generate_series(1, 50000) AS g`,
		// Session sN works queue q(N % 500); every eleventh has not joined
		// it and only owns parts, as a version-3 session would.
		`INSERT INTO crdbwork_session_queues (queue, session_id)
		 SELECT 'q' || (substr(name, 2)::INT % 500)::TEXT, id FROM crdbwork_sessions WHERE substr(name, 2)::INT % 11 <> 0`,
		// Part p (0..15) of queue qQ is owned by session s(500·(p+1) + Q),
		// one of the queue's sessions.
		`INSERT INTO crdbwork_session_parts (session_id, queue, part)
		 SELECT s.id, 'q' || q::TEXT, p
		 FROM generate_series(0, 499) AS q CROSS JOIN generate_series(0, 15) AS p
		 JOIN crdbwork_sessions AS s ON s.name = 's' || (500 * (p + 1) + q)::TEXT`,
		`ANALYZE crdbwork_sessions`,
		`ANALYZE crdbwork_session_queues`,
		`ANALYZE crdbwork_session_parts`,
	}
	for _, s := range seed {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	ms := store.NewMemberStatements(crsql.Tables{})

	// What QueueMembers returns, against a plain reading of its definition.
	for _, q := range []string{"q0", "q7", "q11", "nobody"} {
		rows, err := pool.Query(ctx, ms.QueueMembers, q)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		rows, err = pool.Query(ctx, `SELECT id FROM crdbwork_sessions AS s
			WHERE heartbeat_at + expiry >= now()
			  AND (id IN (SELECT session_id FROM crdbwork_session_queues WHERE queue = $1)
			       OR id IN (SELECT session_id FROM crdbwork_session_parts WHERE queue = $1))
			ORDER BY id`, q)
		if err != nil {
			t.Fatal(err)
		}
		want, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("QueueMembers(%s): %d members, want %d (live, joined or owning a part, in id order)", q, len(got), len(want))
		}
		if q != "nobody" && len(got) < 50 {
			t.Errorf("QueueMembers(%s): %d members; the seed gives each queue about 85", q, len(got))
		}
	}

	someone := uuid.New()
	cases := []struct {
		name    string
		stmt    string
		args    []any
		indexed bool // must read no table whole
	}{
		{"QueueMembers", ms.QueueMembers, []any{"q7"}, true},
		{"JoinedMembers", ms.JoinedMembers, []any{"q7"}, true},
		// It reads the sessions table whole by design (see its doc).
		{"LimitSharers", ms.LimitSharers, []any{"q7"}, false},
		{"JoinQueue", ms.JoinQueue, []any{"q7", someone}, true},
		{"LeaveQueue", ms.LeaveQueue, []any{"q7", someone}, true},
		// For operators: they read the whole (small) tables by design.
		{"Memberships", ms.Memberships, nil, false},
		{"AllPartOwners", ms.AllPartOwners, nil, false},
	}
	pcs := make([]planCase, len(cases))
	for i, c := range cases {
		pcs[i] = planCase{c.name, c.stmt, c.args}
	}
	explainEach(t, pool, "members_", pcs, nil, func(i int, mode, text string) {
		c := cases[i]
		whole := strings.Contains(text, "Seq Scan") || strings.Contains(text, "FULL SCAN") || strings.Contains(text, "full scan")
		switch {
		case c.indexed && whole:
			t.Errorf("%s (%s) reads a whole table:\n%s", c.name, mode, text)
		case c.name == "QueueMembers" && testdb.Kind(t) == "postgres" &&
			(!strings.Contains(text, "crdbwork_session_queues_pkey") || !strings.Contains(text, "crdbwork_session_parts_one_owner") ||
				!strings.Contains(text, "crdbwork_sessions_pkey")):
			t.Errorf("%s (%s) does not use the membership, part-owner and session keys:\n%s", c.name, mode, text)
		default:
			t.Logf("%s (%s):\n%s", c.name, mode, text)
		}
	})
}
