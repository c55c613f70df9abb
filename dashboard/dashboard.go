// Package dashboard serves a live web dashboard of crdbwork queues: every
// queue's backlog, due, claimed and dead items, oldest age, throughput over
// time, pause and limits; the live sessions and each queue's part map, with
// the rebalances as they happen; items and dead items of every queue or
// one, with their counts by state, searched (id, key and tenant by prefix,
// payload by content) and paged;
// the tenants of fair queues; and the operator's actions (requeue, cancel,
// delete dead items, pause and resume, limits and parts), each confirmed
// in the page and recorded in an audit list.
//
// New returns an http.Handler to mount in a service of one's own (see the
// example); the crdbwork command serves it with `crdbwork dashboard`.
// Everything it serves is embedded: it loads nothing from the internet.
// The pages follow the system's dark mode (prefers-color-scheme) and have
// keyboard shortcuts (? lists them; actions still go through their
// confirmation page).
// Pages refresh themselves by polling their own address for their live
// part, a few hundred bytes to a few kilobytes, every Options.Refresh.
//
// Reads. The figures are read by the fleet's one read model, the one
// `crdbwork status` and the metrics collector read too. The queue figures
// of the overview come from one sampler per handler, shared by every
// viewer, that runs only while someone watches: each round reads the first
// Options.MaxQueues queues by name (a few index seeks per queue) with one statement
// of bounded reads per queue: counts stop at
// Options.CountCap and show as "≥ cap". The other pages
// read what they show on request, each read index-backed and bounded by
// its page size or scan window, except a queue's own page and its tenants
// page, which count exactly as claim.Queue.Inspect does (their cost grows
// with that one queue's backlog; see Inspect).
//
// Safety. The dashboard answers only requests whose Host is a loopback
// name or address or one of Options.AllowedHosts (403 otherwise: a guard
// against DNS rebinding). Actions are POST requests only, refused in
// read-only mode (403),
// and each needs a CSRF token tied to the browser's dashboard cookie and
// the user, and a same-origin request by the browser's Sec-Fetch-Site and
// Origin headers (net/http's CrossOriginProtection). Options.Auth decides
// who may see the dashboard at all: without it, everyone who reaches the
// handler may, as "anonymous" — mount it behind your own authentication,
// or give the hook.
package dashboard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crdbwork/crdbwork/claim"
	"github.com/crdbwork/crdbwork/internal/fleet"
	"github.com/crdbwork/crdbwork/internal/store"
	crsql "github.com/crdbwork/crdbwork/sql"
)

// Options configure a dashboard. The zero value serves the default tables
// at the root of the handler, with actions on, to everyone.
type Options struct {
	// Tables names the crdbwork tables.
	Tables crsql.Tables
	// ReadOnly refuses every action (403) and shows no action forms.
	ReadOnly bool
	// Auth, if not nil, is asked for every request: it returns the user's
	// name (recorded in the audit list) and whether the request may be
	// served; a refused request gets 401. Nil lets every request in as
	// "anonymous".
	Auth func(*http.Request) (user string, ok bool)
	// BasePath is the path the handler is mounted at, such as
	// "/crdbwork" (no trailing slash); "" for the root. Mount the handler
	// with the prefix stripped: mux.Handle("/crdbwork/",
	// http.StripPrefix("/crdbwork", h)).
	BasePath string
	// Refresh is how often pages update themselves and the sampler reads
	// the queues' figures. Default 2 s.
	Refresh time.Duration
	// CountCap is where the overview's counts stop (shown as "≥ cap").
	// Default 10,000.
	CountCap int
	// MaxQueues is how many queues the overview reads, the first by name
	// (it says when there are more). Default 1,000.
	MaxQueues int
	// PageSize is how many rows a page lists. Default 50.
	PageSize int
	// ScanWindow is how many index entries one page of a filtered item
	// search reads at most: a page may then hold fewer matches than
	// PageSize, with a link to search on. Default 2,000.
	ScanWindow int
	// CSRFKey signs the CSRF tokens. Give the same key to every replica
	// behind one address; default: random per New, so tokens end with the
	// process (pages reload to get a new one).
	CSRFKey []byte
	// AllowedHosts are the names and addresses, besides the loopback
	// ones, that the dashboard answers to as a request's Host. A request
	// for any other Host is refused with 403 before anything is read or
	// done (and before Auth is asked): otherwise a page of another site
	// whose name was made to resolve to this machine (DNS rebinding) could
	// read the dashboard and use its actions, as its own origin in the
	// browser. Loopback names and addresses ("localhost", names under it,
	// 127.0.0.0/8, ::1) are always served, with any port (an SSH tunnel or
	// a port forward changes it). An entry is a name or an address,
	// optionally with a port to allow that port only ("ops.example.com",
	// "10.0.0.5:7433", "[fd00::5]:7433"); "*.example.com" for every name
	// under example.com; or "*" for any Host, only when something in front
	// of the handler checks the Host itself. So a dashboard mounted in a
	// service that is reached by name must list that name: by default it
	// answers loopback Hosts only.
	AllowedHosts []string
}

// Defaults of Options.
const (
	DefaultRefresh    = 2 * time.Second
	DefaultCountCap   = 10000
	DefaultPageSize   = 50
	DefaultScanWindow = 2000
	DefaultMaxQueues  = fleet.DefaultMaxQueues
)

// handler serves the dashboard.
type handler struct {
	db      claim.DB
	opts    Options
	store   *store.Store
	pages   map[string]*pageTemplate
	mux     *http.ServeMux
	cop     *http.CrossOriginProtection
	hosts   hosts // the Host headers it answers
	sampler *sampler
	fleet   *fleet.Reader

	queuesMu sync.Mutex
	queues   map[string]*claim.Queue

	// engine is the database's dialect once detected (see dialect).
	engine atomic.Pointer[store.Dialect]
}

// dialect returns the database's engine, asked once (store.DetectDialect)
// and kept after the first answer: the reads whose statement differs
// between the engines take it.
func (h *handler) dialect(ctx context.Context) (store.Dialect, error) {
	if d := h.engine.Load(); d != nil {
		return *d, nil
	}
	d, err := store.DetectDialect(ctx, h.db)
	if err != nil {
		return d, err
	}
	h.engine.Store(&d)
	return d, nil
}

// New returns the dashboard of the queues in db's tables, as an
// http.Handler. It does no I/O: the schema is checked by the first page.
func New(db claim.DB, opts Options) (http.Handler, error) {
	if db == nil {
		return nil, errors.New("dashboard: nil database")
	}
	if err := opts.Tables.Validate(); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	if opts.BasePath != "" && (!strings.HasPrefix(opts.BasePath, "/") || strings.HasSuffix(opts.BasePath, "/")) {
		return nil, fmt.Errorf("dashboard: base path %q must start with / and not end with one", opts.BasePath)
	}
	if opts.Refresh == 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.CountCap == 0 {
		opts.CountCap = DefaultCountCap
	}
	if opts.PageSize == 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.MaxQueues == 0 {
		opts.MaxQueues = DefaultMaxQueues
	}
	if opts.ScanWindow == 0 {
		opts.ScanWindow = DefaultScanWindow
	}
	switch {
	case opts.Refresh < 100*time.Millisecond:
		return nil, fmt.Errorf("dashboard: refresh %v is below 100ms", opts.Refresh)
	case opts.MaxQueues < 1:
		return nil, fmt.Errorf("dashboard: max queues %d must be positive", opts.MaxQueues)
	case opts.CountCap < 1 || opts.PageSize < 1 || opts.PageSize > 1000 || opts.ScanWindow < opts.PageSize:
		return nil, fmt.Errorf("dashboard: count cap %d, page size %d (1 to 1000) and scan window %d (at least the page size) must be positive",
			opts.CountCap, opts.PageSize, opts.ScanWindow)
	}
	if len(opts.CSRFKey) == 0 {
		opts.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(opts.CSRFKey); err != nil {
			return nil, fmt.Errorf("dashboard: making a CSRF key: %w", err)
		}
	}
	allowed, err := newHosts(opts.AllowedHosts)
	if err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	h := &handler{db: db, opts: opts, store: store.New(opts.Tables), pages: pages,
		cop: http.NewCrossOriginProtection(), hosts: allowed, queues: map[string]*claim.Queue{}}
	if h.fleet, err = fleet.New(db, opts.Tables); err != nil {
		return nil, err
	}
	h.sampler = newSampler(h)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", h.page("overview", h.overview))
	mux.HandleFunc("GET /queue", h.page("queue", h.queuePage))
	mux.HandleFunc("GET /sessions", h.page("sessions", h.sessionsPage))
	mux.HandleFunc("GET /items", h.page("items", h.itemsPage))
	mux.HandleFunc("GET /item", h.page("item", h.itemPage))
	mux.HandleFunc("GET /tenants", h.page("tenants", h.tenantsPage))
	mux.HandleFunc("GET /audit", h.page("audit", h.auditPage))
	mux.HandleFunc("GET /static/", h.static)
	mux.HandleFunc("POST /action", h.action)
	h.mux = mux
	return h, nil
}

// ServeHTTP sets the security headers, refuses a Host the dashboard does
// not serve (Options.AllowedHosts), authenticates the request and routes
// it.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	if !h.hosts.allows(r.Host) {
		refuseHost(w, r)
		return
	}
	user := "anonymous"
	if h.opts.Auth != nil {
		u, ok := h.opts.Auth(r)
		if !ok {
			http.Error(w, "not authorized", http.StatusUnauthorized)
			return
		}
		user = u
	}
	r = r.WithContext(withUser(r.Context(), user))
	h.mux.ServeHTTP(w, r)
}

// queue returns the claim.Queue of name, made once per handler.
func (h *handler) queue(name string) (*claim.Queue, error) {
	h.queuesMu.Lock()
	defer h.queuesMu.Unlock()
	if q := h.queues[name]; q != nil {
		return q, nil
	}
	q, err := claim.New(h.db, claim.Options{Queue: name, Tables: h.opts.Tables})
	if err != nil {
		return nil, err
	}
	if len(h.queues) > 10000 {
		clear(h.queues)
	}
	h.queues[name] = q
	return q, nil
}

// path returns the handler's path p (which starts with /) under BasePath.
func (h *handler) path(p string) string { return h.opts.BasePath + p }
