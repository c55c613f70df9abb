package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
)

type userKey struct{}

func withUser(ctx context.Context, user string) context.Context {
	return context.WithValue(ctx, userKey{}, user)
}

// userOf returns the request's user, as Options.Auth named it.
func userOf(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

// cookieName is the dashboard's browser cookie: a random value that the
// CSRF tokens are tied to.
const cookieName = "crdbwork_dashboard"

// csrfField is the form field (and csrfHeader the header) of the token.
const (
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

// browserID returns the request's cookie value, setting a new cookie on w
// when it has none.
func (h *handler) browserID(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(cookieName); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	v := base64.RawURLEncoding.EncodeToString(b)
	path := h.opts.BasePath
	if path == "" {
		path = "/"
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: v, Path: path, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return v
}

// token returns the CSRF token of a browser (its cookie value) and user:
// an HMAC of both under the handler's key, so that it cannot be made
// without the key, nor used with another cookie or by another user.
func (h *handler) token(browser, user string) string {
	m := hmac.New(sha256.New, h.opts.CSRFKey)
	m.Write([]byte(browser))
	m.Write([]byte{0})
	m.Write([]byte(user))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

var (
	errCrossOrigin = errors.New("refused: a cross-origin request")
	errNoCookie    = errors.New("refused: no dashboard cookie (load a page of the dashboard first)")
	errBadToken    = errors.New("refused: a missing or wrong CSRF token (reload the page)")
)

// checkCSRF refuses a state-changing request that a browser sent from
// another origin (Sec-Fetch-Site, Origin), or that does not carry the
// token of its cookie and user.
func (h *handler) checkCSRF(r *http.Request) error {
	if err := h.cop.Check(r); err != nil {
		return errCrossOrigin
	}
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return errNoCookie
	}
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	want := h.token(c.Value, userOf(r))
	if got == "" || !hmac.Equal([]byte(got), []byte(want)) {
		return errBadToken
	}
	return nil
}
