package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/retry"
	"github.com/crdbwork/crdbwork/internal/store"
	"github.com/crdbwork/crdbwork/partition"
	"github.com/crdbwork/crdbwork/schedule"
)

// The actions. Each is a POST to /action with the form fields below and
// the CSRF token; without confirm=yes it changes nothing and answers a
// page that says what it would do, with a button that posts it again with
// confirm=yes. Each action done is recorded in the audit list.
//
//	act      requeue, requeue-filter, requeue-cancelled, cancel, delete-dead, pause, resume, limits, parts
//	queue    the queue
//	sel      items: an id (cancel, requeue: the newest death) or id/death
//	         (requeue, delete-dead); repeated
//	tenant, reason, error, kind   requeue-filter's filter (claim.DeadFilter)
//	max_in_flight, rate     limits: the queue's new limits (0: none)
//	parts    parts: the new number of parts
//	return   where to go afterwards: a path of the dashboard

// maxSelected bounds the items one action names.
const maxSelected = 1000

// actionReq is a parsed action.
type actionReq struct {
	Act    string
	Queue  string
	Sel    []selected
	Filter claim.DeadFilter
	Limit  claim.Limit
	Parts  int
	// Schedule names the schedule of schedule-pause and schedule-resume.
	Schedule string
	Return   string
	Fields   url.Values // the form, for the confirmation's resubmission
	User     string     // the dashboard user (Options.Auth), recorded as a cancel's author
}

type selected struct {
	ID    uuid.UUID
	Death *uuid.UUID
}

func (h *handler) action(w http.ResponseWriter, r *http.Request) {
	if h.opts.ReadOnly {
		http.Error(w, "refused: this dashboard is read-only", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.checkCSRF(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	a, err := parseAction(r.PostForm, h.opts.BasePath)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.User = userOf(r)
	browser := h.browserID(w, r)
	if r.PostFormValue("confirm") != "yes" {
		what, err := h.describe(r.Context(), a)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var hidden []field
		for k, vs := range a.Fields {
			if k == "confirm" || k == csrfField {
				continue
			}
			for _, v := range vs {
				hidden = append(hidden, field{k, v})
			}
		}
		h.render(w, r, "confirm", "Confirm", browser, confirmData{What: what, Fields: hidden, Return: a.Return})
		return
	}
	done, err := h.do(r.Context(), a)
	detail := done
	if err != nil {
		detail = strings.TrimSpace(done + " failed: " + err.Error())
	}
	rec := store.AuditRow{Actor: userOf(r), Source: "dashboard", Action: a.Act, Queue: a.Queue, Detail: detail}
	auditErr := retry.Do(r.Context(), nil, func(ctx context.Context) error {
		return store.Classify(h.store.AuditRecord(ctx, h.db, rec))
	})
	if err != nil {
		h.render(w, r, "done", "Failed", browser, doneData{Msg: detail, Failed: true, Return: a.Return})
		return
	}
	if auditErr != nil {
		h.render(w, r, "done", "Done, not recorded", browser, doneData{Msg: done + " (but recording it in the audit list failed: " + auditErr.Error() + ")", Failed: true, Return: a.Return})
		return
	}
	h.sampler.refresh() // the pages after it show what it did
	ret, _ := url.Parse(a.Return)
	q := ret.Query()
	q.Set("msg", done)
	ret.RawQuery = q.Encode()
	http.Redirect(w, r, ret.String(), http.StatusSeeOther)
}

type field struct{ Name, Value string }

type confirmData struct {
	What   string
	Fields []field
	Return string
}

type doneData struct {
	Msg    string
	Failed bool
	Return string
}

var acts = []string{"requeue", "requeue-filter", "requeue-cancelled", "cancel", "delete-dead", "pause", "resume", "limits", "parts", "schedule-pause", "schedule-resume"}

func parseAction(f url.Values, base string) (*actionReq, error) {
	a := &actionReq{Act: f.Get("act"), Queue: f.Get("queue"), Fields: f, Return: f.Get("return")}
	if !contains(acts, a.Act) {
		return nil, fmt.Errorf("unknown action %q", a.Act)
	}
	if a.Queue == "" {
		return nil, errors.New("no queue given")
	}
	// Only a path of the dashboard: never another site.
	if a.Return == "" || !strings.HasPrefix(a.Return, base+"/") || strings.HasPrefix(a.Return, "//") || strings.Contains(a.Return, "\\") {
		a.Return = base + "/queue?name=" + url.QueryEscape(a.Queue)
	}
	for _, s := range f["sel"] {
		idText, deathText, hasDeath := strings.Cut(s, "/")
		id, err := uuid.Parse(idText)
		if err != nil {
			return nil, fmt.Errorf("not an item id: %q", s)
		}
		sel := selected{ID: id}
		if hasDeath {
			d, err := uuid.Parse(deathText)
			if err != nil {
				return nil, fmt.Errorf("not a death id: %q", s)
			}
			sel.Death = &d
		}
		a.Sel = append(a.Sel, sel)
	}
	if len(a.Sel) > maxSelected {
		return nil, fmt.Errorf("%d items selected: at most %d at once (requeue by filter for more)", len(a.Sel), maxSelected)
	}
	switch a.Act {
	case "requeue", "requeue-cancelled", "cancel", "delete-dead":
		if len(a.Sel) == 0 {
			return nil, errors.New("no item selected")
		}
		if a.Act == "delete-dead" {
			for _, s := range a.Sel {
				if s.Death == nil {
					return nil, errors.New("delete-dead needs id/death pairs")
				}
			}
		}
	case "requeue-filter":
		a.Filter = claim.DeadFilter{Tenant: f.Get("tenant"), Reason: f.Get("reason"), ErrorContains: f.Get("error"), Kind: f.Get("kind")}
	case "schedule-pause", "schedule-resume":
		if a.Schedule = f.Get("schedule"); a.Schedule == "" {
			return nil, errors.New("no schedule given")
		}
	case "limits":
		n, err1 := strconv.Atoi(strings.TrimSpace(f.Get("max_in_flight")))
		rate, err2 := strconv.ParseFloat(strings.TrimSpace(f.Get("rate")), 64)
		if err1 != nil || err2 != nil {
			return nil, errors.New("max in flight must be a whole number and rate a number (0: no limit)")
		}
		a.Limit = claim.Limit{MaxInFlight: n, Rate: rate}
		if err := a.Limit.Validate(); err != nil {
			return nil, err
		}
	case "parts":
		n, err := strconv.Atoi(strings.TrimSpace(f.Get("parts")))
		if err != nil || n < 1 || n > partition.MaxParts {
			return nil, fmt.Errorf("the number of parts must be between 1 and %d", partition.MaxParts)
		}
		a.Parts = n
	}
	return a, nil
}

// describe says what an action would do, reading what it needs to.
func (h *handler) describe(ctx context.Context, a *actionReq) (string, error) {
	q, err := h.queue(a.Queue)
	if err != nil {
		return "", err
	}
	switch a.Act {
	case "requeue":
		return fmt.Sprintf("Requeue %d dead item(s) of queue %q, with fresh attempts and no delay.", len(a.Sel), a.Queue), nil
	case "requeue-cancelled":
		return fmt.Sprintf("Requeue %d cancelled item(s) of queue %q, with fresh attempts and no delay (they are no longer listed as cancelled).",
			len(a.Sel), a.Queue), nil
	case "requeue-filter":
		page, err := q.DeadItems(ctx, claim.DeadQuery{DeadFilter: a.Filter, Count: true, Limit: 1})
		if err != nil {
			return "", err
		}
		n := page.Count
		return fmt.Sprintf("Requeue every dead item of queue %q%s: %d death(s) match now (each id is requeued once).",
			a.Queue, describeFilter(a.Filter), n), nil
	case "cancel":
		return fmt.Sprintf("Cancel %d item(s) of queue %q: an unclaimed or waiting item ends at once, recorded as cancelled; "+
			"a running item is asked to stop (its handler's context is cancelled, it is never claimed again, and it ends as cancelled "+
			"when its handler returns). Items waiting for a cancelled one end, dead.", len(a.Sel), a.Queue), nil
	case "delete-dead":
		return fmt.Sprintf("Delete %d dead item(s) of queue %q for good.", len(a.Sel), a.Queue), nil
	case "pause":
		return fmt.Sprintf("Pause queue %q: claims return nothing until it is resumed; claimed items finish, enqueues go on.", a.Queue), nil
	case "schedule-pause":
		return fmt.Sprintf("Pause schedule %q of queue %q: no runner of crdbwork 0.6 or newer enqueues its periods until it is resumed.", a.Schedule, a.Queue), nil
	case "schedule-resume":
		return fmt.Sprintf("Resume schedule %q of queue %q: it goes on with its current period.", a.Schedule, a.Queue), nil
	case "resume":
		return fmt.Sprintf("Resume queue %q: workers claim its items again.", a.Queue), nil
	case "limits":
		s, err := q.Settings(ctx)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Change the limits of queue %q from %s to %s (workers follow within their limits' refresh).", a.Queue,
			limitText(claim.Limit{MaxInFlight: s.MaxInFlight, Rate: s.Rate}), limitText(a.Limit)), nil
	case "parts":
		n, err := partition.Parts(ctx, h.db, h.opts.Tables, a.Queue)
		if err != nil {
			return "", err
		}
		s := fmt.Sprintf("Change the parts of queue %q from %d to %d", a.Queue, n, a.Parts)
		if a.Parts < n {
			s += fmt.Sprintf(" (the items of parts %d-%d move to part %% %d)", a.Parts, n-1, a.Parts)
		}
		return s + "; the workers' rebalancers follow at their next poll.", nil
	}
	return "", fmt.Errorf("unknown action %q", a.Act)
}

func describeFilter(f claim.DeadFilter) string {
	var parts []string
	if f.Tenant != "" {
		parts = append(parts, fmt.Sprintf("tenant %q", f.Tenant))
	}
	if f.Reason != "" {
		parts = append(parts, fmt.Sprintf("reason %q", f.Reason))
	}
	if f.ErrorContains != "" {
		parts = append(parts, fmt.Sprintf("error containing %q", f.ErrorContains))
	}
	if f.Kind != "" {
		parts = append(parts, fmt.Sprintf("kind %q", f.Kind))
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, " and ")
}

func limitText(l claim.Limit) string {
	return funcs["limit"].(func(int64, float64) string)(int64(l.MaxInFlight), l.Rate)
}

// do runs an action and says what it did (also on an error: what was
// done before it).
func (h *handler) do(ctx context.Context, a *actionReq) (string, error) {
	q, err := h.queue(a.Queue)
	if err != nil {
		return "", err
	}
	switch a.Act {
	case "requeue":
		var moved, live, gone, refused int
		for _, s := range a.Sel {
			o := claim.RequeueOptions{ID: s.ID}
			if s.Death != nil {
				o.Death = *s.Death
			}
			res, err := q.Requeue(ctx, o)
			ok := res.Requeued > 0
			switch {
			case errors.Is(err, claim.ErrItemLive):
				live++
			case claim.IsRefusal(err):
				refused++ // this row alone: it stays dead, the others go on
			case err != nil:
				return fmt.Sprintf("requeued %d of %d dead item(s) of %q;", moved, len(a.Sel), a.Queue), err
			case ok:
				moved++
			default:
				gone++
			}
		}
		return fmt.Sprintf("requeued %d of %d dead item(s) of %q (%d live already, %d gone%s)", moved, len(a.Sel), a.Queue, live, gone,
			refusedNote(refused)), nil
	case "requeue-cancelled":
		var moved, live, gone int
		for _, s := range a.Sel {
			res, err := q.Requeue(ctx, claim.RequeueOptions{Cancelled: true, ID: s.ID})
			switch {
			case errors.Is(err, claim.ErrItemLive):
				live++
			case errors.Is(err, claim.ErrNotKept):
				gone++
			case err != nil:
				return fmt.Sprintf("requeued %d of %d cancelled item(s) of %q;", moved, len(a.Sel), a.Queue), err
			case res.Requeued > 0:
				moved++
			default:
				gone++
			}
		}
		return fmt.Sprintf("requeued %d of %d cancelled item(s) of %q (%d live already, %d not kept)", moved, len(a.Sel), a.Queue, live, gone), nil
	case "requeue-filter":
		res, err := q.Requeue(ctx, claim.RequeueOptions{Filter: a.Filter, All: a.Filter == (claim.DeadFilter{})})
		return fmt.Sprintf("requeued %d dead item(s) of %q%s (%d live already, %d gone%s)", res.Requeued, a.Queue,
			describeFilter(a.Filter), res.Live, res.Gone, refusedNote(res.Refused)), err
	case "cancel":
		var ended, asked, already int
		said := func() string {
			return fmt.Sprintf("cancelled %d of %d item(s) of %q: %d ended, %d running asked to stop, %d already asked to stop",
				ended+asked+already, len(a.Sel), a.Queue, ended, asked, already)
		}
		for _, s := range a.Sel {
			res, err := q.CancelItem(ctx, s.ID, claim.CancelOptions{By: a.User, Reason: "cancelled from the dashboard"})
			if err != nil {
				return said() + ";", err
			}
			switch {
			case res.AlreadyRequested:
				already++
			case res.Running:
				asked++
			case res.Found:
				ended++
			}
		}
		return said(), nil
	case "delete-dead":
		n := 0
		for _, s := range a.Sel {
			var ok bool
			err := retry.Do(ctx, nil, func(ctx context.Context) error {
				var err error
				ok, err = h.store.DeadDelete(ctx, h.db, a.Queue, s.ID, *s.Death)
				return store.Classify(err)
			})
			if err != nil {
				return fmt.Sprintf("deleted %d of %d dead item(s) of %q;", n, len(a.Sel), a.Queue), err
			}
			if ok {
				n++
			}
		}
		return fmt.Sprintf("deleted %d of %d dead item(s) of %q", n, len(a.Sel), a.Queue), nil
	case "pause":
		return fmt.Sprintf("paused %q", a.Queue), q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.On})
	case "schedule-pause", "schedule-resume":
		paused := a.Act == "schedule-pause"
		what := map[bool]string{true: "paused", false: "resumed"}[paused]
		return fmt.Sprintf("%s schedule %q of %q", what, a.Schedule, a.Queue), schedule.Pause(ctx, q, a.Schedule, paused)
	case "resume":
		return fmt.Sprintf("resumed %q", a.Queue), q.UpdateSettings(ctx, claim.SettingsUpdate{Paused: claim.Off})
	case "limits":
		s, err := q.Settings(ctx)
		if err != nil {
			return "", err
		}
		before := claim.Limit{MaxInFlight: s.MaxInFlight, Rate: s.Rate}
		s.MaxInFlight, s.Rate = a.Limit.MaxInFlight, a.Limit.Rate
		return fmt.Sprintf("set the limits of %q to %s (were %s)", a.Queue, limitText(a.Limit), limitText(before)), q.UpdateSettings(ctx, claim.SettingsUpdate{Policy: &s.Policy})
	case "parts":
		n, err := partition.Parts(ctx, h.db, h.opts.Tables, a.Queue)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("set the parts of %q to %d (were %d)", a.Queue, a.Parts, n), partition.SetParts(ctx, h.db, h.opts.Tables, a.Queue, a.Parts)
	}
	return "", fmt.Errorf("unknown action %q", a.Act)
}

// refusedNote says how many dead items the database refused to move back
// (they stay dead), if any.
func refusedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d refused by the database and left dead", n)
}
