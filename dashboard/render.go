package dashboard

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pageTemplate is one page's templates: "layout" (the whole page) and
// "live" (the part that refreshes).
type pageTemplate struct{ t *template.Template }

var pageNames = []string{"overview", "queue", "sessions", "items", "item", "tenants", "audit", "confirm", "done"}

func parsePages() (map[string]*pageTemplate, error) {
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: templates: %w", err)
	}
	out := map[string]*pageTemplate{}
	for _, n := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: templates: %w", err)
		}
		out[n] = &pageTemplate{t}
	}
	return out, nil
}

// common is what every page shows besides its own data.
type common struct {
	Title    string
	Nav      string
	Base     string
	User     string
	Token    string
	ReadOnly bool
	Refresh  int64 // milliseconds
	Now      time.Time
	Msg      string
	Path     string // the page's path and query, under Base
	Cap      int64
	Live     bool // the page refreshes its live part
}

// view is what a page's templates execute on.
type view struct {
	C    common
	Data any
}

// liveHeader marks the pages' own refresh requests: the answer is the
// live part only.
const liveHeader = "X-Crdbwork-Live"

// page wraps a page's reader: it renders the whole page, or only its live
// part when the request says so.
func (h *handler) page(name string, read func(r *http.Request) (title string, data any, err error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		browser := h.browserID(w, r)
		title, data, err := read(r)
		var to *redirectError
		if errors.As(err, &to) {
			http.Redirect(w, r, to.to, http.StatusSeeOther)
			return
		}
		if err != nil {
			code := http.StatusInternalServerError
			if e, ok := err.(*httpError); ok {
				code = e.code
			}
			http.Error(w, err.Error(), code)
			return
		}
		h.render(w, r, name, title, browser, data)
	}
}

func (h *handler) common(r *http.Request, nav, title, browser string) common {
	user := userOf(r)
	msg := r.URL.Query().Get("msg")
	if len(msg) > 500 {
		msg = msg[:500]
	}
	return common{Title: title, Nav: nav, Base: h.opts.BasePath, User: user, Token: h.token(browser, user),
		ReadOnly: h.opts.ReadOnly, Refresh: h.opts.Refresh.Milliseconds(), Now: time.Now(), Msg: msg,
		Path: h.path(r.URL.RequestURI()), Cap: int64(h.opts.CountCap)}
}

func (h *handler) render(w http.ResponseWriter, r *http.Request, name, title, browser string, data any) {
	v := view{C: h.common(r, name, title, browser), Data: data}
	v.C.Live = name != "confirm" && name != "done"
	tmpl := "layout"
	if r.Header.Get(liveHeader) != "" {
		tmpl = "live"
	}
	var b bytes.Buffer
	if err := h.pages[name].t.ExecuteTemplate(&b, tmpl, v); err != nil {
		http.Error(w, "rendering the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(b.Bytes())
}

// httpError is an error with its status code.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// redirectError sends the browser to another page of the dashboard (to: a
// path under BasePath, with its query).
type redirectError struct{ to string }

func (e *redirectError) Error() string { return "see " + e.to }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func (h *handler) static(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/static/")
	b, err := fs.ReadFile(staticFS, "static/"+name)
	if err != nil || strings.Contains(name, "/") {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasSuffix(name, ".js"):
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(name, ".css"):
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	}
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

var funcs = template.FuncMap{
	"num":    num,
	"capped": capped,
	"dur":    dur,
	"since": func(now, t time.Time) string {
		return dur(now.Sub(t))
	},
	"sincep": func(now time.Time, t *time.Time) string {
		if t == nil {
			return "—"
		}
		return dur(now.Sub(*t))
	},
	"until": func(now time.Time, t *time.Time) string {
		if t == nil {
			return "—"
		}
		if t.Before(now) {
			return "passed " + dur(now.Sub(*t)) + " ago"
		}
		return "in " + dur(t.Sub(now))
	},
	"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	// stampp is stamp of a time that may be missing, with milliseconds
	// (an attempt's start and end are often within a second).
	"stampp": func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"short": func(id uuid.UUID) string {
		if id == uuid.Nil {
			return "nobody"
		}
		return id.String()[:8]
	},
	"rate": func(r float64) string {
		if r < 0 || math.IsNaN(r) {
			return "—"
		}
		if r < 10 {
			return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
		}
		return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
	},
	"limit": func(maxIn int64, rate float64) string {
		var parts []string
		if maxIn > 0 {
			parts = append(parts, "≤"+num(maxIn)+" in flight")
		}
		if rate > 0 {
			parts = append(parts, "≤"+strconv.FormatFloat(rate, 'g', -1, 64)+"/s")
		}
		if len(parts) == 0 {
			return "none"
		}
		return strings.Join(parts, ", ")
	},
	"spark": sparkline,
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
	"fmtf":  func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) },
	"int64": func(n int) int64 { return int64(n) },
	"list":  func(xs ...string) []string { return xs },
	"dict": func(kv ...any) (map[string]any, error) {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
}

// num writes n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// capped writes a count that stopped at its cap as "≥cap".
func capped(n, capAt int64) string {
	if n >= capAt {
		return "≥" + num(capAt)
	}
	return num(n)
}

// dur writes a duration for people, to the second (or millisecond below
// one).
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// sparkline draws values as an inline SVG polyline (the newest on the
// right), scaled to the largest value.
func sparkline(values []float64) template.HTML {
	const w, hgt = 120.0, 24.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" viewBox="0 0 %g %g" width="%g" height="%g" role="img" aria-label="history">`, w, hgt, w, hgt)
	if len(values) >= 2 {
		top := 0.0
		for _, v := range values {
			top = max(top, v)
		}
		if top == 0 {
			top = 1
		}
		b.WriteString(`<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="`)
		for i, v := range values {
			x := float64(i) * w / float64(len(values)-1)
			y := hgt - 1 - (max(0, v)/top)*(hgt-2)
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers only: nothing from the database is written
}
