package store

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// recorder is a DB, a pgx.Tx and a Copier that runs nothing: it records
// each statement with its arguments, answers queries with no rows and
// single-row reads with pgx.ErrNoRows (other pgx.Tx methods are not called
// by the Store methods under test).
type recorder struct {
	pgx.Tx
	calls []call
}

type call struct {
	sql  string
	args []any
}

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.calls = append(r.calls, call{sql, args})
	return pgconn.CommandTag{}, nil
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.calls = append(r.calls, call{sql, args})
	return noRows{}, nil
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.calls = append(r.calls, call{sql, args})
	return noRow{}
}

// CopyFrom records the COPY as a call whose text is the table's name and
// whose arguments are the columns, and checks that each row gives one value
// per column.
func (r *recorder) CopyFrom(_ context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	var n int64
	for src.Next() {
		vals, err := src.Values()
		if err != nil {
			return n, err
		}
		if len(vals) != len(columns) {
			return n, errors.New("a COPY row of " + strconv.Itoa(len(vals)) + " values for " + strconv.Itoa(len(columns)) + " columns")
		}
		n++
	}
	args := make([]any, len(columns))
	for i, c := range columns {
		args[i] = c
	}
	r.calls = append(r.calls, call{table.Sanitize(), args})
	return n, src.Err()
}

type noRows struct{}

func (noRows) Close()                                       {}
func (noRows) Err() error                                   { return nil }
func (noRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (noRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (noRows) Next() bool                                   { return false }
func (noRows) Scan(...any) error                            { return errors.New("no row") }
func (noRows) Values() ([]any, error)                       { return nil, errors.New("no row") }
func (noRows) RawValues() [][]byte                          { return nil }
func (noRows) Conn() *pgx.Conn                              { return nil }
func (noRows) TypeMap() *pgtype.Map                         { return pgtype.NewMap() }

type noRow struct{}

func (noRow) Scan(...any) error { return pgx.ErrNoRows }

var placeholder = regexp.MustCompile(`\$(\d+)`)

// params returns the highest placeholder number of a statement.
func params(sql string) int {
	n := 0
	for _, m := range placeholder.FindAllStringSubmatch(sql, -1) {
		k, _ := strconv.Atoi(m[1])
		n = max(n, k)
	}
	return n
}

// TestStoreRunsPackageClaimsStatements calls every Store method that
// package claim uses, on both dialects, and checks that each statement gets
// one argument per placeholder, that no list parameter goes as NULL, and
// that together they run every statement of package claim (so that the
// EXPLAIN tests, which cover the statement texts, cover what the methods
// run).
func TestStoreRunsPackageClaimsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tables := range []Tables{{}, {Schema: "w", Prefix: "x_"}} {
		s := New(tables)
		r := &recorder{}
		id, session := uuid.New(), uuid.New()
		keys := []ClaimKey{{ID: id, Session: session, Token: 3}}
		a := ClaimArgs{Session: session, Queue: "q", Limit: 5, Lease: time.Second}
		ids := []uuid.UUID{id}
		now := time.Now()
		for _, d := range []Dialect{Postgres, Cockroach} {
			_, _ = s.ItemsClaimAny(ctx, r, d, a)
			for k := 1; k <= MaxPartBranches; k++ {
				_, _ = s.ItemsClaimParts(ctx, r, d, a, make([]int64, k))
				shared := a
				shared.PartLimit = 2
				_, _ = s.ItemsClaimParts(ctx, r, d, shared, make([]int64, k))
			}
			_, _ = s.ItemsClaimPicked(ctx, r, d, session, time.Second, ids)
			_, _ = s.ItemsClaimUrgent(ctx, r, d, UrgentArgs{ClaimArgs: a, MaxPriority: 1})
			_, _ = s.ItemsTakeAtMostOnce(ctx, r, d, keys)
			_, _ = s.ItemsAck(ctx, r, d, keys)
			_, _ = s.ItemsExtend(ctx, r, d, keys, time.Second)
			_, _ = s.ItemsReapLeases(ctx, r, d, "q", 10)
		}
		for k := 1; k <= MaxPartBranches; k++ {
			_, _ = s.ItemsPickParts(ctx, r, "q", 5, nil, make([]int64, k))
		}
		_, _ = s.ItemsNack(ctx, r, keys[0], time.Second, "e")
		_, _ = s.ItemsRelease(ctx, r, keys[0])
		_, _ = s.ItemsExhaust(ctx, r, keys[0], "e")
		if held, err := s.ItemsDeadLetter(ctx, r, keys[0], "e", "failed"); held || err != nil {
			t.Errorf("DeadLetter without a row: held %v, error %v; want false, nil", held, err)
		}
		_, _ = s.ItemsReleaseForgotten(ctx, r, "q", session, nil)
		_, _ = s.ItemsCancel(ctx, r, id, "q", "ops", "why")
		_, _ = s.ItemsCancelItem(ctx, r, id, "q", "ops", "why")
		_, _ = s.ItemsCancelsOfSession(ctx, r, "q", session, 10)
		_, _ = s.ItemsCancelEnd(ctx, r, keys[0])
		_, _ = s.ItemsReapCancelled(ctx, r, "q", 10)
		_, _ = s.ItemsCancelled(ctx, r, "q", "", nil, 10)
		_, _ = s.CancelledRequeue(ctx, r, id, "q")
		_, _ = s.CancelledList(ctx, r, "q", "", time.Time{}, id, 10)
		_, _ = s.CancelledPrune(ctx, r, "q", 10)
		_, _ = s.ItemsCancelled(ctx, r, "q", "", &CancelledRow{ID: id, EndedAt: now}, 10)
		_, _, _ = s.EndedOutcome(ctx, r, "q", id)
		_, _ = s.ItemsSnooze(ctx, r, keys[0], time.Second, 100)
		_, _, _ = s.ItemsCancelSnoozeCounts(ctx, r, "q")
		_, _ = s.ItemsReapExhausted(ctx, r, "q", 10, "e")
		_, _ = s.ItemsReapExpired(ctx, r, "q", 10)
		_, _ = s.ItemsReapLeasesCandidates(ctx, r, "q", 10)
		_, _ = s.ItemsReapExhaustedCandidates(ctx, r, "q", 10)
		_, _ = s.ItemsReapExpiredCandidates(ctx, r, "q", 10)
		_, _ = s.ItemsReapLeasesIDs(ctx, r, "q", ids)
		_, _ = s.ItemsReapExhaustedIDs(ctx, r, "q", ids, "e")
		_, _ = s.ItemsReapExpiredIDs(ctx, r, "q", ids)
		_, _ = s.DeadPage(ctx, r, "q", 10)
		_, _ = s.DeadPageBefore(ctx, r, "q", now, id, id, 10)
		_, _ = s.DeadRequeue(ctx, r, id, "q", nil)

		for _, d := range []Dialect{Postgres, Cockroach} {
			added, err := s.ItemsEnqueue(ctx, r, d, "q", []EnqueueRow{{ID: id, Payload: nil}})
			if err != nil || len(added) != 0 {
				t.Errorf("EnqueueInsert answered with no rows: %v, %v", added, err)
			}
		}
		if added, err := s.ItemsEnqueueNotify(ctx, r, "q", []EnqueueRow{{ID: id}}, s.NotifyChannel("q"), ""); err != nil || len(added) != 0 {
			t.Errorf("EnqueueInsertNotify answered with no rows: %v, %v", added, err)
		}
		_ = s.Notify(ctx, r, s.NotifyChannel("q"), "")
		_, _, _, _, _ = s.ItemsEnqueueParts(ctx, r, "q")
		if n, err := s.ItemsEnqueueCopy(ctx, r, "q", 2, func(int) CopyRow { return CopyRow{ID: uuid.New()} }); n != 2 || err != nil {
			t.Errorf("CopyItems of 2 rows: %d, %v", n, err)
		}
		_, _ = s.ItemsEnqueueFound(ctx, r, "q", ids)
		_, _ = s.EndedPrune(ctx, r, "q", 10)
		for k := 1; k <= MaxFairPairs; k++ {
			lasts, err := s.ItemsFairLasts(ctx, r, "q", make([]FairPair, k))
			if lasts != nil || err != nil {
				t.Errorf("FairLasts without rows: %v, %v; want nil (not fair)", lasts, err)
			}
		}
		for _, d := range []Dialect{Postgres, Cockroach} {
			_, _ = s.ItemsFairHead(ctx, r, d, "q", 0)
		}

		_, _ = s.QueueInspect(ctx, r, "q")
		_, _ = s.QueueInspectUnclaimed(ctx, r, "q")
		_, _ = s.QueueInspectClaimed(ctx, r, "q")
		_, _ = s.QueueInspectTenants(ctx, r, "q", 20)
		_, _ = s.QueueInspectDead(ctx, r, "q")
		_, _ = s.QueuesStored(ctx, r, "", 10)
		_, _, _ = s.QueuesNextUnclaimed(ctx, r, "")
		_, _, _ = s.QueuesNextClaimed(ctx, r, "")
		_, _, _ = s.QueuesNextDead(ctx, r, "")
		_, _, _ = s.QueuesNextAny(ctx, r, "")
		_, _, _ = s.WaitingItem(ctx, r, id)
		_, _ = s.EndedOfID(ctx, r, []string{"q"}, id)
		_, _ = s.FleetKinds(ctx, r, "q", 10)
		_, _ = s.AuditPageFilter(ctx, r, AuditFilter{}, nil, 10)
		if _, stored, err := s.QueueSettings(ctx, r, "q"); stored || err != nil {
			t.Errorf("QueueSettings without a row: stored %v, error %v; want false, nil", stored, err)
		}
		_ = s.QueueConfigure(ctx, r, "q", QueueSettingsRow{})
		_, _ = s.QueuePaused(ctx, r, "q")
		_ = s.QueuePause(ctx, r, "q", true)
		_, _ = s.QueueTenantLimits(ctx, r, "q")
		_ = s.QueueTenantLimitSet(ctx, r, "q", "t", 1, 1)
		_, _ = s.QueueTenantLimitRemove(ctx, r, "q", "t")

		// The batched fair reads queue the same texts and arguments.
		b := &pgx.Batch{}
		s.ItemsFairLastsQueue(b, "q", make([]FairPair, 3))
		s.ItemsFairHeadQueue(b, Postgres, "q", 0)
		s.ItemsFairHeadQueue(b, Cockroach, "q", 0)
		for _, qq := range b.QueuedQueries {
			r.calls = append(r.calls, call{qq.SQL, qq.Arguments})
		}

		ran := map[string]bool{}
		for _, c := range r.calls {
			ran[c.sql] = true
			if c.sql == s.enq.CopyTable.Sanitize() {
				continue
			}
			if len(c.args) > 0 {
				if _, ok := c.args[0].(pgx.QueryExecMode); ok {
					c.args = c.args[1:] // how pgx runs it (Store.ItemsClaimPicked), not a parameter
				}
			}
			if n := params(c.sql); n != len(c.args) {
				t.Errorf("%d arguments for %d placeholders:\n%s", len(c.args), n, c.sql)
			}
			for i, arg := range c.args {
				switch v := arg.(type) {
				case []string:
					if v == nil {
						t.Errorf("argument $%d is a nil list (NULL):\n%s", i+1, c.sql)
					}
				case []uuid.UUID:
					if v == nil {
						t.Errorf("argument $%d is a nil list (NULL):\n%s", i+1, c.sql)
					}
				}
			}
		}
		want := map[string]string{
			"ClaimAny": s.st.ClaimAny, "PostgresClaimAny": s.st.PostgresClaimAny,
			"ReapLeases": s.st.ReapLeases, "PostgresReapLeases": s.st.PostgresReapLeases,
			"AckMany": s.st.AckMany, "PostgresAckMany": s.st.PostgresAckMany,
			"Extend": s.st.Extend, "PostgresExtend": s.st.PostgresExtend,
			"TakeAtMostOnce": s.st.TakeAtMostOnce, "PostgresTakeAtMostOnce": s.st.PostgresTakeAtMostOnce,
			"Nack": s.st.Nack, "Release": s.st.Release, "DeadLetter": s.st.DeadLetter,
			"ReapExhausted": s.st.ReapExhausted, "ReapExpired": s.st.ReapExpired, "FairHead": s.st.FairHead, "PostgresFairHead": s.st.PostgresFairHead,
			"QueueSettings": s.st.QueueSettings, "ConfigureQueue": s.st.ConfigureQueue,
			"ReleaseForgot": s.st.ReleaseForgot, "PauseQueue": s.st.PauseQueue, "QueuePaused": s.st.QueuePaused,
			"Cancel": s.st.Cancel, "DeadItems": s.st.DeadItems, "Requeue": s.st.Requeue,

			"ExhaustedIDs": s.death.ExhaustedIDs, "ExpiredIDs": s.death.ExpiredIDs,
			"ExpiredLeaseIDs": s.death.ExpiredLeaseIDs, "ReapLeasesIDs": s.death.ReapLeasesIDs,
			"ReapExhaustedIDs": s.death.ReapExhaustedIDs, "ReapExpiredIDs": s.death.ReapExpiredIDs,
			"Exhaust": s.death.Exhaust, "DeadItemsBefore": s.death.DeadItemsBefore, "RequeueState": s.death.RequeueState,

			"PruneEnded": s.dedup.PruneEnded, "Notify": notifyStatement,
			"Insert": s.enq.Insert, "PostgresInsert": s.enq.PostgresInsert, "Parts": s.enq.Parts, "Found": s.enq.Found, "COPY": s.enq.CopyTable.Sanitize(),

			"Queue": s.insp.Queue, "Unclaimed": s.insp.Unclaimed, "Claimed": s.insp.Claimed,
			"Tenants": s.insp.Tenants, "InspectDeadCount": s.insp.DeadCount, "StoredQueues": s.insp.StoredQueues,
			"NextUnclaimedQueue": s.insp.NextUnclaimedQueue, "NextClaimedQueue": s.insp.NextClaimedQueue,
			"NextDeadQueue": s.insp.NextDeadQueue,

			"TenantLimits": s.lim.TenantLimits, "SetTenantLimit": s.lim.SetTenantLimit,
			"RemoveTenantLimit": s.lim.RemoveTenantLimit,

			"ClaimPicked": s.parts.ClaimPicked, "PostgresClaimPicked": s.parts.PostgresClaimPicked,
			"ClaimUrgent": s.urgent.ClaimUrgent, "PostgresClaimUrgent": s.urgent.PostgresClaimUrgent,
		}
		for name, text := range CancelStatementsForTest(tables) {
			if name != "State" { // read only after a request that changed nothing: the recorder's rows change nothing
				want["cancel "+name] = text
			}
		}
		for k := 1; k <= MaxPartBranches; k++ {
			want["Claim/"+strconv.Itoa(k)] = s.parts.Claim(Cockroach, k)
			want["PostgresClaim/"+strconv.Itoa(k)] = s.parts.Claim(Postgres, k)
			want["ClaimShares/"+strconv.Itoa(k)] = s.parts.ClaimShares(Cockroach, k)
			want["PostgresClaimShares/"+strconv.Itoa(k)] = s.parts.ClaimShares(Postgres, k)
			want["Pick/"+strconv.Itoa(k)] = s.parts.Pick(k)
		}
		for k := 1; k <= MaxFairPairs; k++ {
			want["Lasts/"+strconv.Itoa(k)] = s.fair.Lasts(k)
		}
		for name, text := range want {
			if !ran[text] {
				t.Errorf("tables %+v: no Store method ran %s", tables, name)
			}
		}
	}
}
