package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// applied returns a fresh database with the crdbwork schema and its Store.
func applied(t *testing.T) (*pgxpool.Pool, *store.Store) {
	t.Helper()
	pool := newSchemaDB(t)
	return pool, store.New(crsql.Tables{})
}

// expire moves session id's heartbeat an hour back: it is expired.
func expire(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE crdbwork_sessions SET heartbeat_at = now() - INTERVAL '1 hour' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// TestStoreSessions runs the session and membership methods of Store and
// checks what each returns against the rows the others wrote.
func TestStoreSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, stmts := applied(t)
	if store.New(crsql.Tables{}) != stmts {
		t.Fatal("NewStore rendered the same tables twice")
	}
	id, err := stmts.SessionsCreate(ctx, pool, time.Hour, "host-1", 42, "w-1")
	if err != nil {
		t.Fatal(err)
	}
	if alive, _, err := stmts.SessionsHeartbeat(ctx, pool, id); err != nil || !alive {
		t.Fatalf("Heartbeat: %v, %v; want true", alive, err)
	}
	counters := store.SessionCounters{Claimed: 5, Acked: 3, Failed: 1, InFlight: 1}
	if alive, _, err := stmts.SessionsHeartbeatReport(ctx, pool, id, counters); err != nil || !alive {
		t.Fatalf("HeartbeatReport: %v, %v; want true", alive, err)
	}
	live, err := stmts.SessionsLive(ctx, pool)
	if err != nil || len(live) != 1 {
		t.Fatalf("LiveSessions: %v, %v; want one session", live, err)
	}
	if s := live[0]; s.ID != id || s.Name != "w-1" || s.Host != "host-1" || s.PID != 42 || s.Expiry != time.Hour ||
		s.Reported != counters || s.SinceHeartbeat < 0 || s.SinceHeartbeat > time.Minute || s.Age < 0 || s.HeartbeatAt.Before(s.CreatedAt) {
		t.Errorf("LiveSessions: %+v", s)
	}

	// Membership.
	if joined, err := stmts.SessionsJoinQueue(ctx, pool, "q", id); err != nil || !joined {
		t.Fatalf("JoinQueue: %v, %v; want true", joined, err)
	}
	if joined, err := stmts.SessionsJoinQueue(ctx, pool, "q", id); err != nil || joined {
		t.Fatalf("JoinQueue again: %v, %v; want false", joined, err)
	}
	other, err := stmts.SessionsCreate(ctx, pool, time.Hour, "host-2", 43, "w-2")
	if err != nil {
		t.Fatal(err)
	}
	want := []uuid.UUID{id}
	for name, read := range map[string]func(context.Context, crsql.DB, string) ([]uuid.UUID, error){
		"QueueMembers": stmts.SessionsQueueMembers, "JoinedMembers": stmts.SessionsJoined,
	} {
		if got, err := read(ctx, pool, "q"); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", name, got, err, want)
		}
	}
	// other joined no queue: it shares the limits (code older than
	// membership); the sessions of another queue would not.
	sharers, err := stmts.SessionsLimitSharers(ctx, pool, "q")
	if want := sorted(id, other); err != nil || !slices.Equal(sharers, want) {
		t.Errorf("LimitSharers: %v, %v; want %v", sharers, err, want)
	}
	ms, err := stmts.SessionsMemberships(ctx, pool)
	if err != nil || len(ms) != 1 || ms[0].Queue != "q" || ms[0].Session != id || ms[0].JoinedAt.IsZero() {
		t.Errorf("Memberships: %+v, %v", ms, err)
	}

	// Parts.
	if ok, err := stmts.PartsAcquire(ctx, pool, id, "q", 3); err != nil || !ok {
		t.Fatalf("AcquirePart: %v, %v; want true", ok, err)
	}
	if ok, err := stmts.PartsAcquire(ctx, pool, other, "q", 3); err != nil || ok {
		t.Fatalf("AcquirePart of an owned part: %v, %v; want false", ok, err)
	}
	if ok, err := stmts.PartsAcquire(ctx, pool, other, "q", 1); err != nil || !ok {
		t.Fatalf("AcquirePart: %v, %v; want true", ok, err)
	}
	owners, err := stmts.PartsOwners(ctx, pool, "q")
	if err != nil || len(owners) != 2 || owners[3] != id || owners[1] != other {
		t.Errorf("PartOwners: %v, %v; want part 3 %v, part 1 %v", owners, err, id, other)
	}
	// A session that owns a part counts as a member, not as a joined one.
	if got, err := stmts.SessionsQueueMembers(ctx, pool, "q"); err != nil || !slices.Equal(got, sorted(id, other)) {
		t.Errorf("QueueMembers with a part owner: %v, %v", got, err)
	}
	if got, err := stmts.SessionsJoined(ctx, pool, "q"); err != nil || !slices.Equal(got, []uuid.UUID{id}) {
		t.Errorf("JoinedMembers with a part owner: %v, %v", got, err)
	}
	if parts, err := stmts.PartsOwned(ctx, pool, other, "q"); err != nil || !slices.Equal(parts, []int{1}) {
		t.Errorf("OwnedParts: %v, %v; want [1]", parts, err)
	}
	all, err := stmts.PartsOwnersAll(ctx, pool)
	if want := []store.PartOwnerRow{{Queue: "q", Part: 1, Session: other}, {Queue: "q", Part: 3, Session: id}}; err != nil || !slices.Equal(all, want) {
		t.Errorf("AllPartOwners: %+v, %v; want %+v", all, err, want)
	}
	if err := stmts.PartsRelease(ctx, pool, other, "q", 1); err != nil {
		t.Fatal(err)
	}
	if err := stmts.SessionsLeaveQueue(ctx, pool, "q", id); err != nil {
		t.Fatal(err)
	}
	if got, err := stmts.SessionsJoined(ctx, pool, "q"); err != nil || len(got) != 0 {
		t.Errorf("JoinedMembers after LeaveQueue: %v, %v; want none", got, err)
	}
	if owners, err := stmts.PartsOwners(ctx, pool, "q"); err != nil || len(owners) != 1 || owners[3] != id {
		t.Errorf("PartOwners after ReleasePart: %v, %v; want part 3 only", owners, err)
	}

	// Expiry and reaping.
	expire(t, pool, other)
	if ids, err := stmts.SessionsLiveIDs(ctx, pool); err != nil || !slices.Equal(ids, []uuid.UUID{id}) {
		t.Errorf("LiveSessionIDs: %v, %v; want [%v]", ids, err, id)
	}
	if ids, err := stmts.SessionsExpiredIDs(ctx, pool); err != nil || !slices.Equal(ids, []uuid.UUID{other}) {
		t.Errorf("ExpiredSessionIDs: %v, %v; want [%v]", ids, err, other)
	}
	if reaped, err := stmts.SessionsReapOne(ctx, pool, id); err != nil || reaped {
		t.Errorf("ReapSession of a live session: %v, %v; want false", reaped, err)
	}
	if reaped, err := stmts.SessionsReapOne(ctx, pool, other); err != nil || !reaped {
		t.Errorf("ReapSession: %v, %v; want true", reaped, err)
	}
	if alive, _, err := stmts.SessionsHeartbeat(ctx, pool, other); err != nil || alive {
		t.Errorf("Heartbeat of a reaped session: %v, %v; want false", alive, err)
	}
	var pgErr *pgconn.PgError
	if _, err := stmts.SessionsJoinQueue(ctx, pool, "q", other); !errors.As(err, &pgErr) || pgErr.Code != "23503" {
		t.Errorf("JoinQueue of a reaped session: %v; want a foreign-key violation", err)
	}
	third, err := stmts.SessionsCreate(ctx, pool, time.Second, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	expire(t, pool, third)
	if n, err := stmts.SessionsReap(ctx, pool); err != nil || n != 1 {
		t.Errorf("ReapSessions: %d, %v; want 1", n, err)
	}
	if err := stmts.SessionsDelete(ctx, pool, id); err != nil {
		t.Fatal(err)
	}
	if live, err := stmts.SessionsLive(ctx, pool); err != nil || len(live) != 0 {
		t.Errorf("LiveSessions after DeleteSession: %v, %v; want none", live, err)
	}
	// The session's part went with it.
	if all, err := stmts.PartsOwnersAll(ctx, pool); err != nil || len(all) != 0 {
		t.Errorf("AllPartOwners after DeleteSession: %v, %v; want none", all, err)
	}
}

// sorted returns ids in the order the statements return them (UUIDs
// compare as bytes on both engines).
func sorted(ids ...uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int {
		return slices.Compare(a[:], b[:])
	})
	return out
}

// TestStoreParts: the part count methods, and MovePartItems walking the
// items table page by page, moving only the queue's items of removed parts.
func TestStoreParts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, stmts := applied(t)
	if n, err := stmts.PartsCount(ctx, pool, "q"); err != nil || n != 1 {
		t.Fatalf("QueueParts of a queue without a row: %d, %v; want 1", n, err)
	}
	if ok, err := stmts.PartsCountInsert(ctx, pool, "q", 6); err != nil || !ok {
		t.Fatalf("InsertQueueParts: %v, %v; want true", ok, err)
	}
	if ok, err := stmts.PartsCountInsert(ctx, pool, "q", 8); err != nil || ok {
		t.Fatalf("InsertQueueParts over a stored count: %v, %v; want false", ok, err)
	}
	if n, err := stmts.PartsCount(ctx, pool, "q"); err != nil || n != 6 {
		t.Fatalf("QueueParts: %d, %v; want 6", n, err)
	}
	// 60 items of q and 60 of another queue over parts 0 to 5.
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_items (id, queue, part, vesting_at, turn_at, payload)
		SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'q' ELSE 'other' END, (g / 2) % 6, now(), now(), '\x00'::BYTEA
		FROM generate_series(0, 119) AS g`); err != nil {
		t.Fatal(err)
	}
	sess, err := stmts.SessionsCreate(ctx, pool, time.Hour, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	for p := range 6 {
		if ok, err := stmts.PartsAcquire(ctx, pool, sess, "q", p); err != nil || !ok {
			t.Fatalf("AcquirePart %d: %v, %v", p, ok, err)
		}
	}
	if err := stmts.PartsCountUpsert(ctx, pool, "q", 4); err != nil {
		t.Fatal(err)
	}
	if n, err := stmts.PartsCount(ctx, pool, "q"); err != nil || n != 4 {
		t.Fatalf("QueueParts after UpsertQueueParts: %d, %v; want 4", n, err)
	}
	if n, err := stmts.PartsDropAbove(ctx, pool, "q", 4); err != nil || n != 2 {
		t.Fatalf("DropPartsAbove: %d, %v; want 2 (parts 4 and 5)", n, err)
	}
	var after uuid.UUID
	var moved int64
	pages := 0
	for {
		page, err := stmts.PartsMoveItems(ctx, pool, "q", 4, after, 7)
		if err != nil {
			t.Fatal(err)
		}
		if page.Done {
			if page.Last != uuid.Nil || page.Moved != 0 {
				t.Fatalf("the last page: %+v", page)
			}
			break
		}
		if slices.Compare(page.Last[:], after[:]) <= 0 {
			t.Fatalf("page %d ends at %v, not after %v", pages, page.Last, after)
		}
		after, moved, pages = page.Last, moved+page.Moved, pages+1
	}
	// 120 rows, 7 per page; q had 10 items in each of parts 4 and 5.
	if pages != 18 || moved != 20 {
		t.Errorf("the walk read %d pages and moved %d items; want 18 and 20", pages, moved)
	}
	var left, others int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE queue = 'q' AND part >= 4), count(*) FILTER (WHERE queue = 'other' AND part >= 4)
		FROM crdbwork_items`).Scan(&left, &others); err != nil {
		t.Fatal(err)
	}
	if left != 0 || others != 20 {
		t.Errorf("after the move: %d items of q in parts >= 4 (want 0), %d of the other queue (want 20, untouched)", left, others)
	}
}

// TestStoreSchedule: ScheduleLast and AdvanceSchedule never move a
// schedule's period backward, in a transaction as the runner uses them.
func TestStoreSchedule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, stmts := applied(t)
	t1 := time.Now().UTC().Truncate(time.Minute)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		now, err := stmts.SchedulesNow(ctx, tx)
		if err != nil {
			return err
		}
		if d := time.Since(now); d < -time.Minute || d > time.Minute {
			t.Errorf("ScheduleNow: %v, %v from this process's clock", now, d)
		}
		if _, found, err := stmts.SchedulesLast(ctx, tx, "q", "s"); err != nil || found {
			t.Errorf("ScheduleLast of a schedule that never fired: %v, %v; want not found", found, err)
		}
		for _, c := range []struct {
			period time.Time
			want   bool
		}{{t1, true}, {t1, false}, {t1.Add(-time.Minute), false}, {t1.Add(time.Minute), true}} {
			if ok, err := stmts.SchedulesAdvance(ctx, tx, "q", "s", c.period); err != nil || ok != c.want {
				t.Errorf("AdvanceSchedule(%v): %v, %v; want %v", c.period, ok, err, c.want)
			}
		}
		last, found, err := stmts.SchedulesLast(ctx, tx, "q", "s")
		if err != nil || !found || !last.Equal(t1.Add(time.Minute)) {
			t.Errorf("ScheduleLast: %v, %v, %v; want %v", last, found, err, t1.Add(time.Minute))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStoreQueueLimits: a queue without a row has no limits; a stored row's
// limits come back in their fields.
func TestStoreQueueLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, stmts := applied(t)
	l, err := stmts.QueueLimits(ctx, pool, "q")
	if err != nil || l.MaxInFlight != 0 || l.Rate != 0 || l.TenantMaxInFlight != 0 || l.TenantRate != 0 || l.Now.IsZero() {
		t.Fatalf("QueueLimits without a row: %+v, %v", l, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_queues (name, max_in_flight, rate_limit, tenant_max_in_flight, tenant_rate_limit)
		VALUES ('q', 10, 2.5, 3, 0.5)`); err != nil {
		t.Fatal(err)
	}
	l, err = stmts.QueueLimits(ctx, pool, "q")
	if err != nil || l.MaxInFlight != 10 || l.Rate != 2.5 || l.TenantMaxInFlight != 3 || l.TenantRate != 0.5 {
		t.Fatalf("QueueLimits: %+v, %v", l, err)
	}
}

// TestStoreTestHelpers: a test schema is made once and dropped with what
// it holds; QueueItems reads a queue's items, claimed or not; DropQueueRows
// leaves other queues alone.
func TestStoreTestHelpers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	if err := store.New(crsql.Tables{}).SchemaCreate(ctx, pool); err == nil {
		t.Error("CreateTestSchema without a schema succeeded")
	}
	tables := crsql.Tables{Schema: "store_helpers"}
	stmts := store.New(tables)
	if err := stmts.SchemaCreate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := stmts.SchemaCreate(ctx, pool); err == nil {
		t.Error("CreateTestSchema of an existing schema succeeded")
	}
	if err := crsql.Apply(ctx, pool, tables); err != nil {
		t.Fatal(err)
	}
	sess, err := stmts.SessionsCreate(ctx, pool, time.Hour, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`INSERT INTO store_helpers.crdbwork_items (id, queue, part, priority, item_key, vesting_at, turn_at, payload, tenant)
		 SELECT gen_random_uuid(), CASE WHEN g <= 3 THEN 'q' ELSE 'other' END, 0, 10 - g, 'k' || g, now(), now(), '\x01'::BYTEA,
		        CASE WHEN g = 1 THEN 't' END
		 FROM generate_series(1, 5) AS g`,
		`UPDATE store_helpers.crdbwork_items SET claim = '` + sess.String() + `', claim_token = 7, attempts = 1,
		     lease_until = now() + INTERVAL '1 minute' WHERE item_key = 'k1'`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	items, err := stmts.SchemaQueueItems(ctx, pool, "q", 10)
	if err != nil || len(items) != 3 {
		t.Fatalf("QueueItems: %d items, %v; want 3", len(items), err)
	}
	claimed := 0
	for _, it := range items {
		if it.Queue != "q" || it.Key == nil || string(it.Payload) != "\x01" {
			t.Errorf("QueueItems: %+v", it)
		}
		if it.Claimed {
			claimed++
			if *it.Key != "k1" || it.Claim == nil || *it.Claim != sess || it.Token != 7 || it.Attempts != 1 || it.LeaseUntil == nil ||
				it.Tenant == nil || *it.Tenant != "t" || it.ClaimPart != nil {
				t.Errorf("the claimed item: %+v", it)
			}
		} else if it.Claim != nil {
			t.Errorf("an unclaimed item with a claim: %+v", it)
		}
	}
	if claimed != 1 {
		t.Errorf("QueueItems: %d claimed items; want 1", claimed)
	}
	if items, err := stmts.SchemaQueueItems(ctx, pool, "q", 1); err != nil || len(items) != 2 {
		t.Errorf("QueueItems with limit 1: %d items, %v; want 2 (one of each branch)", len(items), err)
	}
	if err := stmts.SchemaDropQueueRows(ctx, pool, "q"); err != nil {
		t.Fatal(err)
	}
	if items, err := stmts.SchemaQueueItems(ctx, pool, "q", 10); err != nil || len(items) != 0 {
		t.Errorf("QueueItems after DropQueueRows: %d items, %v; want none", len(items), err)
	}
	if items, err := stmts.SchemaQueueItems(ctx, pool, "other", 10); err != nil || len(items) != 2 {
		t.Errorf("QueueItems of another queue after DropQueueRows: %d items, %v; want 2", len(items), err)
	}
	if err := stmts.SchemaDrop(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := crsql.Check(ctx, pool, tables); !errors.Is(err, crsql.ErrSchemaMissing) {
		t.Errorf("Check after DropTestSchema: %v; want ErrSchemaMissing", err)
	}
	if err := stmts.SchemaDrop(ctx, pool); err != nil {
		t.Errorf("DropTestSchema of a dropped schema: %v", err)
	}
}
