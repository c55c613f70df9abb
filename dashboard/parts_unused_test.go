package dashboard_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/dashboard"
)

// A queue no session works in parts mode (no part of it owned) shows no
// "owned by nobody" alarm and no red part on the Sessions page; a queue
// whose parts are in use still shows its unowned parts (before, every
// queue without parts showed "1 owned by nobody" in red).
func TestSessionsPageRaisesNoAlarmForQueuesWithoutParts(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	s := uuid.New()
	for _, q := range []string{
		`INSERT INTO crdbwork_sessions (id, expiry, host, pid, name) VALUES ('` + s.String() + `', INTERVAL '1 hour', 'host-a', 41, 'w')`,
		`INSERT INTO crdbwork_queues (name, num_parts) VALUES ('plain', 1), ('wide', 4), ('parted', 4)`,
		`INSERT INTO crdbwork_session_parts (session_id, queue, part) VALUES ('` + s.String() + `', 'parted', 0), ('` + s.String() + `', 'parted', 1)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(t, pool, "plain", 3, nil)
	page := newBrowser(t, srv.URL).get("/sessions")
	section := func(q string) string {
		return regexp.MustCompile(`(?s)<section class="partmap" data-queue="` + q + `">.*?</section>`).FindString(page)
	}
	for _, q := range []string{"plain", "wide"} {
		sec := section(q)
		if sec == "" {
			t.Fatalf("no part map of %q:\n%s", q, page)
		}
		if strings.Contains(sec, "owned by nobody") || strings.Contains(sec, " unowned") || !strings.Contains(sec, `data-k="parts-unused"`) {
			t.Errorf("queue %q, worked by no session in parts mode, raises an alarm or does not say its parts are unused:\n%s", q, sec)
		}
	}
	if sec := section("parted"); !strings.Contains(sec, `data-k="unowned">2 owned by nobody`) || strings.Count(sec, "part unowned") != 2 {
		t.Errorf("queue parted (2 of 4 parts owned) does not show 2 unowned parts:\n%s", sec)
	}
}

// A drained queue (only ended ids and a dead item left) stays on the
// overview with its last activity; a queue with nothing ended shows none.
func TestOverviewKeepsDrainedQueuesWithTheirLastActivity(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_ended (queue, id, outcome, ended_at) VALUES ('reports', gen_random_uuid(), 'acked', now() - INTERVAL '2 hours')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO crdbwork_schedules (queue, name, last_period, updated_at) VALUES ('nightly', 'backup', now(), now() - INTERVAL '3 hours')`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "fresh", 1, nil)
	page := newBrowser(t, srv.URL).get("/")
	for q, want := range map[string]string{"reports": "2h", "nightly": "3h", "fresh": "—"} {
		if got := cell(page, q, "activity"); !strings.HasPrefix(got, want) {
			t.Errorf("the overview's last activity of %s: %q, want %s…", q, got, want)
		}
	}
}
