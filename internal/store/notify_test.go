package store_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/internal/testdb"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// TestNotifyChannel: a channel is lowercase ASCII within PostgreSQL's 63
// bytes whatever the queue's name and tables, the same for the same ones,
// and different when the queue, the schema or the prefix differs.
func TestNotifyChannel(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("ü\"; DROP TABLE x; ", 100)
	valid := regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	seen := map[string]string{}
	for _, c := range []struct {
		t     crsql.Tables
		queue string
	}{
		{crsql.Tables{}, "default"}, {crsql.Tables{}, "Default"}, {crsql.Tables{}, long}, {crsql.Tables{}, ""},
		{crsql.Tables{Prefix: "other_"}, "default"}, {crsql.Tables{Schema: "work"}, "default"},
		{crsql.Tables{Schema: "work", Prefix: "other_"}, "default"},
		// The fields' boundaries count: these must differ too.
		{crsql.Tables{Schema: "a", Prefix: "b"}, "c"}, {crsql.Tables{Schema: "ab"}, "c"}, {crsql.Tables{Prefix: "a"}, "bc"},
	} {
		ch := store.New(c.t).NotifyChannel(c.queue)
		what := c.t.Schema + "|" + c.t.Prefix + "|" + c.queue
		if !valid.MatchString(ch) {
			t.Errorf("channel of %q is %q: want 1 to 63 bytes of [a-z0-9_]", what, ch)
		}
		if again := store.New(c.t).NotifyChannel(c.queue); again != ch {
			t.Errorf("channel of %q is %q, then %q", what, ch, again)
		}
		if prev, dup := seen[ch]; dup {
			t.Errorf("%q and %q share channel %q", prev, what, ch)
		}
		seen[ch] = what
	}
}

// TestNotifyPlanAndDelivery: Store.Notify's statement reads no table; a
// notification is delivered only when its transaction commits, once per
// transaction however often it was sent there; EnqueueInsertNotify's
// insert and notification commit together; Listen and Unlisten take a
// channel's name as an identifier.
func TestNotifyPlanAndDelivery(t *testing.T) {
	t.Parallel()
	if testdb.Kind(t) != "postgres" {
		t.Skip("notifications are PostgreSQL's only")
	}
	ctx := context.Background()
	pool := newSchemaDB(t)
	stmts := store.New(crsql.Tables{})
	explainEach(t, pool, "notify_", []planCase{{"Notify", store.NotifyText(), []any{"chan", "1,2"}}}, nil, func(i int, mode, plan string) {
		if !strings.HasPrefix(plan, "Result") || strings.Contains(plan, "Scan") {
			t.Errorf("Notify's plan (%s) is not a bare Result:\n%s", mode, plan)
		}
	})

	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rolled, committed, enqueued, barrier, dropped := stmts.NotifyChannel("rolled"), stmts.NotifyChannel("committed"),
		stmts.NotifyChannel("enqueued"), stmts.NotifyChannel("barrier"), stmts.NotifyChannel("dropped")
	for _, ch := range []string{rolled, committed, enqueued, barrier, dropped} {
		if err := stmts.NotifyListen(ctx, conn, ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := stmts.NotifyUnlisten(ctx, conn, dropped); err != nil {
		t.Fatal(err)
	}
	inTx := func(ch string, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for range 3 {
			if err := stmts.Notify(ctx, tx, ch, ""); err != nil {
				t.Fatal(err)
			}
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	inTx(rolled, false)
	inTx(committed, true)
	inTx(dropped, true)
	id := uuid.New()
	added, err := stmts.ItemsEnqueueNotify(ctx, pool, "q", []store.EnqueueRow{{ID: id, MaxAttempts: 1}}, enqueued, "")
	if err != nil || len(added) != 1 || added[0] != id {
		t.Fatalf("EnqueueInsertNotify = %v, %v; want [%s]", added, err, id)
	}
	// An insert that fails (max_attempts' CHECK) takes its notification
	// with it: they are one transaction.
	if _, err := stmts.ItemsEnqueueNotify(ctx, pool, "q", []store.EnqueueRow{{ID: uuid.New(), MaxAttempts: -1}}, rolled, ""); err == nil {
		t.Fatal("EnqueueInsertNotify with MaxAttempts -1 succeeded, want the CHECK's violation")
	}
	inTx(barrier, true)
	var got []string
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, n.Channel)
		if n.Channel == barrier {
			break
		}
	}
	if want := []string{committed, enqueued, barrier}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("notifications %v, want %v (committed once, enqueued, barrier; nothing of the rolled-back or unlistened)", got, want)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM crdbwork_items WHERE id = $1`, id).Scan(&n); err != nil || n != 1 {
		t.Errorf("the item of EnqueueInsertNotify: %d rows, %v", n, err)
	}
}
