package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestExplainReapStatements: with 20,000 sessions (a tenth expired),
// ReapSession finds its row by the primary key, ExpiredSessions returns
// exactly the expired ones, and IdleInTransactionTimeout reads a setting
// the server knows.
func TestExplainReapStatements(t *testing.T) {
	t.Parallel()
	pool := newSchemaDB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_sessions (expiry, heartbeat_at)
		SELECT INTERVAL '5 seconds', CASE WHEN g % 10 = 0 THEN now() - INTERVAL '1 hour' ELSE now() + INTERVAL '1 hour' END
		FROM generate_series(1, 20000) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE crdbwork_sessions`); err != nil {
		t.Fatal(err)
	}
	rs := store.NewReapStatements(crsql.Tables{})
	var plan strings.Builder
	rows, err := pool.Query(ctx, "EXPLAIN "+rs.ReapSession, uuid.New())
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The queues whose change counters the deletion raises are read only
	// when the session is expired (a one-time filter), so only the
	// sessions must be read by key.
	if p := plan.String(); !strings.Contains(p, "crdbwork_sessions_pkey") || strings.Contains(p, "Seq Scan on crdbwork_sessions") {
		t.Errorf("ReapSession does not find its row by primary key:\n%s", p)
	}
	var expired int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+rs.ExpiredSessions+`) AS e`).Scan(&expired); err != nil {
		t.Fatal(err)
	}
	if expired != 2000 {
		t.Errorf("ExpiredSessions returned %d sessions, want 2000", expired)
	}
	var v string
	if err := pool.QueryRow(ctx, store.IdleInTransactionTimeout).Scan(&v); err != nil || v == "" {
		t.Errorf("IdleInTransactionTimeout: %q, %v", v, err)
	}
}
