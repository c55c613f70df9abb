package dashboard_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/dashboard"
)

// A waiting item of one queue whose prerequisites are in another
// (NewItem.AfterIn) shows each with its queue and state, beside one of its
// own queue.
func TestItemPageShowsPrerequisitesOfOtherQueues(t *testing.T) {
	t.Parallel()
	pool, srv := setup(t, dashboard.Options{})
	ctx := context.Background()
	qa, err := claim.New(pool, claim.Options{Queue: "fetch"})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := claim.New(pool, claim.Options{Queue: "publish"})
	if err != nil {
		t.Fatal(err)
	}
	other, local, dep := uuid.New(), uuid.New(), uuid.New()
	if _, err := qa.Enqueue(ctx, claim.NewItem{ID: other, Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := qb.Enqueue(ctx, claim.NewItem{ID: local, Payload: []byte("b")},
		claim.NewItem{ID: dep, Payload: []byte("d"), After: []uuid.UUID{local}, AfterIn: []claim.Prereq{{Queue: "fetch", ID: other}}}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, srv.URL)
	page := b.get("/item?id=" + dep.String())
	if got := field(page, "item-state"); got != "waiting for 2 prerequisite(s)" {
		t.Fatalf("the waiting item's state: %q", got)
	}
	row := func(id uuid.UUID) string {
		return regexp.MustCompile(`(?s)<tr data-prereq="` + id.String() + `">.*?</tr>`).FindString(page)
	}
	if r := row(other); !strings.Contains(r, "fetch</a> (another queue)") || !strings.Contains(r, "<td>queued</td>") {
		t.Errorf("the prerequisite of queue fetch: %q; want its queue and state", r)
	}
	if r := row(local); !strings.Contains(r, `<td class="prereq-queue">publish</td>`) || !strings.Contains(r, "<td>queued</td>") {
		t.Errorf("the prerequisite of its own queue: %q", r)
	}
}
